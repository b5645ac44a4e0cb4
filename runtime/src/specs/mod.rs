//! Kernel spec files: how to read a GEMM out of a custom kernel launch (Triton, CUTLASS-style,
//! ASM kernels), so launches that never reach a vendor BLAS can be checked too.
//!
//! The interface between the launch interposers (`intercept::launch`) and the spec engine:
//! - the interposer resolves a kernel's name once per function handle and asks
//!   [`SpecSet::find`]; kernels without a spec cost that lookup and nothing else;
//! - for a matched launch it builds a [`LaunchView`] whose argument bytes it can justify (each
//!   indexed parameter with its driver-reported size, or the packed argument buffer with its
//!   size) and calls [`SpecSet::decode`];
//! - a spec that does not fit its launch returns [`SpecError::Mismatch`]: the interposer calls
//!   [`SpecSet::disable`] (one log line, counted skip) and never uses that spec again.
//!
//! The format is documented in `docs/kernel-specs.md`; [`format`] holds its serde types,
//! [`engine`] the load-time checks and the decoder, [`suggest`] the skeletons that
//! `quantshadow kernels --suggest` prints.

pub mod engine;
pub mod format;
pub mod glob;
pub mod suggest;
#[cfg(test)]
mod tests;

use crate::problem::{GemmBuffers, GemmProblem};
use engine::CompiledSpec;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// One kernel launch as the spec engine sees it.
#[derive(Debug, Clone, Copy)]
pub struct LaunchView<'a> {
    /// The kernel's (mangled) name as the driver reports it.
    pub name: &'a str,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub args: LaunchArgs<'a>,
}

/// The launch's arguments, only as far as their extent is known.
#[derive(Debug, Clone, Copy)]
pub enum LaunchArgs<'a> {
    /// `kernelParams`: parameter i's bytes, each slice exactly the size the driver reports for
    /// that parameter (`cuFuncGetParamInfo`). Launches whose parameter sizes are unknown are
    /// never decoded.
    Indexed(&'a [&'a [u8]]),
    /// A packed argument buffer (`CU_LAUNCH_PARAM_BUFFER_POINTER` /
    /// `HIP_LAUNCH_PARAM_BUFFER_POINTER` with its `..._BUFFER_SIZE`).
    Packed(&'a [u8]),
}

/// Index of a spec inside its [`SpecSet`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpecId(pub u32);

/// A launch read through its spec: the GEMM to check and its device addresses.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodedLaunch {
    pub problem: GemmProblem,
    pub buffers: GemmBuffers,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpecError {
    /// The spec does not fit this kernel's launches (parameter count or sizes disagree, an
    /// offset outside the packed buffer): disable the spec.
    Mismatch(String),
    /// This one launch cannot be checked (a shape the problem model rejects, a null operand):
    /// a counted skip, the spec stays enabled.
    Skip(String),
}

impl std::fmt::Display for SpecError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SpecError::Mismatch(m) => write!(f, "spec mismatch: {m}"),
            SpecError::Skip(m) => write!(f, "skip: {m}"),
        }
    }
}

#[derive(Debug)]
struct Entry {
    spec: CompiledSpec,
    disabled: AtomicBool,
}

/// Every loaded spec, matched by kernel name.
#[derive(Debug, Default)]
pub struct SpecSet {
    entries: Vec<Entry>,
}

impl SpecSet {
    /// Specs from `QUANTSHADOW_SPECS` (files or directories, `:`-separated); problems with
    /// single files are returned as warnings and those files are left out.
    pub fn from_env() -> (SpecSet, Vec<String>) {
        match std::env::var_os("QUANTSHADOW_SPECS") {
            Some(v) => SpecSet::load(&std::env::split_paths(&v).collect::<Vec<_>>()),
            None => (SpecSet::default(), Vec::new()),
        }
    }

