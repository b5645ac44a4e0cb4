//! Configuration from the environment. An invalid value never aborts the host: it gives one
//! clear log line and the safe default.

use crate::device::gpu::KernelChoices;
use crate::inject::InjectPlan;
use crate::policy::Policy;
use crate::record::CheckMode;
use crate::thresholds::Thresholds;
use crate::transport::Address;
use std::sync::Arc;

/// `QUANTSHADOW_MODE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Interposers pass everything through; nothing starts.
    Off,
    /// Calls are decoded and recorded, nothing is checked.
    Observe,
    Check(CheckMode),
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Off => "off",
            Mode::Observe => "observe",
            Mode::Check(m) => m.name(),
        }
    }

    pub fn parse(s: &str) -> Option<Mode> {
        match s.trim().to_ascii_lowercase().as_str() {
            "off" => Some(Mode::Off),
            "observe" => Some(Mode::Observe),
            "sketch" => Some(Mode::Check(CheckMode::Sketch)),
            "rows" => Some(Mode::Check(CheckMode::Rows)),
            "full" => Some(Mode::Check(CheckMode::Full)),
            _ => None,
        }
    }
}

/// `QUANTSHADOW_SAMPLE`: which calls of a site are checked. Calls are counted per site from 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sampling {
    /// The first `first` calls of every site are checked...
    pub first: u64,
    /// ...then every `every`-th call after them (0: none).
    pub every: u64,
}

impl Sampling {
    pub const ALL: Sampling = Sampling { first: 0, every: 1 };

    /// `all`, `1/N`, `first:K` or `first:K,1/N` (also `first:K then 1/N`).
    pub fn parse(s: &str) -> Option<Sampling> {
        let s = s.trim().to_ascii_lowercase();
        if s == "all" {
            return Some(Sampling::ALL);
        }
        let one_in = |t: &str| -> Option<u64> {
            let n: u64 = t.trim().strip_prefix("1/")?.trim().parse().ok()?;
            (n >= 1).then_some(n)
        };
        if let Some(rest) = s.strip_prefix("first:") {
            let (k, tail) = match rest.find([',', ' ']) {
                Some(i) => (&rest[..i], Some(rest[i + 1..].trim().trim_start_matches("then").trim())),
                None => (rest, None),
            };
            let first: u64 = k.trim().parse().ok()?;
            let every = match tail {
                None => 0,
                Some(t) => one_in(t)?,
            };
            return Some(Sampling { first, every });
        }
        one_in(&s).map(|every| Sampling { first: 0, every })
    }

    /// Whether call number `n` (0-based, per site) is checked.
    pub fn takes(&self, n: u64) -> bool {
        if n < self.first {
            return true;
        }
        self.every != 0 && (n - self.first).is_multiple_of(self.every)
    }

    pub fn describe(&self) -> String {
        match (self.first, self.every) {
            (0, 1) => "all".into(),
            (0, n) => format!("1/{n}"),
            (k, 0) => format!("first:{k}"),
            (k, n) => format!("first:{k},1/{n}"),
        }
    }
}

/// `QUANTSHADOW_DEVICE`: which backend runs the checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceChoice {
    /// CUDA if a CUDA context is current, else HIP, else the host (never the host when a GPU
    /// runtime is present: host code cannot read device pointers).
    Auto,
    Cuda,
    Hip,
    Host,
}

/// `QUANTSHADOW_DIAGNOSE`: when a site gets a diagnosis pass (issue 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiagnoseMode {
    Off,
    /// A site whose check fails is diagnosed once (the failing call itself where the backend
    /// judges its own checks, else its next call).
    OnFail,
    /// Every site is diagnosed once, at its first checked call (offline validation: the
    /// report then shows a scale-layout analysis and the best reading for every site).
    EverySite,
}

