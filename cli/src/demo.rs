//! `quantshadow demo`: the whole pipeline on a machine without a GPU.
//!
//! A small transformer-shaped model (per layer: qkv, o, gate_up and down projections; then an
//! LM head) runs a prefill (M = 64 tokens) and a decode step (M = 1) in several quantization
//! configurations. The "production" GEMMs are computed by the C fixture vendor BLAS
//! (`tests/fixtures/`), an implementation independent of the Rust oracle, with FP32
//! accumulation as a GPU library would. Some calls carry planted faults of the bug classes in
//! DESIGN.md. Every call is checked in full mode against the f64 host oracle; each
//! configuration is one "process" session streaming records through the real transport client
//! to a real collector over a unix socket; the report is built from the run file.
//!
//! The demo succeeds when the report fails exactly the planted sites and passes all others.

use crate::collect::Collector;
use crate::fixture::{fixture_gemm, Fault};
use crate::report::{self, SiteKey, SiteStatus};
use quantshadow_runtime::diagnosis;
use quantshadow_runtime::formats::Format;
use quantshadow_runtime::metrics::{compare_logits, compare_matrix, top_k, LogitsMetrics};
use quantshadow_runtime::oracle::{decode_output, reference_gemm, OracleOptions};
use quantshadow_runtime::problem::{
    GemmProblem, HostInputs, Scalar, ScaleGranularity, ScaleSpec, ScaleStorage,
};
use quantshadow_runtime::quantize::random_inputs;
use quantshadow_runtime::record::{
    self, flags, CheckMode, ClosingRecord, GemmObservation, KeyValue, LogitsRow, ProblemSummary, Record,
    SessionRecord,
};
use quantshadow_runtime::rng::{hash3, mix64};
use quantshadow_runtime::thresholds::Thresholds;
use quantshadow_runtime::transport::{Address, Client, ClientOptions, ClientStats};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Directory for run.qsr, report.md, report.heatmap.svg and report.json.
    #[arg(long, default_value = "demo-out")]
    pub out: PathBuf,
    /// Send records to this already running collector (unix:PATH or tcp:HOST:PORT) instead of
    /// starting one; the report is then left to `quantshadow report` on that collector's file.
    #[arg(long, value_name = "ADDR")]
    pub collector: Option<String>,
    /// Seed of the random weights and activations.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// On a GPU host with PyTorch: also run the bundled PyTorch example (tests/gpu/torch_ops.py)
    /// under the shim with the GPU backend.
    #[arg(long)]
    pub torch: bool,
}

/// Model dimensions: small enough for a 2-core CPU in debug builds, large enough for two
/// 128-wide scale blocks along K, M >= 56 for the tile-boundary bug, and several scale tiles.
const HIDDEN: u64 = 256;
const INTERMEDIATE: u64 = 512;
const VOCAB: u64 = 512;
const LAYERS: usize = 4;
const PREFILL_TOKENS: u64 = 64;
const DECODE_TOKENS: u64 = 1;
const LOGITS_TOP_K: usize = 5;

/// One GEMM site of the model: a weight with a name.
#[derive(Debug, Clone)]
struct Site {
    name: String,
    n: u64,
    k: u64,
    is_lm_head: bool,
}

fn model_sites() -> Vec<Site> {
    let mut sites = Vec::new();
    for layer in 0..LAYERS {
        let p = format!("model.layers.{layer}");
        for (suffix, n, k) in [
            ("self_attn.qkv_proj", 3 * HIDDEN, HIDDEN),
            ("self_attn.o_proj", HIDDEN, HIDDEN),
            ("mlp.gate_up_proj", 2 * INTERMEDIATE, HIDDEN),
            ("mlp.down_proj", HIDDEN, INTERMEDIATE),
        ] {
            sites.push(Site { name: format!("{p}.{suffix}"), n, k, is_lm_head: false });
        }
    }
    sites.push(Site { name: "lm_head".into(), n: VOCAB, k: HIDDEN, is_lm_head: true });
    sites
}

