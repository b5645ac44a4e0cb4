//! Kernel programs compiled at run time for the GPU actually present, cached on disk and in
//! memory.
//!
//! A program is one kernel source with its `-D` defines ([`KernelBuild`]). Its disk cache key
//! hashes everything that changes the image: ABI version, target arch, compiler version,
//! options, defines, the source and every header. Entries live under
//! `$XDG_CACHE_HOME/quantshadow/<arch>/` (default `~/.cache/quantshadow/<arch>/`), written to a
//! temporary name and renamed, so a crash leaves no half-written entry; an entry the driver
//! refuses is recompiled and replaced. `QUANTSHADOW_CACHE=off` disables the disk cache.
//! `QUANTSHADOW_KERNEL_DEFINES="NAME=VALUE ..."` adds defines to every program (kernel
//! experiments such as `QS_SKETCH_TIMING=1`; part of the cache key like any define).

use super::abi::{KernelBuild, ABI_VERSION, HEADERS};
use super::{DeviceError, Function, GpuRuntime, Module};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Options every program is compiled with, on both backends: the kernels rely on IEEE behaviour
/// (no flush to zero: ue8m0 scales go down to 2^-127; precise division and square root for the
/// metrics), so no fast-math flags. Each backend adds its own (`cuda::NVRTC_OPTIONS`). The
/// kernels' tuning knobs keep their measured defaults unless defined: QS_COMPARE_F32_PARTIALS (1),
/// QS_COMPARE_UNROLL (by element size), QS_COMPARE_MIN_BLOCKS (2), QS_SKETCH_MIN_BLOCKS (2).
/// kernels/check_compile.py compiles with the same list (runtime/tests/kernels_compile.rs hands
/// it over). Compiling a GEMM program to cubin took 10-24 s with NVRTC 13.0: cached on disk.
pub const COMPILE_OPTIONS: &[&str] =
    &["-std=c++17", "-ftz=false", "-prec-div=true", "-prec-sqrt=true", "-fmad=true"];

/// A loaded program: its module and the functions of its entries.
#[derive(Debug)]
pub struct LoadedProgram {
    pub module: Module,
    functions: HashMap<String, Function>,
    /// Where the image came from, for logs and the selftest table.
    pub origin: ProgramOrigin,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgramOrigin {
    Compiled,
    DiskCache,
}

impl LoadedProgram {
    pub fn function(&self, entry: &str) -> Result<Function, DeviceError> {
        self.functions
            .get(entry)
            .copied()
            .ok_or_else(|| DeviceError::Unsupported(format!("kernel entry {entry} is not in its program")))
    }
}

/// Compiled programs of one device, by cache key.
pub struct KernelRegistry {
    arch: String,
    compiler: String,
    cache_dir: Option<PathBuf>,
    /// By build descriptor (source + defines + entries: a few short strings), so the
    /// per-call lookup never hashes kernel text; the content hash is for the disk cache only.
    programs: Mutex<HashMap<KernelBuild, Arc<LoadedProgram>>>,
}

impl KernelRegistry {
    pub fn new(runtime: &dyn GpuRuntime, arch: &str) -> Result<KernelRegistry, DeviceError> {
        Ok(KernelRegistry {
            arch: arch.to_string(),
            compiler: runtime.compiler_version()?,
            cache_dir: default_cache_dir().filter(|_| runtime.disk_cache()).map(|d| d.join(arch)),
            programs: Mutex::new(HashMap::new()),
        })
    }

    /// Overrides the disk cache location (None: memory only).
    pub fn with_cache_dir(mut self, dir: Option<PathBuf>) -> KernelRegistry {
        self.cache_dir = dir;
        self
    }

    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// The run-time compiler and the options its backend adds (`GpuRuntime::compiler_version`).
    pub fn compiler(&self) -> &str {
        &self.compiler
    }

    /// The program for `build`, compiled or loaded once per process.
    pub fn program(
        &self,
        runtime: &dyn GpuRuntime,
        build: &KernelBuild,
    ) -> Result<Arc<LoadedProgram>, DeviceError> {
        if let Some(p) = self.programs.lock().unwrap_or_else(|e| e.into_inner()).get(build) {
            return Ok(p.clone());
        }
        let key = cache_key(build, &self.arch, &self.compiler);
        // Compiling outside the lock would let two threads compile the same program; that is
        // only wasted work, while holding the lock across a compile would stall every other
        // check of this device for seconds. Take the wasted work.
        let program = Arc::new(self.load_or_compile(runtime, build, key)?);
        let mut programs = self.programs.lock().unwrap_or_else(|e| e.into_inner());
        Ok(programs.entry(build.clone()).or_insert(program).clone())
    }