impl DiagnoseMode {
    pub fn name(self) -> &'static str {
        match self {
            DiagnoseMode::Off => "off",
            DiagnoseMode::OnFail => "on-fail",
            DiagnoseMode::EverySite => "every-site",
        }
    }
}

/// Log verbosity (`QUANTSHADOW_LOG`: error | warn | info | debug; default warn).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
}

/// `QUANTSHADOW_SIDE_STREAM`: whether eager checks may run off the caller's stream (detached
/// sketch checks, rows/full references on the side stream).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SideStreamUse {
    /// Only when the sampling rule is dense (see [`SideStreamUse::enabled_for`]).
    Auto,
    On,
    Off,
}

/// `auto` uses the side stream for sketch checks only when at least one call in this many is
/// checked (rows/full references, far longer, always use it). Why: once a
/// process has run work on an extra stream, the CUDA driver spaces the kernels of every later
/// graph replay further apart (H100, driver 580: +0.4 us per kernel, +2.4% on a 6-GEMV decode
/// step; reproduced without the shim by one small kernel on a third stream,
/// docs/measurements/2026-11-25-h100-side-stream.md). A sparse rule checks too few calls for
/// the side stream to win that back: on the stream, 1 in 100 checks costs ~0.2% of the calls.
pub const SIDE_STREAM_MIN_RATE_DENOM: u64 = 8;

impl SideStreamUse {
    pub fn enabled_for(self, sampling: Sampling, mode: Mode) -> bool {
        match self {
            SideStreamUse::On => true,
            SideStreamUse::Off => false,
            // A rows/full reference is a GEMM of its own (milliseconds at decode sizes on the
            // caller's stream, where a sketch check takes ~20 us): off the stream at any rate.
            SideStreamUse::Auto => match mode {
                Mode::Check(CheckMode::Rows | CheckMode::Full) => true,
                _ => sampling.every != 0 && sampling.every <= SIDE_STREAM_MIN_RATE_DENOM,
            },
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            SideStreamUse::Auto => "auto",
            SideStreamUse::On => "on",
            SideStreamUse::Off => "off",
        }
    }
}

/// `QUANTSHADOW_SKETCH_DETACH`: which GPU sketch checks copy their sampled rows on the caller's
/// stream and run off it (a side stream, or a CUDA graph branch nothing waits for) instead of
/// running whole on the caller's stream right after the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SketchDetach {
    /// None: every check on the caller's stream.
    Off,
    /// Checks captured into CUDA graphs only (the default). Eager checks stay on the stream:
    /// measured in one process against the paused shim, detaching them made no Llama prefill
    /// cheaper (+30.2/+20.6% detached against +16.7/+19.3% on the stream, two processes at
    /// 8b widths, docs/measurements/2026-11-26-h100-batched-checks.md),
    /// and it skips the calls that find their site's earlier check still running, so that
    /// "sample all" checked only a share of them. A captured check, detached, runs after the
    /// replay's last kernel and keeps the graph's GEMMs to themselves (graph decode at Llama-8B
    /// widths: -8.3% tokens/s, docs/measurements/2026-11-25-h100-copy-beside.md).
    Graphs,
    /// Eager checks too (from 64 sampled rows): the caller's stream pays a copy of the rows.
    On,
}

impl SketchDetach {
    /// Whether eager checks are detached too (captured ones are unless `Off`).
    pub fn detaches_eager(self) -> bool {
        self == SketchDetach::On
    }

    pub fn name(self) -> &'static str {
        match self {
            SketchDetach::Off => "off",
            SketchDetach::Graphs => "graphs",
            SketchDetach::On => "on",
        }
    }
}