/// How activations (A) and weights (B) are quantized in one configuration.
#[derive(Debug, Clone, Copy)]
enum Scheme {
    Bf16,
    Fp8Tensor,
    Fp8Rowwise,
    /// DeepSeek-V3 style: A 1x128 groups (scales stored K-major, "column-major"), B 128x128.
    Fp8Block,
    Mxfp4,
    Nvfp4,
    /// bf16 activations, int4 weights with bf16 scales per 32-element group (AWQ/GPTQ-like).
    W4A16,
}

impl Scheme {
    fn problem(self, m: u64, n: u64, k: u64) -> GemmProblem {
        use Format::*;
        let (a, b) = match self {
            Scheme::Bf16 | Scheme::W4A16 => (Bf16, if matches!(self, Scheme::W4A16) { Int4 } else { Bf16 }),
            Scheme::Fp8Tensor | Scheme::Fp8Rowwise | Scheme::Fp8Block => (E4m3fn, E4m3fn),
            Scheme::Mxfp4 | Scheme::Nvfp4 => (E2m1, E2m1),
        };
        let mut p = GemmProblem::row_major(m, n, k, a, b, Bf16);
        let f32_scale = |g| Some(ScaleSpec::new(g, F32));
        match self {
            Scheme::Bf16 => {}
            Scheme::Fp8Tensor => {
                p.a_scale = f32_scale(ScaleGranularity::Tensor);
                p.b_scale = f32_scale(ScaleGranularity::Tensor);
            }
            Scheme::Fp8Rowwise => {
                p.a_scale = f32_scale(ScaleGranularity::PerOuter);
                p.b_scale = f32_scale(ScaleGranularity::PerOuter);
            }
            Scheme::Fp8Block => {
                p.a_scale = Some(
                    ScaleSpec::new(ScaleGranularity::Block { outer: 1, inner: 128 }, F32)
                        .with_storage(ScaleStorage::InnerMajor),
                );
                p.b_scale = f32_scale(ScaleGranularity::Block { outer: 128, inner: 128 });
            }
            Scheme::Mxfp4 => {
                let spec =
                    ScaleSpec::new(ScaleGranularity::Mx32, Ue8m0).with_storage(ScaleStorage::Swizzled128x4);
                p.a_scale = Some(spec);
                p.b_scale = Some(spec);
            }
            Scheme::Nvfp4 => {
                let spec =
                    ScaleSpec::new(ScaleGranularity::Nvfp4, Ue4m3).with_storage(ScaleStorage::Swizzled128x4);
                p.a_scale = Some(spec);
                p.b_scale = Some(spec);
                p.a_tensor_scale = Some(Scalar::Device { ptr: 0, format: F32 });
                p.b_tensor_scale = Some(Scalar::Device { ptr: 0, format: F32 });
            }
            Scheme::W4A16 => {
                p.b_scale = Some(ScaleSpec::new(ScaleGranularity::Block { outer: 1, inner: 32 }, Bf16));
            }
        }
        p
    }
}

/// A configuration of the demo: a label, a scheme and the faults planted in it.
struct Configuration {
    label: &'static str,
    scheme: Scheme,
    planted: &'static [(&'static str, Fault)],
}

