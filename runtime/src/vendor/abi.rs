//! The ABI check: the Rust tables against real vendor headers.
//!
//! `tests/abi/cuda_abi_check.c` and `tests/abi/hip_abi_check.c` are generated from the tables
//! by [`c_check_source`] (a test keeps the committed files in step). Compiled against a vendor's
//! headers, each prints a dump: one `name value` line per table entry that exists in that
//! header version (the `#if` guards come from the entries' [`VersionRange`](super::VersionRange)s), preceded by the
//! header version macros. [`compare`] checks a dump against the tables and reports every
//! missing, extra and differing name at once; [`render_expected`] prints the Rust side in the
//! same format, so a dump and the Rust side can be diffed as text.
//!
//! A name the header does not have at all fails the C compile, which is a finding too.

use super::{side_tables, AbiConst, LibVersion, Library, Side};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Write as _};

/// The header-version macros a dump starts with, per library.
pub fn version_keys(library: Library) -> &'static [&'static str] {
    match library {
        Library::CudaToolkit => &["CUDA_VERSION"],
        Library::Cublas => &["CUBLAS_VER_MAJOR", "CUBLAS_VER_MINOR", "CUBLAS_VER_PATCH"],
        // HIP_VERSION_PATCH is a build number (e.g. 43483): ranges use major.minor only.
        Library::Hip => &["HIP_VERSION_MAJOR", "HIP_VERSION_MINOR"],
        Library::HipBlasLt => {
            &["HIPBLASLT_VERSION_MAJOR", "HIPBLASLT_VERSION_MINOR", "HIPBLASLT_VERSION_PATCH"]
        }
        Library::HipBlas => &["hipblasVersionMajor", "hipblasVersionMinor", "hipblasVersionPatch"],
        Library::RocBlas => &["ROCBLAS_VERSION_MAJOR", "ROCBLAS_VERSION_MINOR", "ROCBLAS_VERSION_PATCH"],
    }
}

/// The C preprocessor expression of a library's header version, as `QS_VER(major, minor,
/// patch)` (`QS_VER(a, b, c) = a * 1000000 + b * 1000 + c`).
fn c_version_expr(library: Library) -> &'static str {
    match library {
        Library::CudaToolkit => "QS_VER(CUDA_VERSION / 1000, CUDA_VERSION % 1000 / 10, 0)",
        Library::Cublas => "QS_VER(CUBLAS_VER_MAJOR, CUBLAS_VER_MINOR, CUBLAS_VER_PATCH)",
        Library::Hip => "QS_VER(HIP_VERSION_MAJOR, HIP_VERSION_MINOR, 0)",
        Library::HipBlasLt => {
            "QS_VER(HIPBLASLT_VERSION_MAJOR, HIPBLASLT_VERSION_MINOR, HIPBLASLT_VERSION_PATCH)"
        }
        Library::HipBlas => "QS_VER(hipblasVersionMajor, hipblasVersionMinor, hipblasVersionPatch)",
        Library::RocBlas => "QS_VER(ROCBLAS_VERSION_MAJOR, ROCBLAS_VERSION_MINOR, ROCBLAS_VERSION_PATCH)",
    }
}

fn c_version_macro(library: Library) -> &'static str {
    match library {
        Library::CudaToolkit => "QS_V_CUDA",
        Library::Cublas => "QS_V_CUBLAS",
        Library::Hip => "QS_V_HIP",
        Library::HipBlasLt => "QS_V_HIPBLASLT",
        Library::HipBlas => "QS_V_HIPBLAS",
        Library::RocBlas => "QS_V_ROCBLAS",
    }
}

fn libraries(side: Side) -> Vec<Library> {
    Library::ALL.into_iter().filter(|l| l.side() == side).collect()
}

/// The header version of every library of one side, as read from a dump or given.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HeaderVersions {
    versions: BTreeMap<Library, LibVersion>,
}

impl HeaderVersions {
    pub fn new() -> HeaderVersions {
        HeaderVersions::default()
    }

    pub fn with(mut self, library: Library, version: LibVersion) -> HeaderVersions {
        self.versions.insert(library, version);
        self
    }

    pub fn get(&self, library: Library) -> Option<LibVersion> {
        self.versions.get(&library).copied()
    }

    /// The version-key lines of `library`, in dump order.
    fn key_lines(&self, library: Library) -> Option<Vec<(&'static str, i64)>> {
        let v = self.get(library)?;
        let keys = version_keys(library);
        Some(match library {
            Library::CudaToolkit => vec![(keys[0], (v.major * 1000 + v.minor * 10) as i64)],
            Library::Hip => vec![(keys[0], v.major as i64), (keys[1], v.minor as i64)],
            _ => vec![(keys[0], v.major as i64), (keys[1], v.minor as i64), (keys[2], v.patch as i64)],
        })
    }