/// A three-way setting: its own `word` (also the default when unset or invalid) or a switch
/// value ([`on_off`]); an invalid value is named in `bad`.
fn word_on_off<T: Copy>(
    value: Option<String>,
    var: &str,
    (word, named): (&str, T),
    (on, off): (T, T),
    bad: &mut Vec<String>,
) -> T {
    match value {
        None => named,
        Some(v) if v.trim().eq_ignore_ascii_case(word) => named,
        Some(v) => match on_off(&v) {
            Some(true) => on,
            Some(false) => off,
            None => {
                bad.push(format!("{var}={v:?} is not {word}, on or off; using {word}"));
                named
            }
        },
    }
}

/// A switch value: `on`/`1`/`true` or `off`/`0`/`false` (any case, spaces trimmed).
pub(crate) fn on_off(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "on" | "1" | "true" => Some(true),
        "off" | "0" | "false" => Some(false),
        _ => None,
    }
}

#[derive(Debug, Clone)]
pub struct Config {
    pub mode: Mode,
    pub sampling: Sampling,
    pub collector: Option<Address>,
    pub label: String,
    pub log: LogLevel,
    pub device: DeviceChoice,
    pub probes: u32,
    pub sketch_rows: u64,
    pub check_rows: u64,
    pub seed: u64,
    /// Device memory reserved for the checks, bytes.
    pub pool_bytes: usize,
    /// `QUANTSHADOW_NAMES`: map file of weight pointer -> parameter name.
    pub names: Option<std::path::PathBuf>,
    /// `QUANTSHADOW_COMPILE=sync`: the first call needing a kernel waits for its compile
    /// (offline validation); default `async`: such calls are skipped until it is ready.
    pub sync_compile: bool,
    /// `QUANTSHADOW_SKETCH_DETACH` = graphs (default) | on | off: see [`SketchDetach`].
    pub sketch_detach: SketchDetach,
    /// `QUANTSHADOW_GRAPH_SELECT=on` (default): a CUDA graph whose checks were captured with a
    /// sampling rule launches, per replay, a plain or a checked clone chosen on the host
    /// (`engine::graph_select`); `off`: the captured graph runs and its checks decide on the
    /// device (a gated node per check at every replay).
    pub graph_select: bool,
    /// `QUANTSHADOW_SIDE_STREAM=auto` (default): rows/full references run off the caller's
    /// stream, eager sketch checks only under a dense sampling rule (see [`SideStreamUse`]);
    /// `on`: both always; `off`: never (every check on the caller's stream).
    pub side_stream: SideStreamUse,
    /// `QUANTSHADOW_INJECT`: faults planted on purpose (testing the detector).
    pub inject: Option<Arc<InjectPlan>>,
    /// `QUANTSHADOW_POLICY`: backend rules (and the file's text) recorded with the session for
    /// the report, which evaluates them per site.
    pub policy: Option<(Policy, String)>,
    /// `QUANTSHADOW_THRESHOLDS`: thresholds the shim judges checks by (which sites to
    /// diagnose); the report judges with its own (`--thresholds`).
    pub thresholds: Arc<Thresholds>,
    pub diagnose: DiagnoseMode,
    /// `QUANTSHADOW_SKETCH_LEAN` and `QUANTSHADOW_EARLY_START` (GPU kernel choices).
    pub kernels: KernelChoices,
    /// Problems with the environment, logged once at start.
    pub warnings: Vec<String>,
}

pub const DEFAULT_PROBES: u32 = crate::sketch::DEFAULT_PROBES;
pub const DEFAULT_SKETCH_ROWS: u64 = crate::sketch::DEFAULT_ROWS_PER_CALL;
pub const DEFAULT_CHECK_ROWS: u64 = 64;
pub const DEFAULT_POOL_MIB: usize = 512;

impl Config {
    pub fn from_env() -> Config {
        Config::from_lookup(|k| std::env::var(k).ok())
    }