const CONFIGURATIONS: &[Configuration] = &[
    Configuration { label: "bf16", scheme: Scheme::Bf16, planted: &[] },
    Configuration { label: "fp8-tensorwise", scheme: Scheme::Fp8Tensor, planted: &[] },
    Configuration {
        label: "fp8-rowwise",
        scheme: Scheme::Fp8Rowwise,
        planted: &[
            ("model.layers.1.self_attn.o_proj", Fault::FnAsFnuz),
            ("model.layers.2.mlp.gate_up_proj", Fault::ScaleIgnore),
        ],
    },
    Configuration {
        label: "fp8-block128",
        scheme: Scheme::Fp8Block,
        planted: &[
            ("model.layers.2.mlp.down_proj", Fault::ScaleTranspose),
            ("model.layers.3.self_attn.qkv_proj", Fault::TileRows),
        ],
    },
    Configuration { label: "mxfp4", scheme: Scheme::Mxfp4, planted: &[("lm_head", Fault::Garbage)] },
    Configuration { label: "nvfp4", scheme: Scheme::Nvfp4, planted: &[] },
    Configuration {
        label: "w4a16-int4",
        scheme: Scheme::W4A16,
        planted: &[
            ("model.layers.0.mlp.gate_up_proj", Fault::Nan),
            ("model.layers.3.mlp.down_proj", Fault::Zero),
        ],
    },
];

#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("cannot create {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("bad --collector address: {0}")]
    Address(String),
    #[error("collector: {0}")]
    Collector(String),
    #[error("{label} / {site}: {message}")]
    Gemm { label: String, site: String, message: String },
    #[error("report: {0}")]
    Report(String),
    #[error(
        "{dropped} records were dropped and {sent} delivered to {address}: is a collector listening there?"
    )]
    Delivery { sent: u64, dropped: u64, address: String },
}

pub fn main(args: Args) -> ExitCode {
    match run(&args) {
        Ok(outcome) => {
            println!("{}", outcome.summary);
            ExitCode::from(if outcome.as_planted { crate::exit::OK } else { crate::exit::FAILED })
        }
        Err(e) => {
            eprintln!("quantshadow demo: error: {e}");
            // Records that did not arrive are a failed run, not a usage error.
            let code = if matches!(e, DemoError::Delivery { .. }) {
                crate::exit::FAILED
            } else {
                crate::exit::BAD_INPUT
            };
            ExitCode::from(code)
        }
    }
}

/// What a demo run found.
#[derive(Debug)]
pub struct DemoOutcome {
    /// The report failed exactly the planted (configuration, site) pairs.
    pub as_planted: bool,
    pub run_file: Option<PathBuf>,
    pub report_file: Option<PathBuf>,
    pub summary: String,
}