    /// Loads spec files; a directory contributes its `*.toml` files (not its subdirectories),
    /// in name order. A file with any error is left out as a whole, with one warning naming
    /// the file and the problem. Earlier specs win when several patterns match a name.
    pub fn load(paths: &[PathBuf]) -> (SpecSet, Vec<String>) {
        let mut set = SpecSet::default();
        let mut warnings = Vec::new();
        for path in paths {
            if path.as_os_str().is_empty() {
                continue;
            }
            if path.is_dir() {
                let mut files: Vec<PathBuf> = match std::fs::read_dir(path) {
                    Ok(rd) => rd
                        .filter_map(|e| e.ok().map(|e| e.path()))
                        .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "toml"))
                        .collect(),
                    Err(e) => {
                        warnings.push(format!("kernel specs: {}: {e}", path.display()));
                        continue;
                    }
                };
                files.sort();
                if files.is_empty() {
                    warnings.push(format!("kernel specs: {}: no *.toml files", path.display()));
                }
                for f in files {
                    set.load_file(&f, &mut warnings);
                }
            } else {
                set.load_file(path, &mut warnings);
            }
        }
        (set, warnings)
    }

    fn load_file(&mut self, path: &Path, warnings: &mut Vec<String>) {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) => {
                warnings.push(format!("kernel specs: {}: {e}", path.display()));
                return;
            }
        };
        if let Err(e) = self.add_str(&text, &path.display().to_string()) {
            warnings.push(format!("kernel specs: {e} (file left out)"));
        }
    }

    /// Adds the specs of one file's text; `origin` names it in messages. All or nothing.
    pub fn add_str(&mut self, text: &str, origin: &str) -> Result<usize, String> {
        let file: format::SpecFile = toml::from_str(text).map_err(|e| format!("{origin}: {e}"))?;
        if file.kernel.is_empty() {
            return Err(format!("{origin}: no [[kernel]] entries"));
        }
        let mut compiled = Vec::with_capacity(file.kernel.len());
        for def in file.kernel {
            compiled.push(CompiledSpec::compile(def, origin).map_err(|e| format!("{origin}: {e}"))?);
        }
        let n = compiled.len();
        self.entries
            .extend(compiled.into_iter().map(|spec| Entry { spec, disabled: AtomicBool::new(false) }));
        Ok(n)
    }

    /// Parses one file's text into a new set (tests, the CLI).
    pub fn parse_str(text: &str, origin: &str) -> Result<SpecSet, String> {
        let mut set = SpecSet::default();
        set.add_str(text, origin)?;
        Ok(set)
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The first enabled spec whose name pattern matches `kernel_name`. A linear scan of
    /// allocation-free glob matches: meant to run once per function handle (callers cache).
    pub fn find(&self, kernel_name: &str) -> Option<SpecId> {
        self.entries
            .iter()
            .position(|e| !e.disabled.load(Ordering::Relaxed) && e.spec.glob.matches(kernel_name))
            .map(|i| SpecId(i as u32))
    }

    /// "file [pattern]" of a spec, for logs and the kernel listing.
    pub fn label(&self, id: SpecId) -> Option<String> {
        self.entries.get(id.0 as usize).map(|e| format!("{} [{}]", e.spec.origin, e.spec.def.name))
    }

    pub fn is_disabled(&self, id: SpecId) -> bool {
        self.entries.get(id.0 as usize).is_none_or(|e| e.disabled.load(Ordering::Relaxed))
    }

    /// The weight operand's address of a launch read through spec `id` (None where it cannot
    /// be read). Reads only bytes inside the launch's slices.
    pub fn weight_ptr(&self, id: SpecId, args: &LaunchArgs) -> Option<u64> {
        self.entries.get(id.0 as usize)?.spec.weight_ptr(args)
    }

    /// The parameter index spec `id` reads the weight's address from, when it is one.
    pub fn weight_param(&self, id: SpecId) -> Option<u32> {
        self.entries.get(id.0 as usize)?.spec.weight_param()
    }

    /// Reads a launch through spec `id`. Reads only bytes inside the launch's slices; a
    /// disabled or unknown spec is a skip.
    pub fn decode(&self, id: SpecId, launch: &LaunchView) -> Result<DecodedLaunch, SpecError> {
        let Some(e) = self.entries.get(id.0 as usize) else {
            return Err(SpecError::Skip(format!("no spec {}", id.0)));
        };
        if e.disabled.load(Ordering::Relaxed) {
            return Err(SpecError::Skip(format!("spec {} [{}] is disabled", e.spec.origin, e.spec.def.name)));
        }
        e.spec.decode(launch)
    }

    /// Disables a spec after a mismatch; returns the log line to print once. Thread-safe and
    /// idempotent: only the call that actually disabled it gets a line without
    /// "(already disabled)", so racing callers can print only the first.
    pub fn disable(&self, id: SpecId, reason: &str) -> String {
        let Some(e) = self.entries.get(id.0 as usize) else {
            return format!("quantshadow: no kernel spec {}: {reason}", id.0);
        };
        let was = e.disabled.swap(true, Ordering::AcqRel);
        format!(
            "quantshadow: kernel spec {} [{}] disabled{}: {reason}",
            e.spec.origin,
            e.spec.def.name,
            if was { " (already disabled)" } else { "" }
        )
    }
}

/// One kernel seen in a run (observe mode), for `quantshadow kernels`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelStat {
    pub name: String,
    /// The interposed launch function (`cuLaunchKernel`, `hipModuleLaunchKernel`, ...).
    pub entry: String,
    pub calls: u64,
    /// Grid and block of the first launch; `shapes` counts distinct (grid, block) pairs.
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shapes: u32,
    /// Parameter sizes in bytes when the driver reports them.
    pub param_sizes: Option<Vec<usize>>,
    /// Bytes of the packed argument buffer when the launch used one.
    pub packed_bytes: Option<usize>,
    /// The spec that matched, if any.
    pub spec: Option<String>,
}

/// What the shim writes to `QUANTSHADOW_KERNELS_OUT` at exit.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct KernelListing {
    pub kernels: Vec<KernelStat>,
}

impl KernelListing {
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|_| "{\"kernels\":[]}".into())
    }

    pub fn from_json(text: &str) -> Result<KernelListing, String> {
        serde_json::from_str(text).map_err(|e| {
            if e.is_eof() {
                format!("truncated kernel listing ({e})")
            } else {
                format!("malformed kernel listing: {e}")
            }
        })
    }
}