    /// Reads every setting through `get` (tests pass a map).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Config {
        let mut warnings = Vec::new();
        let parsed = |key: &str| get(key).filter(|v| !v.trim().is_empty());
        let mut bad = Vec::new();
        let mode = match parsed("QUANTSHADOW_MODE") {
            None => Mode::Check(CheckMode::Sketch),
            Some(v) => Mode::parse(&v).unwrap_or_else(|| {
                bad.push(format!(
                    "QUANTSHADOW_MODE={v:?} is not one of off, observe, sketch, rows, full; using sketch"
                ));
                Mode::Check(CheckMode::Sketch)
            }),
        };
        let sampling = match parsed("QUANTSHADOW_SAMPLE") {
            None => Sampling::ALL,
            Some(v) => Sampling::parse(&v).unwrap_or_else(|| {
                bad.push(format!(
                    "QUANTSHADOW_SAMPLE={v:?} is not all, 1/N, first:K or first:K,1/N; using 1/100"
                ));
                Sampling { first: 0, every: 100 }
            }),
        };
        let collector = parsed("QUANTSHADOW_COLLECTOR").and_then(|v| match v.parse::<Address>() {
            Ok(a) => Some(a),
            Err(e) => {
                bad.push(format!("QUANTSHADOW_COLLECTOR={v:?}: {e}; records are not sent"));
                None
            }
        });
        let label = parsed("QUANTSHADOW_LABEL").unwrap_or_else(|| "default".into());
        let log = match parsed("QUANTSHADOW_LOG") {
            None => LogLevel::Warn,
            Some(v) => match v.trim().to_ascii_lowercase().as_str() {
                "error" => LogLevel::Error,
                "warn" | "warning" => LogLevel::Warn,
                "info" => LogLevel::Info,
                "debug" | "trace" => LogLevel::Debug,
                _ => {
                    bad.push(format!("QUANTSHADOW_LOG={v:?} is not error, warn, info or debug; using warn"));
                    LogLevel::Warn
                }
            },
        };
        let device = match parsed("QUANTSHADOW_DEVICE") {
            None => DeviceChoice::Auto,
            Some(v) => match v.trim().to_ascii_lowercase().as_str() {
                "auto" => DeviceChoice::Auto,
                "cuda" => DeviceChoice::Cuda,
                "hip" => DeviceChoice::Hip,
                "host" => DeviceChoice::Host,
                _ => {
                    bad.push(format!("QUANTSHADOW_DEVICE={v:?} is not auto, cuda, hip or host; using auto"));
                    DeviceChoice::Auto
                }
            },
        };
        let mut number = |key: &str, default: u64, lo: u64, hi: u64| -> u64 {
            match parsed(key) {
                None => default,
                Some(v) => match v.trim().parse::<u64>() {
                    Ok(n) if (lo..=hi).contains(&n) => n,
                    _ => {
                        bad.push(format!("{key}={v:?} is not a number in {lo}..={hi}; using {default}"));
                        default
                    }
                },
            }
        };
        let probes = number("QUANTSHADOW_PROBES", DEFAULT_PROBES as u64, 1, 32) as u32;
        let sketch_rows = number("QUANTSHADOW_SKETCH_ROWS", DEFAULT_SKETCH_ROWS, 1, 1 << 20);
        let check_rows = number("QUANTSHADOW_ROWS", DEFAULT_CHECK_ROWS, 1, 1 << 20);
        let seed = number("QUANTSHADOW_SEED", 0x5eed, 0, u64::MAX);
        let pool_mib = number("QUANTSHADOW_POOL_MB", DEFAULT_POOL_MIB as u64, 16, 1 << 20) as usize;
        let names = parsed("QUANTSHADOW_NAMES").map(std::path::PathBuf::from);
        let sync_compile = match parsed("QUANTSHADOW_COMPILE") {
            None => false,
            Some(v) => match v.trim().to_ascii_lowercase().as_str() {
                "sync" => true,
                "async" => false,
                _ => {
                    bad.push(format!("QUANTSHADOW_COMPILE={v:?} is not sync or async; using async"));
                    false
                }
            },
        };
        let sketch_detach = word_on_off(
            parsed("QUANTSHADOW_SKETCH_DETACH"),
            "QUANTSHADOW_SKETCH_DETACH",
            ("graphs", SketchDetach::Graphs),
            (SketchDetach::On, SketchDetach::Off),
            &mut bad,
        );
        let graph_select = match parsed("QUANTSHADOW_GRAPH_SELECT") {
            None => true,
            Some(v) => on_off(&v).unwrap_or_else(|| {
                bad.push(format!("QUANTSHADOW_GRAPH_SELECT={v:?} is not on or off; using on"));
                true
            }),
        };
        let side_stream = word_on_off(
            parsed("QUANTSHADOW_SIDE_STREAM"),
            "QUANTSHADOW_SIDE_STREAM",
            ("auto", SideStreamUse::Auto),
            (SideStreamUse::On, SideStreamUse::Off),
            &mut bad,
        );
        let inject = match get(crate::inject::ENV_VAR) {
            None => None,
            Some(v) => match InjectPlan::from_spec_str(&v) {
                Ok(plan) => plan.map(Arc::new),
                Err(e) => {
                    bad.push(format!("{e}; no fault is injected"));
                    None
                }
            },
        };
        let policy = parsed(crate::policy::ENV_VAR).and_then(|path| {
            let path = path.trim();
            let loaded = std::fs::read_to_string(path)
                .map_err(|e| format!("policy {path}: {e}"))
                .and_then(|text| Policy::parse(&text, path).map(|p| (p, text)).map_err(|e| e.to_string()));
            match loaded {
                Ok(p) => Some(p),
                Err(e) => {
                    bad.push(format!("{e}; no backend policy is recorded"));
                    None
                }
            }
        });
        let thresholds = match parsed("QUANTSHADOW_THRESHOLDS") {
            None => Thresholds::default(),
            Some(path) => Thresholds::from_file(std::path::Path::new(path.trim())).unwrap_or_else(|e| {
                bad.push(format!("QUANTSHADOW_THRESHOLDS: {e}; using the default thresholds"));
                Thresholds::default()
            }),
        };
        let diagnose = match parsed("QUANTSHADOW_DIAGNOSE") {
            None => DiagnoseMode::OnFail,
            Some(v) => match v.trim().to_ascii_lowercase().as_str() {
                "off" => DiagnoseMode::Off,
                "on-fail" => DiagnoseMode::OnFail,
                "every-site" => DiagnoseMode::EverySite,
                _ => {
                    bad.push(format!(
                        "QUANTSHADOW_DIAGNOSE={v:?} is not off, on-fail or every-site; using on-fail"
                    ));
                    DiagnoseMode::OnFail
                }
            },
        };
        let (kernels, mut kernel_warnings) = KernelChoices::from_lookup(&get);
        bad.append(&mut kernel_warnings);
        warnings.append(&mut bad);
        Config {
            mode,
            sampling,
            collector,
            label,
            log,
            device,
            probes,
            sketch_rows,
            check_rows,
            seed,
            pool_bytes: pool_mib << 20,
            names,
            sync_compile,
            sketch_detach,
            graph_select,
            side_stream,
            inject,
            policy,
            thresholds: Arc::new(thresholds),
            diagnose,
            kernels,
            warnings,
        }
    }

    /// Effective settings for the session record.
    pub fn settings(&self) -> Vec<(String, String)> {
        vec![
            ("mode".into(), self.mode.name().into()),
            ("sample".into(), self.sampling.describe()),
            ("probes".into(), self.probes.to_string()),
            ("sketch_rows".into(), self.sketch_rows.to_string()),
            ("rows".into(), self.check_rows.to_string()),
            ("seed".into(), self.seed.to_string()),
            ("pool_mib".into(), (self.pool_bytes >> 20).to_string()),
            ("compile".into(), if self.sync_compile { "sync" } else { "async" }.into()),
            ("sketch_detach".into(), self.sketch_detach.name().into()),
            ("graph_select".into(), if self.graph_select { "on" } else { "off" }.into()),
            (
                "side_stream".into(),
                format!(
                    "{} ({})",
                    self.side_stream.name(),
                    if self.side_stream.enabled_for(self.sampling, self.mode) { "used" } else { "not used" }
                ),
            ),
            ("diagnose".into(), self.diagnose.name().into()),
            ("inject".into(), self.inject.as_ref().map_or("none".into(), |p| p.spec_string())),
        ]
        .into_iter()
        .chain(self.kernels.settings().into_iter().map(|(k, v)| (k.to_string(), v.to_string())))
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg(pairs: &[(&str, &str)]) -> Config {
        let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Config::from_lookup(|k| m.get(k).cloned())
    }

    #[test]
    fn kernel_choices_are_validated_and_recorded() {
        use crate::device::gpu::{KernelChoices, LeanUse, SplitUse};
        let setting =
            |c: &Config, k: &str| c.settings().into_iter().find(|(key, _)| key == k).map(|(_, v)| v);
        let d = cfg(&[]);
        assert_eq!(
            d.kernels,
            KernelChoices { lean: LeanUse::Eager, early_start: false, split: SplitUse::Large }
        );
        assert_eq!(
            (
                setting(&d, "sketch_lean").as_deref(),
                setting(&d, "early_start").as_deref(),
                setting(&d, "sketch_split").as_deref()
            ),
            (Some("1"), Some("0"), Some("auto"))
        );
        let c = cfg(&[
            ("QUANTSHADOW_SKETCH_LEAN", " Graphs "),
            ("QUANTSHADOW_EARLY_START", "1"),
            ("QUANTSHADOW_SKETCH_SPLIT", "1"),
        ]);
        assert_eq!(
            c.kernels,
            KernelChoices { lean: LeanUse::Graphs, early_start: true, split: SplitUse::On }
        );
        assert_eq!(setting(&c, "sketch_split").as_deref(), Some("1"));
        for (v, want, recorded) in [("0", SplitUse::Off, "0"), (" AUTO ", SplitUse::Large, "auto")] {
            let c = cfg(&[("QUANTSHADOW_SKETCH_SPLIT", v)]);
            assert_eq!((c.kernels.split, setting(&c, "sketch_split").as_deref()), (want, Some(recorded)));
            assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        }
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        assert_eq!(setting(&c, "sketch_lean").as_deref(), Some("graphs"));
        assert_eq!(cfg(&[("QUANTSHADOW_SKETCH_LEAN", "0")]).kernels.lean, LeanUse::Off);
        // A typo is named, and the default stands (the lean kernel on, early starts off).
        let bad = cfg(&[
            ("QUANTSHADOW_SKETCH_LEAN", "graph"),
            ("QUANTSHADOW_EARLY_START", "yes"),
            ("QUANTSHADOW_SKETCH_SPLIT", "maybe"),
        ]);
        assert_eq!(bad.kernels, KernelChoices::default());
        assert_eq!(bad.warnings.len(), 3, "{:?}", bad.warnings);
        assert!(
            bad.warnings[2].contains("QUANTSHADOW_SKETCH_SPLIT=\"maybe\" is not 0, 1 or auto; using auto"),
            "{:?}",
            bad.warnings
        );
        assert!(
            bad.warnings[0].contains("QUANTSHADOW_SKETCH_LEAN=\"graph\" is not 0, 1 or graphs"),
            "{:?}",
            bad.warnings
        );
        assert!(
            bad.warnings[1].contains("QUANTSHADOW_EARLY_START=\"yes\" is not 0 or 1"),
            "{:?}",
            bad.warnings
        );
    }

    #[test]
    fn defaults_are_sketch_all() {
        let c = cfg(&[]);
        assert_eq!(c.mode, Mode::Check(CheckMode::Sketch));
        assert_eq!(c.sampling, Sampling::ALL);
        assert!(c.collector.is_none());
        assert!(c.warnings.is_empty());
    }

    #[test]
    fn sampling_forms() {
        assert_eq!(Sampling::parse("all"), Some(Sampling::ALL));
        assert_eq!(Sampling::parse("1/8"), Some(Sampling { first: 0, every: 8 }));
        assert_eq!(Sampling::parse("first:3"), Some(Sampling { first: 3, every: 0 }));
        assert_eq!(Sampling::parse("first:3,1/10"), Some(Sampling { first: 3, every: 10 }));
        assert_eq!(Sampling::parse("first:3 then 1/10"), Some(Sampling { first: 3, every: 10 }));
        for bad in ["", "1/0", "half", "first:", "first:x", "first:2,1/0", "2/3"] {
            assert_eq!(Sampling::parse(bad), None, "{bad}");
        }
        let s = Sampling { first: 2, every: 3 };
        let taken: Vec<u64> = (0..10).filter(|&n| s.takes(n)).collect();
        assert_eq!(taken, vec![0, 1, 2, 5, 8]);
        assert!(!Sampling { first: 1, every: 0 }.takes(1));
        for s in [Sampling::ALL, Sampling { first: 0, every: 7 }, Sampling { first: 4, every: 0 }, s] {
            assert_eq!(Sampling::parse(&s.describe()), Some(s));
        }
    }

    #[test]
    fn side_stream_auto_follows_the_sampling_density() {
        let auto = SideStreamUse::Auto;
        let sketch = Mode::Check(CheckMode::Sketch);
        let sparse = Sampling { first: 0, every: 100 };
        assert!(auto.enabled_for(Sampling::ALL, sketch));
        assert!(auto.enabled_for(Sampling { first: 0, every: SIDE_STREAM_MIN_RATE_DENOM }, sketch));
        assert!(!auto.enabled_for(Sampling { first: 0, every: SIDE_STREAM_MIN_RATE_DENOM + 1 }, sketch));
        assert!(!auto.enabled_for(sparse, sketch));
        assert!(!auto.enabled_for(Sampling { first: 5, every: 0 }, sketch), "first:K alone is sparse");
        for mode in [Mode::Check(CheckMode::Rows), Mode::Check(CheckMode::Full)] {
            assert!(auto.enabled_for(sparse, mode), "references stay off the stream: {mode:?}");
        }
        assert!(SideStreamUse::On.enabled_for(sparse, sketch));
        assert!(!SideStreamUse::Off.enabled_for(Sampling::ALL, Mode::Check(CheckMode::Rows)));
        assert_eq!(cfg(&[]).side_stream, SideStreamUse::Auto);
        for (v, want) in
            [("on", SideStreamUse::On), ("OFF", SideStreamUse::Off), (" auto ", SideStreamUse::Auto)]
        {
            let c = cfg(&[("QUANTSHADOW_SIDE_STREAM", v)]);
            assert_eq!(c.side_stream, want, "{v}");
            assert!(c.warnings.is_empty());
        }
        let settings = cfg(&[("QUANTSHADOW_SAMPLE", "1/100")]).settings();
        assert!(settings.contains(&("side_stream".into(), "auto (not used)".into())), "{settings:?}");
        let settings = cfg(&[("QUANTSHADOW_SAMPLE", "1/100"), ("QUANTSHADOW_MODE", "rows")]).settings();
        assert!(settings.contains(&("side_stream".into(), "auto (used)".into())), "{settings:?}");
    }

    #[test]
    fn invalid_values_warn_and_fall_back() {
        let c = cfg(&[
            ("QUANTSHADOW_MODE", "fast"),
            ("QUANTSHADOW_SAMPLE", "sometimes"),
            ("QUANTSHADOW_COLLECTOR", "udp:1.2.3.4"),
            ("QUANTSHADOW_LOG", "loud"),
            ("QUANTSHADOW_PROBES", "64"),
            ("QUANTSHADOW_DEVICE", "tpu"),
            ("QUANTSHADOW_SKETCH_DETACH", "sometimes"),
            ("QUANTSHADOW_GRAPH_SELECT", "maybe"),
            ("QUANTSHADOW_SIDE_STREAM", "sideways"),
        ]);
        assert_eq!(c.mode, Mode::Check(CheckMode::Sketch));
        assert_eq!(c.sketch_detach, SketchDetach::Graphs, "an invalid value keeps the default");
        assert_eq!(c.sampling, Sampling { first: 0, every: 100 });
        assert!(c.collector.is_none());
        assert_eq!(c.log, LogLevel::Warn);
        assert_eq!(c.probes, DEFAULT_PROBES);
        assert_eq!(c.device, DeviceChoice::Auto);
        assert!(c.graph_select, "an invalid value keeps the default");
        assert_eq!(c.side_stream, SideStreamUse::Auto, "an invalid value keeps the default");
        assert_eq!(c.warnings.len(), 9, "{:?}", c.warnings);
        assert!(c
            .warnings
            .iter()
            .any(|w| w.contains("QUANTSHADOW_SIDE_STREAM=\"sideways\" is not auto, on or off")));
        assert!(c.warnings.iter().any(|w| w.contains("QUANTSHADOW_GRAPH_SELECT=\"maybe\" is not on or off")));
        assert!(c.warnings.iter().any(|w| w.contains("QUANTSHADOW_MODE=\"fast\"")));
        assert!(c
            .warnings
            .iter()
            .any(|w| w.contains("QUANTSHADOW_SKETCH_DETACH=\"sometimes\" is not graphs, on or off")));
    }

    #[test]
    fn valid_values() {
        let c = cfg(&[
            ("QUANTSHADOW_MODE", "rows"),
            ("QUANTSHADOW_SAMPLE", "first:2,1/4"),
            ("QUANTSHADOW_COLLECTOR", "unix:/tmp/x.sock"),
            ("QUANTSHADOW_LABEL", "fp8-rowwise"),
            ("QUANTSHADOW_DEVICE", "host"),
            ("QUANTSHADOW_SKETCH_DETACH", "off"),
            ("QUANTSHADOW_GRAPH_SELECT", "off"),
        ]);
        assert_eq!(c.mode, Mode::Check(CheckMode::Rows));
        assert_eq!(c.sketch_detach, SketchDetach::Off);
        assert_eq!(cfg(&[("QUANTSHADOW_SKETCH_DETACH", " ON ")]).sketch_detach, SketchDetach::On);
        assert_eq!(cfg(&[("QUANTSHADOW_SKETCH_DETACH", "Graphs")]).sketch_detach, SketchDetach::Graphs);
        assert_eq!(cfg(&[]).sketch_detach, SketchDetach::Graphs);
        let detach = cfg(&[]).settings().into_iter().find(|(k, _)| k == "sketch_detach").map(|(_, v)| v);
        assert_eq!(detach.as_deref(), Some("graphs"), "the default is recorded");
        for (v, want) in [("1", SketchDetach::On), ("false", SketchDetach::Off), ("0", SketchDetach::Off)] {
            assert_eq!(cfg(&[("QUANTSHADOW_SKETCH_DETACH", v)]).sketch_detach, want, "{v}");
        }
        assert!(SketchDetach::On.detaches_eager());
        assert!(!SketchDetach::Graphs.detaches_eager() && !SketchDetach::Off.detaches_eager());
        assert!(!c.graph_select);
        assert_eq!(c.collector, Some(Address::Unix("/tmp/x.sock".into())));
        assert_eq!(c.label, "fp8-rowwise");
        assert_eq!(c.device, DeviceChoice::Host);
        assert!(c.warnings.is_empty());
    }
}