pub fn run(args: &Args) -> Result<DemoOutcome, DemoError> {
    std::fs::create_dir_all(&args.out)
        .map_err(|source| DemoError::Io { path: args.out.display().to_string(), source })?;
    let external: Option<Address> = args
        .collector
        .as_deref()
        .map(|a| a.parse().map_err(|e| DemoError::Address(format!("{e}"))))
        .transpose()?;

    // A private collector on a unix socket next to the outputs, unless one was given.
    let run_file = args.out.join("run.qsr");
    // A run file already there (a previous demo, or anything else) is kept as run.qsr.prev
    // rather than deleted: the demo never destroys a run.
    if run_file.exists() {
        let previous = args.out.join("run.qsr.prev");
        std::fs::rename(&run_file, &previous)
            .map_err(|source| DemoError::Io { path: run_file.display().to_string(), source })?;
        eprintln!("quantshadow demo: kept the existing {} as {}", run_file.display(), previous.display());
    }
    let (collector, address) = match &external {
        Some(address) => (None, address.clone()),
        None => {
            let socket = args.out.join("collector.sock");
            let _ = std::fs::remove_file(&socket);
            let collector = Collector::start(&Address::Unix(socket), &run_file)
                .map_err(|e| DemoError::Collector(e.to_string()))?;
            let address = collector.local_address().clone();
            (Some(collector), address)
        }
    };

    let sites = model_sites();
    let started = std::time::Instant::now();
    // Each configuration is its own "process"; they run side by side like canary replicas.
    let results: Vec<Result<ClientStats, DemoError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = CONFIGURATIONS
            .iter()
            .map(|config| {
                let (address, sites) = (address.clone(), &sites);
                scope.spawn(move || run_configuration(config, sites, &address, args.seed))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(panicked()))).collect()
    });
    let delivery = results.into_iter().collect::<Result<Vec<ClientStats>, _>>()?;
    let elapsed = started.elapsed();
    let (sent, dropped): (u64, u64) =
        delivery.iter().fold((0, 0), |(s, d), st| (s + st.sent, d + st.dropped));
    if dropped > 0 || sent == 0 {
        // Never claim success for records that did not arrive (no collector, or a slow one).
        return Err(DemoError::Delivery { sent, dropped, address: address.to_string() });
    }

    let Some(collector) = collector else {
        return Ok(DemoOutcome {
            as_planted: true,
            run_file: None,
            report_file: None,
            summary: format!(
                "sent {} configurations to {address} in {:.1} s; run `quantshadow report` on that collector's file",
                CONFIGURATIONS.len(),
                elapsed.as_secs_f64()
            ),
        });
    };
    let collected = collector.shutdown();

    let report_file = args.out.join("report.md");
    let report_args = report::Args {
        files: vec![run_file.clone()],
        out: Some(report_file.clone()),
        json: Some(args.out.join("report.json")),
        thresholds: None,
    };
    let report = report::run(&report_args).map_err(|e| DemoError::Report(e.to_string()))?;

    // Compare what the report failed with what was planted.
    let planted: BTreeSet<(String, String)> = CONFIGURATIONS
        .iter()
        .flat_map(|c| c.planted.iter().map(|(site, _)| (c.label.to_string(), site.to_string())))
        .collect();
    let mut flagged = BTreeSet::new();
    let mut passed_sites = 0usize;
    for config in &report.configurations {
        for site in &config.sites {
            let name = match &site.key {
                SiteKey::Named(n) => n.clone(),
                other => other.to_string(),
            };
            match site.status {
                SiteStatus::Fail => {
                    flagged.insert((config.label.clone(), name));
                }
                SiteStatus::Pass => passed_sites += 1,
                SiteStatus::Observed => {}
            }
        }
    }
    let missed: Vec<_> = planted.difference(&flagged).collect();
    let false_alarms: Vec<_> = flagged.difference(&planted).collect();
    let as_planted = missed.is_empty() && false_alarms.is_empty();

    let mut summary = String::new();
    summary.push_str(&format!(
        "quantshadow demo: {} configurations x {} sites x 2 calls checked in {:.1} s; collector stored {} records\n",
        CONFIGURATIONS.len(),
        sites.len(),
        elapsed.as_secs_f64(),
        collected.stats.records
    ));
    for config in &report.configurations {
        summary.push_str(&format!(
            "  {:<16} {:<8} {} failing of {} sites\n",
            config.label,
            config.verdict.name(),
            config.failing_sites().count(),
            config.sites.len()
        ));
    }
    summary.push_str(&format!(
        "planted faults: {}, flagged sites: {}, passing sites: {passed_sites}\n",
        planted.len(),
        flagged.len()
    ));
    for (label, site) in &missed {
        summary.push_str(&format!("  MISSED planted fault: {label} / {site}\n"));
    }
    for (label, site) in &false_alarms {
        summary.push_str(&format!("  FALSE ALARM: {label} / {site}\n"));
    }
    summary.push_str(if as_planted {
        "the report fails exactly the planted sites\n"
    } else {
        "the report does NOT match the planted faults\n"
    });
    summary.push_str(&format!("report: {}\nrun file: {}", report_file.display(), run_file.display()));
    let (shim_ok, shim_summary) = shim_stage(args);
    summary.push_str(&format!("\n\n{shim_summary}"));
    let as_planted = as_planted && shim_ok;
    Ok(DemoOutcome { as_planted, run_file: Some(run_file), report_file: Some(report_file), summary })
}