    fn from_dump(side: Side, entries: &BTreeMap<String, i64>) -> Result<HeaderVersions, DumpError> {
        let mut out = HeaderVersions::new();
        for library in libraries(side) {
            let keys = version_keys(library);
            let mut values = Vec::with_capacity(keys.len());
            for key in keys {
                let value = *entries.get(*key).ok_or(DumpError::MissingVersionKey { library, key })?;
                let value =
                    u32::try_from(value).map_err(|_| DumpError::BadVersion { library, key, value })?;
                values.push(value);
            }
            let version = match library {
                Library::CudaToolkit => LibVersion::from_cuda_raw(values[0] as i32)
                    .ok_or(DumpError::BadVersion { library, key: keys[0], value: values[0] as i64 })?,
                Library::Hip => LibVersion::new(values[0], values[1], 0),
                _ => LibVersion::new(values[0], values[1], values[2]),
            };
            out.versions.insert(library, version);
        }
        Ok(out)
    }
}

impl fmt::Display for HeaderVersions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.versions.iter().map(|(l, v)| format!("{} {}", l.name(), v)).collect();
        f.write_str(&parts.join(", "))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DumpError {
    #[error("line {line}: expected `name value`, got {text:?}")]
    Malformed { line: usize, text: String },
    #[error("line {line}: {name} printed twice")]
    Duplicate { line: usize, name: String },
    #[error("the dump names no side (expected a first line `# quantshadow ABI dump: side=cuda|hip`)")]
    NoSide,
    #[error("{} version key {key} missing from the dump", library.name())]
    MissingVersionKey { library: Library, key: &'static str },
    #[error("{} version key {key} has an impossible value {value}", library.name())]
    BadVersion { library: Library, key: &'static str, value: i64 },
}

/// A parsed dump: its side, header versions and constants (version keys excluded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AbiDump {
    pub side: Side,
    pub versions: HeaderVersions,
    pub constants: BTreeMap<String, i64>,
}

const SIDE_PREFIX: &str = "# quantshadow ABI dump: side=";

/// Parses a dump: `#` lines are comments except the side line; blank lines are ignored.
pub fn parse_dump(text: &str) -> Result<AbiDump, DumpError> {
    let mut side = None;
    let mut entries = BTreeMap::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if let Some(rest) = line.strip_prefix(SIDE_PREFIX) {
            side = match rest.trim() {
                "cuda" => Some(Side::Cuda),
                "hip" => Some(Side::Hip),
                _ => return Err(DumpError::Malformed { line: i + 1, text: raw.to_string() }),
            };
            continue;
        }
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut parts = line.split_whitespace();
        let (Some(name), Some(value), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(DumpError::Malformed { line: i + 1, text: raw.to_string() });
        };
        let value: i64 =
            value.parse().map_err(|_| DumpError::Malformed { line: i + 1, text: raw.to_string() })?;
        if entries.insert(name.to_string(), value).is_some() {
            return Err(DumpError::Duplicate { line: i + 1, name: name.to_string() });
        }
    }
    let side = side.ok_or(DumpError::NoSide)?;
    let versions = HeaderVersions::from_dump(side, &entries)?;
    for library in libraries(side) {
        for key in version_keys(library) {
            entries.remove(*key);
        }
    }
    Ok(AbiDump { side, versions, constants: entries })
}

/// The table entries of `side` that exist in the given header versions, in dump order.
/// Libraries without a version contribute nothing.
pub fn expected_entries(side: Side, versions: &HeaderVersions) -> Vec<&'static AbiConst> {
    side_tables(side)
        .into_iter()
        .flat_map(|(_, entries)| entries)
        .filter(|c| versions.get(c.library).is_some_and(|v| c.range.contains(v)))
        .collect()
}

/// The Rust side in the dump format: what the generated C program prints when the tables are
/// right.
pub fn render_expected(side: Side, versions: &HeaderVersions) -> String {
    let mut out = format!("{SIDE_PREFIX}{}\n", side.name());
    for library in libraries(side) {
        for (key, value) in versions.key_lines(library).unwrap_or_default() {
            let _ = writeln!(out, "{key} {value}");
        }
    }
    for c in expected_entries(side, versions) {
        let _ = writeln!(out, "{} {}", c.name, c.value);
    }
    out
}

/// Differences between a dump and the tables.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AbiDiff {
    /// In the tables for these header versions, not printed by the header check.
    pub missing: Vec<(String, i64)>,
    /// Printed by the header check, not in the tables for these versions.
    pub extra: Vec<(String, i64)>,
    /// (name, tables, header).
    pub differing: Vec<(String, i64, i64)>,
}

impl AbiDiff {
    pub fn is_clean(&self) -> bool {
        self.missing.is_empty() && self.extra.is_empty() && self.differing.is_empty()
    }
}