    fn load_or_compile(
        &self,
        runtime: &dyn GpuRuntime,
        build: &KernelBuild,
        key: u64,
    ) -> Result<LoadedProgram, DeviceError> {
        let path = self.cache_path(key);
        if let Some(path) = &path {
            if let Ok(image) = std::fs::read(path) {
                match load(runtime, build, &image, ProgramOrigin::DiskCache) {
                    Ok(p) => return Ok(p),
                    Err(e) => crate::engine::log::shared_warn(&format!(
                        "cached kernel image {} refused ({e}); recompiling",
                        path.display()
                    )),
                }
            }
        }
        let image = self.compile_to_cache(runtime, build, key)?;
        load(runtime, build, &image, ProgramOrigin::Compiled)
    }

    fn cache_path(&self, key: u64) -> Option<PathBuf> {
        self.cache_dir.as_ref().map(|d| d.join(format!("{key:016x}.bin")))
    }

    fn compile_to_cache(
        &self,
        runtime: &dyn GpuRuntime,
        build: &KernelBuild,
        key: u64,
    ) -> Result<Vec<u8>, DeviceError> {
        let options: Vec<String> = COMPILE_OPTIONS
            .iter()
            .map(|o| o.to_string())
            .chain(build.defines.iter().map(|(k, v)| format!("-D{k}={v}")))
            .chain(experiment_defines().iter().map(|(k, v)| format!("-D{k}={v}")))
            .collect();
        let image =
            runtime.compile(build.source.text(), build.source.file_name(), &self.arch, &options, &HEADERS)?;
        if let Some(path) = self.cache_path(key) {
            if let Err(e) = store(&path, &image) {
                tracing::debug!(path = %path.display(), error = %e, "kernel cache not written");
            }
        }
        Ok(image)
    }

    /// The program if it is already loaded (no compile, no driver call).
    pub fn loaded(&self, build: &KernelBuild) -> Option<Arc<LoadedProgram>> {
        self.programs.lock().unwrap_or_else(|e| e.into_inner()).get(build).cloned()
    }

    /// The device image of `build`: from the disk cache, else compiled (and cached). Needs no
    /// context (run-time compilers only), so it can run on a background thread while the
    /// process captures graphs.
    pub fn image(&self, runtime: &dyn GpuRuntime, build: &KernelBuild) -> Result<Vec<u8>, DeviceError> {
        let key = cache_key(build, &self.arch, &self.compiler);
        if let Some(path) = self.cache_path(key) {
            if let Ok(image) = std::fs::read(&path) {
                return Ok(image);
            }
        }
        self.compile_to_cache(runtime, build, key)
    }

    /// Loads a compiled image into the current context and registers it.
    pub fn install(
        &self,
        runtime: &dyn GpuRuntime,
        build: &KernelBuild,
        image: &[u8],
    ) -> Result<Arc<LoadedProgram>, DeviceError> {
        if let Some(p) = self.loaded(build) {
            return Ok(p);
        }
        let program = Arc::new(load(runtime, build, image, ProgramOrigin::Compiled)?);
        let mut programs = self.programs.lock().unwrap_or_else(|e| e.into_inner());
        Ok(programs.entry(build.clone()).or_insert(program).clone())
    }
}

fn load(
    runtime: &dyn GpuRuntime,
    build: &KernelBuild,
    image: &[u8],
    origin: ProgramOrigin,
) -> Result<LoadedProgram, DeviceError> {
    let module = runtime.load_module(image)?;
    let mut functions = HashMap::new();
    for entry in &build.entries {
        functions.insert(entry.name.clone(), runtime.get_function(module, &entry.name)?);
    }
    Ok(LoadedProgram { module, functions, origin })
}

/// Atomic write: temporary file in the same directory, then rename.
fn store(path: &Path, image: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().ok_or_else(|| std::io::Error::other("cache path has no directory"))?;
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("k"),
        std::process::id()
    ));
    std::fs::write(&tmp, image)?;
    std::fs::rename(&tmp, path)
}