/// Calls of the fixture program's "model" scenario that the demo makes wrong in the fixture
/// vendor library: the second MLP layer (2x too large) and the FP8 row-wise GEMM (one bad row).
const SHIM_FAULTS: &str = "4:alpha2x,9:bad_row";
const SHIM_FAULTY_CALLS: [u64; 2] = [4, 9];

/// The same pipeline through the real interposer: `quantshadow run` of the C fixture program
/// (vendor-shaped cuBLASLt/cuBLAS/hipBLASLt calls from a library loaded RTLD_LOCAL, as in
/// PyTorch) with LD_PRELOAD=libquantshadow.so and the host backend; with `--torch`, the bundled
/// PyTorch example on the GPU instead. Returns (as expected, summary).
fn shim_stage(args: &Args) -> (bool, String) {
    let out = args.out.join(if args.torch { "torch" } else { "shim" });
    let _ = std::fs::remove_file(out.join("run.qsr.prev"));
    if out.join("run.qsr").exists() {
        let _ = std::fs::rename(out.join("run.qsr"), out.join("run.qsr.prev"));
    }
    let (command, env, what): (Vec<std::ffi::OsString>, Vec<(String, String)>, &str) = if args.torch {
        // The repository the binary was built from, else the current directory's checkout.
        let script = [std::path::Path::new(env!("CARGO_MANIFEST_DIR")), std::path::Path::new(".")]
            .iter()
            .map(|root| root.join("tests/gpu/torch_ops.py"))
            .find(|p| p.is_file())
            .unwrap_or_else(|| "tests/gpu/torch_ops.py".into());
        (
            vec!["python3".into(), script.into(), out.join("outputs.json").into()],
            vec![("QUANTSHADOW_COMPILE".into(), "sync".into())],
            "the PyTorch example (a@b bf16/fp16/fp32, F.linear+bias, bmm, FP8 _scaled_mm, a CUDA graph)",
        )
    } else {
        (
            vec![env!("QUANTSHADOW_FIXTURE_HOST").into(), "model".into()],
            vec![
                ("QUANTSHADOW_DEVICE".into(), "host".into()),
                ("FIXTURE_VENDOR_FAULT".into(), SHIM_FAULTS.into()),
            ],
            "the C fixture program (16 vendor calls, 2 of them planted faults)",
        )
    };
    let run_args = crate::run::Args {
        label: if args.torch { "torch-example".into() } else { "fixture-under-shim".into() },
        out: out.clone(),
        mode: None,
        sample: None,
        names: None,
        thresholds: None,
        shim: None,
        command,
        env,
    };
    let code = match crate::run::run(&run_args) {
        Ok(code) => code,
        Err(e) => return (false, format!("through the shim: not run: {e}")),
    };
    let run = match crate::report::load_run_file(&out.join("run.qsr")) {
        Ok(r) => r,
        Err(e) => return (false, format!("through the shim: no run file: {e}")),
    };
    let thresholds = quantshadow_runtime::thresholds::Thresholds::default();
    let mut failing = Vec::new();
    let mut checked = 0;
    for r in &run.records {
        if let Record::Observation(o) = r {
            if let Some(m) = &o.metrics {
                checked += 1;
                if !thresholds.judge(o.problem.class(), m).is_empty() {
                    failing.push(o.call_seq);
                }
            }
        }
    }
    let expected: Vec<u64> = if args.torch { vec![] } else { SHIM_FAULTY_CALLS.to_vec() };
    let ok = failing == expected && checked > 0 && code == u8::from(!expected.is_empty());
    let verdict = if ok { "as expected" } else { "NOT as expected" };
    (
        ok,
        format!(
            "through the shim: {what}\n  {checked} calls checked, failing calls {failing:?} (planted {expected:?}): {verdict}\n  report: {}",
            out.join("report.md").display()
        ),
    )
}

fn panicked() -> DemoError {
    DemoError::Collector("a configuration thread panicked".into())
}

fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