impl fmt::Display for AbiDiff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_clean() {
            return f.write_str("ABI dump matches the tables");
        }
        for (name, want, got) in &self.differing {
            writeln!(f, "differs: {name}: tables {want}, header {got}")?;
        }
        for (name, want) in &self.missing {
            writeln!(f, "missing from the dump: {name} (tables {want})")?;
        }
        for (name, got) in &self.extra {
            writeln!(f, "not in the tables: {name} (header {got})")?;
        }
        Ok(())
    }
}

/// Compares a parsed dump with the tables for the dump's own header versions.
pub fn compare(dump: &AbiDump) -> AbiDiff {
    let expected: BTreeMap<&str, i64> =
        expected_entries(dump.side, &dump.versions).into_iter().map(|c| (c.name, c.value)).collect();
    let mut diff = AbiDiff::default();
    for (name, want) in &expected {
        match dump.constants.get(*name) {
            None => diff.missing.push((name.to_string(), *want)),
            Some(got) if got != want => diff.differing.push((name.to_string(), *want, *got)),
            Some(_) => {}
        }
    }
    let expected_names: BTreeSet<&str> = expected.keys().copied().collect();
    for (name, got) in &dump.constants {
        if !expected_names.contains(name.as_str()) {
            diff.extra.push((name.clone(), *got));
        }
    }
    diff
}

/// Source of the generated header check for `side` (C for CUDA; C that also compiles as C++
/// for HIP, whose `hipblaslt.h` is C++-only).
pub fn c_check_source(side: Side) -> String {
    let mut s = String::new();
    let program = match side {
        Side::Cuda => "cuda_abi_check.c",
        Side::Hip => "hip_abi_check.c",
    };
    let _ = writeln!(
        s,
        "/* {program}: GENERATED from the quantshadow vendor tables (runtime/src/vendor/, see\n \
         * abi.rs c_check_source). Do not edit: run\n \
         *   QUANTSHADOW_REGEN_ABI=1 cargo test -p quantshadow-runtime --test vendor_abi\n \
         * Prints `name value` for every vendor constant the tables hard-code that exists in the\n \
         * headers it is compiled against; tests/abi/run_on_gpu.sh compiles and runs it. */"
    );
    s.push_str("#include <stdio.h>\n");
    match side {
        Side::Cuda => {
            s.push_str("#include <cuda.h>\n#include <library_types.h>\n#include <cublasLt.h>\n");
        }
        Side::Hip => {
            s.push_str(
                "#if !defined(__cplusplus)\n#error \"hipblaslt.h is C++: compile with hipcc or g++ -x c++\"\n#endif\n\
                 #include <hip/hip_version.h>\n#include <hip/library_types.h>\n#include <hipblas/hipblas-version.h>\n\
                 #include <hipblas/hipblas.h>\n\
                 #include <hipblaslt/hipblaslt-version.h>\n#include <hipblaslt/hipblaslt.h>\n\
                 #include <rocblas/internal/rocblas-version.h>\n#include <rocblas/rocblas.h>\n",
            );
        }
    }
    s.push_str("\n#define QS_VER(a, b, c) ((a) * 1000000LL + (b) * 1000LL + (c))\n");
    for library in libraries(side) {
        let _ = writeln!(s, "#define {} {}", c_version_macro(library), c_version_expr(library));
    }
    s.push_str("#define P(name, value) printf(\"%s %lld\\n\", name, (long long)(value))\n\n");
    s.push_str("int main(void)\n{\n");
    let _ = writeln!(s, "    printf(\"{SIDE_PREFIX}{}\\n\");", side.name());
    for library in libraries(side) {
        for key in version_keys(library) {
            let _ = writeln!(s, "    P(\"{key}\", {key});");
        }
    }
    for (table, entries) in side_tables(side) {
        let Some(first) = entries.first() else { continue };
        let _ = writeln!(s, "\n    /* {table}: {} ({}) */", first.enum_name, first.header);
        for c in entries {
            let guard = c_guard(c);
            if let Some(g) = &guard {
                let _ = writeln!(s, "#if {g}");
            }
            let _ = writeln!(s, "    P(\"{}\", {});", c.name, c.name);
            if guard.is_some() {
                s.push_str("#endif\n");
            }
        }
    }
    s.push_str("    return 0;\n}\n");
    s
}

fn c_guard(c: &AbiConst) -> Option<String> {
    let v = c_version_macro(c.library);
    let since = c.range.since.map(|s| format!("{v} >= QS_VER({}, {}, {})", s.major, s.minor, s.patch));
    let until = c.range.until.map(|u| format!("{v} < QS_VER({}, {}, {})", u.major, u.minor, u.patch));
    match (since, until) {
        (None, None) => None,
        (Some(a), None) | (None, Some(a)) => Some(a),
        (Some(a), Some(b)) => Some(format!("{a} && {b}")),
    }
}