/// Extra defines from `QUANTSHADOW_KERNEL_DEFINES`, read once. Malformed entries are dropped
/// with one warning: a define must be an identifier, its value identifier characters or '.'.
fn experiment_defines() -> &'static [(String, String)] {
    static DEFINES: std::sync::OnceLock<Vec<(String, String)>> = std::sync::OnceLock::new();
    DEFINES.get_or_init(|| {
        parse_experiment_defines(&std::env::var("QUANTSHADOW_KERNEL_DEFINES").unwrap_or_default())
    })
}

fn parse_experiment_defines(text: &str) -> Vec<(String, String)> {
    let ident = |s: &str| {
        !s.is_empty()
            && !s.starts_with(|c: char| c.is_ascii_digit())
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    let mut out = Vec::new();
    for item in text.split_whitespace() {
        let (name, value) = item.split_once('=').unwrap_or((item, "1"));
        if ident(name)
            && !value.is_empty()
            && value.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
        {
            out.push((name.to_string(), value.to_string()));
        } else {
            crate::engine::log::shared_warn(&format!(
                "QUANTSHADOW_KERNEL_DEFINES entry {item:?} ignored (NAME or NAME=VALUE expected)"
            ));
        }
    }
    out
}

fn default_cache_dir() -> Option<PathBuf> {
    if std::env::var("QUANTSHADOW_CACHE").is_ok_and(|v| v == "off") {
        return None;
    }
    let base =
        std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()).map(PathBuf::from).or_else(|| {
            std::env::var_os("HOME").filter(|v| !v.is_empty()).map(|h| PathBuf::from(h).join(".cache"))
        })?;
    Some(base.join("quantshadow"))
}

/// FNV-1a over everything that changes a compiled image.
pub fn cache_key(build: &KernelBuild, arch: &str, compiler: &str) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let mut eat = |bytes: &[u8]| {
        for b in bytes.iter().chain(&[0xff]) {
            h = (h ^ *b as u64).wrapping_mul(0x0100_0000_01b3);
        }
    };
    eat(&ABI_VERSION.to_le_bytes());
    eat(arch.as_bytes());
    eat(compiler.as_bytes());
    for o in COMPILE_OPTIONS {
        eat(o.as_bytes());
    }
    for (k, v) in build.defines.iter().chain(experiment_defines()) {
        eat(k.as_bytes());
        eat(v.as_bytes());
    }
    eat(build.source.file_name().as_bytes());
    eat(build.source.text().as_bytes());
    for (name, text) in HEADERS {
        eat(name.as_bytes());
        eat(text.as_bytes());
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::Format;

    #[test]
    fn cache_key_separates_what_changes_the_image() {
        let a = KernelBuild::gemm_ref(Format::E4m3fn, Format::E4m3fn).unwrap();
        let b = KernelBuild::gemm_ref(Format::E4m3fnuz, Format::E4m3fn).unwrap();
        let k = |build: &KernelBuild, arch: &str, c: &str| cache_key(build, arch, c);
        assert_eq!(k(&a, "sm_90", "nvrtc 13.0"), k(&a, "sm_90", "nvrtc 13.0"));
        assert_ne!(k(&a, "sm_90", "nvrtc 13.0"), k(&b, "sm_90", "nvrtc 13.0"));
        assert_ne!(k(&a, "sm_90", "nvrtc 13.0"), k(&a, "sm_100", "nvrtc 13.0"));
        assert_ne!(k(&a, "sm_90", "nvrtc 13.0"), k(&a, "sm_90", "nvrtc 13.1"));
    }

    #[test]
    fn experiment_defines_accept_identifiers_only() {
        let got = parse_experiment_defines("QS_SKETCH_TIMING=1 QS_FLAG bad-name=1 X=a;b 9X=1 Y=2.5");
        let want = [("QS_SKETCH_TIMING", "1"), ("QS_FLAG", "1"), ("Y", "2.5")];
        assert_eq!(got, want.map(|(k, v)| (k.to_string(), v.to_string())));
    }

    #[test]
    fn store_is_atomic_and_readable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x/0123.bin");
        store(&path, b"image").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"image");
        assert_eq!(std::fs::read_dir(path.parent().unwrap()).unwrap().count(), 1, "no temporary left");
    }
}