/// Runs every call of one configuration as one session and streams its records.
fn run_configuration(
    config: &Configuration,
    sites: &[Site],
    address: &Address,
    seed: u64,
) -> Result<ClientStats, DemoError> {
    let session_id = mix64(seed ^ hash3(0x5e55, config.label.len() as u64, fnv(config.label)));
    let session = SessionRecord {
        session_id,
        host: hostname(),
        pid: std::process::id(),
        rank: 0,
        device_name: "host CPU (fixture vendor BLAS)".into(),
        device_arch: std::env::consts::ARCH.into(),
        library_versions: vec![KeyValue {
            key: "quantshadow".into(),
            value: env!("CARGO_PKG_VERSION").into(),
        }],
        label: config.label.into(),
        start_time_ns: now_ns(),
        settings: vec![
            KeyValue { key: "mode".into(), value: "full".into() },
            KeyValue { key: "sample".into(), value: "all".into() },
            KeyValue { key: "device".into(), value: "host".into() },
            KeyValue {
                key: "inject".into(),
                value: if config.planted.is_empty() {
                    "none".into()
                } else {
                    // As QUANTSHADOW_INJECT would name them (the fixture's all-zero output is the
                    // runtime's zero-after-first class).
                    config
                        .planted
                        .iter()
                        .map(|(s, f)| match f {
                            Fault::Zero => format!("zero-after-first@{s}"),
                            f => format!("{f}@{s}"),
                        })
                        .collect::<Vec<_>>()
                        .join(",")
                },
            },
        ],
    };
    let options =
        ClientOptions { preamble: Some(record::encode(&Record::Session(session))), ..Default::default() };
    let client = Client::start(address.clone(), options);

    let mut call_seq = 0u64;
    let mut checked = 0u64;
    let thresholds = Thresholds::default();
    let mut diagnosed = BTreeSet::new();
    for (step, m) in [PREFILL_TOKENS, DECODE_TOKENS].into_iter().enumerate() {
        for (ordinal, site) in sites.iter().enumerate() {
            let fault =
                config.planted.iter().find(|(s, _)| *s == site.name).map(|(_, f)| *f).unwrap_or(Fault::None);
            let gemm_err = |message: String| DemoError::Gemm {
                label: config.label.into(),
                site: site.name.clone(),
                message,
            };
            let mut problem = config.scheme.problem(m, site.n, site.k);
            // Weights are the same at every step; activations differ per step.
            let data_seed = hash3(seed, ordinal as u64, step as u64);
            let inputs = random_inputs(&problem, data_seed).map_err(|e| gemm_err(e.to_string()))?;
            // NVFP4 tensor scales are chosen by the quantizer; pass them as host values.
            if let Some(v) = inputs.device_scalars.a_tensor_scale {
                problem.a_tensor_scale = Some(Scalar::Host(v));
            }
            if let Some(v) = inputs.device_scalars.b_tensor_scale {
                problem.b_tensor_scale = Some(Scalar::Host(v));
            }
            let produced =
                fixture_gemm(&problem, &inputs, fault, data_seed).map_err(|e| gemm_err(e.to_string()))?;
            let production = decode_output(&problem, &produced).map_err(|e| gemm_err(e.to_string()))?;
            let reference = reference_gemm(&problem, &inputs, &OracleOptions::default())
                .map_err(|e| gemm_err(e.to_string()))?;
            let (rows, n) = (m as usize, site.n as usize);
            let metrics = compare_matrix(&production.values, &reference.values, rows, n);

            let (logits, logits_rows) = if site.is_lm_head {
                logits_summary(&production.values, &reference.values, rows, n)
            } else {
                (None, Vec::new())
            };
            let observation = GemmObservation {
                session_id,
                site_id: hash3(fnv(&site.name), site.n, site.k),
                site_ordinal: ordinal as u32,
                site_name: Some(site.name.clone()),
                call_seq,
                entry_point: "fixture_gemm".into(),
                backend: Some("fixture-blas (C, fp32 accumulate)".into()),
                problem: ProblemSummary::from(&problem),
                mode: CheckMode::Full,
                metrics: Some(metrics),
                rows_checked: m,
                sketch_seed: 0,
                sketch_prod: Vec::new(),
                sketch_ref: Vec::new(),
                logits,
                logits_rows,
                flags: if fault == Fault::None { 0 } else { flags::INJECTED },
                timestamp_ns: now_ns(),
            };
            client.send(record::encode(&Record::Observation(observation)));
            // A failing site is diagnosed once, as the shim does: which reading of the
            // contract reproduces what the library computed, and where the errors are.
            let failing = !thresholds.judge(problem.class(), &metrics).is_empty();
            if failing && diagnosed.insert(ordinal) {
                let site_id = hash3(fnv(&site.name), site.n, site.k);
                let (found, map, rows) =
                    diagnose_demo_call(&problem, &inputs, &production.values, &reference.values)
                        .map_err(gemm_err)?;
                let mut d = diagnosis::to_record(
                    &found,
                    (site_id, ordinal as u32),
                    call_seq,
                    rows,
                    Some(&map),
                    &problem,
                );
                d.session_id = session_id;
                d.timestamp_ns = now_ns();
                client.send(record::encode(&Record::Diagnosis(d)));
            }
            call_seq += 1;
            checked += 1;
        }
    }
    let stats = client.close(
        |dropped| {
            record::encode(&Record::Closing(ClosingRecord {
                session_id,
                calls_seen: call_seq,
                sampled: call_seq,
                checked,
                skipped: Vec::new(),
                dropped,
                end_time_ns: now_ns(),
            }))
        },
        Duration::from_secs(10),
    );
    Ok(stats)
}

/// The diagnosis of one demo call over all its rows, and the error map of the declared reading.
fn diagnose_demo_call(
    problem: &GemmProblem,
    inputs: &HostInputs,
    production: &[f64],
    reference: &[f64],
) -> Result<(diagnosis::Diagnosis, diagnosis::ErrorMap, u64), String> {
    let (m, n) = (problem.m as usize, problem.n as usize);
    let rows: Vec<u64> = (0..problem.m).collect();
    let prod_rows: Vec<(u64, Vec<f64>)> =
        production.chunks_exact(n).take(m).enumerate().map(|(i, v)| (i as u64, v.to_vec())).collect();
    let found = diagnosis::diagnose(problem, inputs, &prod_rows).map_err(|e| e.to_string())?;
    let map = diagnosis::error_map(&production[..m * n], &reference[..m * n], &rows, n, problem);
    Ok((found, map, problem.m))
}

/// Logits metrics of the LM head: the row with the largest KL, and the top-k of the first rows.
fn logits_summary(
    prod: &[f64],
    reference: &[f64],
    rows: usize,
    n: usize,
) -> (Option<LogitsMetrics>, Vec<LogitsRow>) {
    let mut worst: Option<LogitsMetrics> = None;
    let mut listed = Vec::new();
    for row in 0..rows {
        let (p, r) = (&prod[row * n..(row + 1) * n], &reference[row * n..(row + 1) * n]);
        let m = compare_logits(p, r, LOGITS_TOP_K);
        // Negated so that a NaN KL (non-finite logits) always counts as the worst.
        #[allow(clippy::neg_cmp_op_on_partial_ord)]
        if worst.is_none_or(|w| !(m.kl <= w.kl)) {
            worst = Some(m);
        }
        if row < 2 {
            let top =
                |v: &[f64]| top_k(v, LOGITS_TOP_K).into_iter().map(|i| (i as u32, v[i] as f32)).collect();
            listed.push(LogitsRow { row: row as u64, prod_top: top(p), ref_top: top(r) });
        }
    }
    (worst, listed)
}

/// FNV-1a: a stable 64-bit id for names.
fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}
