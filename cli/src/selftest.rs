//! `quantshadow selftest`: the device's reference side against the host oracle.
//!
//! On a GPU (CUDA now; HIP where present): (1) the device helpers (every code of every format
//! decoded and encoded, probe signs and row permutations, scale entries) bit for bit against
//! formats.rs / rng.rs / sketch.rs / problem.rs; (2) full and rows reference GEMMs against the
//! f64 oracle (NMSE <= 1e-9, no NaN) over a table of formats x scale schemes x shapes with
//! tile-boundary M values, transposed, column-major and batched cases; (3) the compare kernel
//! against host metrics on planted errors; (4) the sketch against exact metrics on planted
//! errors of known size (full rank within 25% at k = 8, low rank within 2x, 10x above a
//! threshold always flagged and 10x below never, 2x magnitude always flagged, a single wrong
//! row among thousands found as the worst row). Without a GPU the sketch claims run on the host
//! device and the command says so. Prints a table, writes JSON, exits 1 on any failure.

use quantshadow_runtime::device::abi::{
    self, KernelBuild, QsGemmDesc, QsMatrixDesc, QsRowSel, QsScaleDesc, QsSelftestParams,
};
use quantshadow_runtime::device::cuda::CudaRuntime;
use quantshadow_runtime::device::gpu::{CompareRequest, DeviceBuffer, GpuChecker};
use quantshadow_runtime::device::{DeviceError, Stream};
use quantshadow_runtime::formats::{Format, FormatClass};
use quantshadow_runtime::metrics::{compare_logits, compare_matrix, MetricSums, Metrics};
use quantshadow_runtime::oracle::{
    decode_operand_a, decode_operand_b, decode_output, reference_gemm, OracleOptions,
};
use quantshadow_runtime::problem::{
    Bias, BiasAxis, Epilogue, GemmBuffers, GemmProblem, HostInputs, MatrixLayout, Order, Scalar,
    ScaleGranularity, ScaleSpec, ScaleStorage, Transpose,
};
use quantshadow_runtime::quantize::random_inputs;
use quantshadow_runtime::rng::{hash3, SplitMix64};
use quantshadow_runtime::sketch::{self, DenseGemm, RowPermutation, SketchConfig};
use quantshadow_runtime::thresholds::Thresholds;
use serde::Serialize;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Write every result as JSON here.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Fewer shapes (for a quick look; the full table is the default).
    #[arg(long)]
    pub quick: bool,
    /// Device to test: auto (GPU if one is usable, else host), cuda, or host.
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// GPU sections to run, comma-separated (helpers, reference, compare, logits, sketch,
    /// detached, early, inject, ring); all when absent.
    #[arg(long, value_delimiter = ',', value_name = "SECTIONS")]
    pub only: Vec<String>,
}

/// One line of the result table.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub section: &'static str,
    pub case: String,
    pub pass: bool,
    pub detail: String,
}

#[derive(Debug, Serialize)]
struct Summary {
    device: String,
    passed: usize,
    failed: usize,
    seconds: f64,
    outcomes: Vec<Outcome>,
}

pub fn main(args: Args) -> ExitCode {
    let started = Instant::now();
    let (device, outcomes) = match args.device.as_str() {
        "host" => ("host (requested)".to_string(), host_selftest(args.quick)),
        "cuda" | "auto" => match gpu_context() {
            Ok(checker) => {
                let name = format!(
                    "{} ({}, {} SMs, {})",
                    checker.info.name,
                    checker.info.arch,
                    checker.info.multiprocessors,
                    checker.registry().compiler()
                );
                (name, gpu_selftest(&checker, args.quick, &args.only))
            }
            Err(e) if args.device == "auto" => {
                eprintln!("quantshadow selftest: no usable GPU ({e}); running the host device instead");
                ("host (no GPU)".to_string(), host_selftest(args.quick))
            }
            Err(e) => {
                eprintln!("quantshadow selftest: {e}");
                return ExitCode::from(crate::exit::FAILED);
            }
        },
        other => {
            eprintln!("quantshadow selftest: unknown --device {other:?} (auto, cuda, host)");
            return ExitCode::from(crate::exit::BAD_INPUT);
        }
    };
    let failed = outcomes.iter().filter(|o| !o.pass).count();
    println!("quantshadow selftest on {device}\n");
    println!("| section | case | result | detail |\n| --- | --- | --- | --- |");
    for o in &outcomes {
        println!("| {} | {} | {} | {} |", o.section, o.case, if o.pass { "pass" } else { "FAIL" }, o.detail);
    }
    let summary = Summary {
        device,
        passed: outcomes.len() - failed,
        failed,
        seconds: started.elapsed().as_secs_f64(),
        outcomes,
    };
    println!("\n{} passed, {} failed ({:.1} s)", summary.passed, summary.failed, summary.seconds);
    if let Some(path) = &args.json {
        if let Err(e) = std::fs::write(path, serde_json::to_string_pretty(&summary).unwrap_or_default()) {
            eprintln!("quantshadow selftest: cannot write {}: {e}", path.display());
            return ExitCode::from(crate::exit::BAD_INPUT);
        }
    }
    ExitCode::from(if failed == 0 { crate::exit::OK } else { crate::exit::FAILED })
}

fn gpu_context() -> Result<GpuChecker, DeviceError> {
    let cuda = CudaRuntime::load()?;
    // Our own process: making the primary context current is ours to do (the shim never does).
    cuda.activate_primary_context(0)?;
    GpuChecker::new(Arc::new(cuda), 1024)
}

fn outcome(section: &'static str, case: impl Into<String>, pass: bool, detail: impl Into<String>) -> Outcome {
    Outcome { section, case: case.into(), pass, detail: detail.into() }
}

fn error_outcome(section: &'static str, case: impl Into<String>, e: impl std::fmt::Display) -> Outcome {
    outcome(section, case, false, format!("error: {e}"))
}

// ---------------------------------------------------------------------------------------------
// Cases

/// A reference-GEMM case: formats, scales, layout and shape.
#[derive(Debug, Clone)]
struct Case {
    name: String,
    problem: GemmProblem,
}

fn scheme_problem(scheme: &str, m: u64, n: u64, k: u64) -> GemmProblem {
    use Format::*;
    let spec = |g, f| Some(ScaleSpec::new(g, f));
    let swizzled = |g, f| Some(ScaleSpec::new(g, f).with_storage(ScaleStorage::Swizzled128x4));
    let block = |outer, inner| ScaleGranularity::Block { outer, inner };
    // (A, B, A scale, B scale); D is bf16 except for the unscaled wide formats.
    let (a, b, a_scale, b_scale) = match scheme {
        "bf16" | "f16" | "f32" => {
            let f = Format::from_name(scheme).expect("a format name");
            return GemmProblem::row_major(m, n, k, f, f, f);
        }
        "fp8-tensor" => {
            (E4m3fn, E4m3fn, spec(ScaleGranularity::Tensor, F32), spec(ScaleGranularity::Tensor, F32))
        }
        "fp8-rowwise" => {
            (E4m3fn, E4m3fn, spec(ScaleGranularity::PerOuter, F32), spec(ScaleGranularity::PerOuter, F32))
        }
        "fp8-fnuz-rowwise" => {
            (E4m3fnuz, E4m3fnuz, spec(ScaleGranularity::PerOuter, F32), spec(ScaleGranularity::PerOuter, F32))
        }
        "fp8-e5m2-tensor" => {
            (E5m2, E4m3fn, spec(ScaleGranularity::Tensor, F32), spec(ScaleGranularity::Tensor, F32))
        }
        // DeepSeek-V3 style: activation scales stored K-major ("column-major").
        "fp8-block128" => (
            E4m3fn,
            E4m3fn,
            Some(ScaleSpec::new(block(1, 128), F32).with_storage(ScaleStorage::InnerMajor)),
            spec(block(128, 128), F32),
        ),
        "fp8-block128-ue8m0" => (E4m3fn, E4m3fn, spec(block(1, 128), Ue8m0), spec(block(128, 128), Ue8m0)),
        "mxfp4" => {
            (E2m1, E2m1, swizzled(ScaleGranularity::Mx32, Ue8m0), swizzled(ScaleGranularity::Mx32, Ue8m0))
        }
        "mxfp8" => {
            (E4m3fn, E4m3fn, swizzled(ScaleGranularity::Mx32, Ue8m0), swizzled(ScaleGranularity::Mx32, Ue8m0))
        }
        "nvfp4" => {
            (E2m1, E2m1, swizzled(ScaleGranularity::Nvfp4, Ue4m3), swizzled(ScaleGranularity::Nvfp4, Ue4m3))
        }
        "int8-rowwise" => {
            (Int8, Int8, spec(ScaleGranularity::PerOuter, F32), spec(ScaleGranularity::PerOuter, F32))
        }
        "w4a16-int4" => (Bf16, Int4, None, spec(block(1, 32), Bf16)),
        other => unreachable!("unknown scheme {other}"),
    };
    let mut p = GemmProblem::row_major(m, n, k, a, b, Bf16);
    p.a_scale = a_scale;
    p.b_scale = b_scale;
    if scheme == "nvfp4" {
        // The per-tensor f32 second level: chosen by the quantizer (random_inputs).
        p.a_tensor_scale = Some(Scalar::Device { ptr: 0, format: F32 });
        p.b_tensor_scale = Some(Scalar::Device { ptr: 0, format: F32 });
    }
    p
}

const SCHEMES: &[&str] = &[
    "bf16",
    "f16",
    "f32",
    "fp8-tensor",
    "fp8-rowwise",
    "fp8-fnuz-rowwise",
    "fp8-e5m2-tensor",
    "fp8-block128",
    "fp8-block128-ue8m0",
    "mxfp4",
    "mxfp8",
    "nvfp4",
    "int8-rowwise",
    "w4a16-int4",
];

/// Tile-boundary M values around 56 and 128, plus 1 and a large odd M.
const M_VALUES: &[u64] = &[1, 7, 55, 56, 57, 127, 128, 129, 4097];

fn reference_cases(quick: bool) -> Vec<Case> {
    let mut cases = Vec::new();
    let ms: &[u64] = if quick { &[1, 57, 129] } else { M_VALUES };
    for scheme in SCHEMES {
        for &m in ms {
            // N and K not multiples of the 128-wide tiles; K a multiple of 32 for MX/NVFP4
            // blocks and even for packed 4-bit rows.
            let (n, k) = if m > 1000 { (192, 256) } else { (200, 320) };
            cases.push(Case {
                name: format!("{scheme} M={m} N={n} K={k}"),
                problem: scheme_problem(scheme, m, n, k),
            });
        }
    }
    // Layout variety on a few schemes: transposes, column-major storage, padded ld, batches,
    // C with beta, bias on both axes, ReLU, d_scale.
    for scheme in ["bf16", "fp8-rowwise", "fp8-block128", "mxfp4"] {
        let (m, n, k) = (57, 136, 256);
        let mut p = scheme_problem(scheme, m, n, k);
        p.trans_a = Transpose::T;
        // Stored A is K x M; packed 4-bit rows need an even leading dimension, so pad M's.
        p.a = MatrixLayout::packed(p.a.format, Order::RowMajor, k, m);
        p.a.ld = m + 1 + (m + 1) % 2;
        p.a.batch_stride = p.a.ld * k;
        p.b = MatrixLayout::packed(p.b.format, Order::ColMajor, k, n);
        p.b.ld = k + 32;
        p.b.batch_stride = p.b.ld * n;
        cases.push(Case { name: format!("{scheme} A^T, B col-major ld+32"), problem: p.clone() });

        let mut q = scheme_problem(scheme, m, n, k);
        q.trans_b = Transpose::T;
        q.b = MatrixLayout::packed(q.b.format, Order::RowMajor, n, k);
        q.d = MatrixLayout::packed(Format::Bf16, Order::ColMajor, m, n);
        q.batch = 3;
        q.a.batch_stride = m * k;
        q.d.batch_stride = m * n;
        q.c = Some(MatrixLayout {
            batch_stride: m * n,
            ..MatrixLayout::packed(Format::Bf16, Order::RowMajor, m, n)
        });
        q.beta = Scalar::Host(0.5);
        q.alpha = Scalar::Host(1.25);
        q.epilogue = Epilogue {
            bias: Some(Bias { format: Format::Bf16, axis: BiasAxis::Cols }),
            activation: quantshadow_runtime::problem::Activation::Relu,
        };
        cases.push(Case {
            name: format!("{scheme} B^T, batch 3 shared B, C beta, bias, relu, D col-major"),
            problem: q,
        });
    }
    cases
}

// ---------------------------------------------------------------------------------------------
// GPU

const GPU_SECTIONS: &[&str] =
    &["helpers", "reference", "compare", "logits", "sketch", "detached", "early", "inject", "ring"];

fn gpu_selftest(checker: &GpuChecker, quick: bool, only: &[String]) -> Vec<Outcome> {
    let run = |section: &str| only.is_empty() || only.iter().any(|o| o == section);
    let mut out = Vec::new();
    if let Some(bad) = only.iter().find(|o| !GPU_SECTIONS.contains(&o.as_str())) {
        out.push(outcome(
            "selftest",
            format!("--only {bad}"),
            false,
            format!("unknown section; one of {}", GPU_SECTIONS.join(", ")),
        ));
        return out;
    }
    if run("helpers") {
        out.extend(gpu_helpers(checker));
    }
    if run("reference") {
        for case in reference_cases(quick) {
            out.extend(gpu_reference_case(checker, &case));
        }
    }
    if run("compare") {
        out.extend(gpu_compare(checker));
    }
    if run("logits") {
        out.extend(gpu_compare_logits(checker));
    }
    if run("sketch") {
        out.extend(gpu_sketch(checker, quick));
    }
    if run("detached") {
        out.extend(gpu_sketch_detached(checker));
        out.extend(gpu_sketch_split(checker));
    }
    if run("early") {
        out.extend(gpu_early_start(checker));
    }
    if run("inject") {
        out.extend(gpu_inject(checker));
    }
    if run("ring") {
        // 3 slots: every claim near full (compare-and-swap); 2048: the first 1024 unread take
        // the one-add claim (qs_ring_claim's margin), the rest compare-and-swap up to full.
        for (capacity, launches) in [(3u32, 5u64), (2048, 2100)] {
            out.push(
                gpu_ring_full(checker, capacity, launches)
                    .unwrap_or_else(|e| error_outcome("ring", format!("full ring of {capacity}"), e)),
            );
        }
        out.push(
            gpu_ring_concurrent(checker)
                .unwrap_or_else(|e| error_outcome("ring", "claims from 8 streams", e)),
        );
    }
    out
}

/// A compare the ring tests launch again and again: a 57 x 300 bf16 D (the reference times
/// `gain`, so the metrics are not trivial) against its f32 reference, and the host's metrics of
/// that pair, which every slot must report.
struct RingProbe {
    problem: GemmProblem,
    m: u64,
    n: u64,
    d: DeviceBuffer,
    reference: DeviceBuffer,
    host: Metrics,
}

impl RingProbe {
    fn new(checker: &GpuChecker, gain: f64) -> Result<RingProbe, String> {
        let (m, n) = (57u64, 300u64);
        let problem = scheme_problem("bf16", m, n, 64);
        let mut rng = quantshadow_runtime::rng::SplitMix64::new(99);
        let reference: Vec<f64> = (0..m * n).map(|_| rng.uniform(-1.0, 1.0)).collect();
        let mut d = vec![0u8; problem.d.format.bytes_for((m * n) as usize)];
        for (e, v) in reference.iter().enumerate() {
            problem.d.format.store_code(&mut d, e, problem.d.format.encode(gain * v));
        }
        let prod = decode_output(&problem, &d).map_err(|e| e.to_string())?.values;
        let ref_host: Vec<f64> = reference.iter().map(|v| *v as f32 as f64).collect();
        let host = compare_matrix(&prod, &ref_host, m as usize, n as usize);
        let d = checker.upload(&d).map_err(|e| e.to_string())?;
        let ref_f32: Vec<u8> = reference.iter().flat_map(|v| (*v as f32).to_le_bytes()).collect();
        let reference = checker.upload(&ref_f32).map_err(|e| e.to_string())?;
        Ok(RingProbe { problem, m, n, d, reference, host })
    }

    fn request(&self, tag: u64) -> CompareRequest {
        let (m, n) = (self.m, self.n);
        CompareRequest {
            d: QsMatrixDesc::new(&self.problem.d, self.d.ptr, Transpose::N, m, n, 1),
            m,
            n,
            rows: QsRowSel::all(m),
            reference: self.reference.ptr,
            ref_ld: n,
            logits_topk: None,
            kind: abi::CHECK_FULL,
            tag: (tag, 0),
        }
    }

    /// Whether a slot is whole and reports the host's metrics.
    fn right(&self, slot: &abi::QsResultSlot) -> bool {
        metrics_agree("ring", "slot", &sketch::slot_metrics(slot), &self.host).pass
    }
}

/// The result ring's protocol on the device: a full ring drops (and counts) results instead
/// of overwriting unread ones, and once the host has read them the device learns so and writes
/// again (its copy of `consumed` is refreshed across the bus only when it says "full"). Every
/// slot taken must be whole: the tag the launch gave and the metrics of the data.
fn gpu_ring_full(checker: &GpuChecker, capacity: u32, launches: u64) -> Result<Outcome, String> {
    let probe = RingProbe::new(checker, 1.01)?;
    let launch =
        |tag: u64| checker.compare(&probe.request(tag), Stream::default()).map_err(|e| e.to_string());
    let small = checker.replace_ring(capacity).map_err(|e| e.to_string())?;
    /// Tags taken while full, drops then, tags taken after, drops after, every slot right.
    type RingRun = (Vec<u64>, u64, Vec<u64>, u64, bool);
    let result = (|| -> Result<RingRun, String> {
        for tag in 1..=launches {
            launch(tag)?;
        }
        let mut whole = true;
        let mut take = |ring: &mut quantshadow_runtime::device::gpu::ResultRing| {
            let mut tags = vec![];
            while let Some(slot) = ring.poll() {
                whole &= probe.right(&slot);
                tags.push(slot.tag);
            }
            (tags, ring.dropped())
        };
        let (first, dropped_full) = checker.with_ring(&mut take);
        launch(launches + 1)?;
        launch(launches + 2)?;
        let (second, dropped_after) = checker.with_ring(&mut take);
        Ok((first, dropped_full, second, dropped_after, whole))
    })();
    // The small ring goes (nothing is running: compare synchronises).
    drop(checker.replace_ring_with(small));
    let (first, dropped_full, second, dropped_after, whole) = result?;
    let cap = capacity as u64;
    let want_first: Vec<u64> = (1..=cap.min(launches)).collect();
    let want_dropped = launches.saturating_sub(cap);
    let want_second = [launches + 1, launches + 2];
    let pass = first == want_first
        && dropped_full == want_dropped
        && second == want_second
        && dropped_after == want_dropped
        && whole;
    let show = |t: &[u64]| match t {
        [] => "none".to_string(),
        [one] => format!("[{one}]"),
        [a, .., z] if t.len() > 4 => format!("{} tags {a}..={z}", t.len()),
        t => format!("{t:?}"),
    };
    Ok(outcome(
        "ring",
        format!("capacity {capacity}: {launches} launches unread, then 2 more"),
        pass,
        format!(
            "taken {}, dropped {dropped_full}; then taken {}, dropped {dropped_after}; every slot whole and right: \
             {whole} (want {}, {want_dropped}, {:?}, {want_dropped}, true)",
            show(&first),
            show(&second),
            show(&want_first),
            want_second
        ),
    ))
}

/// Claims from several streams at once on a ring of the shim's size (4096 slots: the one-add
/// claim of `qs_ring_claim`): 8 streams, 32 compares each, launched without waiting. Every
/// launch's result must arrive exactly once, whole and right, and none be dropped.
fn gpu_ring_concurrent(checker: &GpuChecker) -> Result<Outcome, String> {
    const STREAMS: u64 = 8;
    const ROUNDS: u64 = 32;
    let es = |e: &dyn std::fmt::Display| e.to_string();
    let probe = RingProbe::new(checker, 0.99)?;
    let streams: Vec<Stream> = (0..STREAMS)
        .map(|_| checker.runtime().create_side_stream())
        .collect::<Result<_, _>>()
        .map_err(|e| es(&e))?;
    // One scratch per stream: a stream's compares run one after another, the streams' side by side.
    let scratch: Vec<_> = (0..STREAMS)
        .map(|_| checker.compare_scratch(probe.m, probe.n, false))
        .collect::<Result<_, _>>()
        .map_err(|e| es(&e))?;
    let before = checker.replace_ring(4096).map_err(|e| es(&e))?;
    type Run = (Vec<u64>, u64, bool);
    let result = (|| -> Result<Run, String> {
        for round in 0..ROUNDS {
            for (s, stream) in streams.iter().enumerate() {
                let tag = 1 + round * STREAMS + s as u64;
                let launch = checker.prepare_compare(&probe.request(tag), &scratch[s]).map_err(|e| es(&e))?;
                checker.launch_prepared(&launch, *stream).map_err(|e| es(&e))?;
            }
        }
        for stream in &streams {
            checker.runtime().synchronize(*stream).map_err(|e| es(&e))?;
        }
        let mut whole = true;
        let tags = checker.with_ring(|ring| {
            let mut tags = vec![];
            while let Some(slot) = ring.poll() {
                whole &= probe.right(&slot);
                tags.push(slot.tag);
            }
            (tags, ring.dropped())
        });
        Ok((tags.0, tags.1, whole))
    })();
    // Nothing may still write the temporary ring or the scratch when they go (error paths).
    for stream in &streams {
        let _ = checker.runtime().synchronize(*stream);
    }
    drop(checker.replace_ring_with(before));
    let (mut tags, dropped, whole) = result?;
    let received = tags.len();
    tags.sort_unstable();
    tags.dedup();
    let want = STREAMS * ROUNDS;
    let pass = received as u64 == want && tags == (1..=want).collect::<Vec<_>>() && dropped == 0 && whole;
    Ok(outcome(
        "ring",
        format!("claims from {STREAMS} streams at once, {want} compares, 4096 slots"),
        pass,
        format!(
            "{received} results, {} distinct tags of 1..={want}, {dropped} dropped, every slot whole and right: {whole}",
            tags.len()
        ),
    ))
}

/// Fault-injection kernels (`qs_inject.cu`) against the host transforms (`inject`): the same
/// bytes, for every output class and D format, and for the scale rewrites.
fn gpu_inject(checker: &GpuChecker) -> Vec<Outcome> {
    use quantshadow_runtime::inject::{self, FaultClass, Operand, ScaleRewrite};
    use quantshadow_runtime::problem::{MatrixLayout, Order};
    let mut out = Vec::new();
    let status = match checker.alloc_zeroed(4) {
        Ok(b) => b,
        Err(e) => return vec![error_outcome("inject", "status word", e)],
    };
    let output_classes = [
        FaultClass::Garbage,
        FaultClass::FnAsFnuz,
        FaultClass::TileRows,
        FaultClass::Nan,
        FaultClass::ZeroAfterFirst,
    ];
    for d_fmt in [Format::F32, Format::F16, Format::Bf16] {
        for m in [1u64, 57, 64] {
            let mut problem = scheme_problem("bf16", m, 300, 64);
            problem.d = MatrixLayout::packed(d_fmt, Order::RowMajor, m, 300);
            for class in output_classes {
                let case = format!("{} {d_fmt} M={m}", class.name());
                let run = || -> Result<Option<Outcome>, String> {
                    let n = (m * 300) as usize;
                    let mut rng = SplitMix64::new(0x1e7 + m);
                    let mut d = vec![0u8; d_fmt.bytes_for(n)];
                    for i in 0..n {
                        d_fmt.store_code(&mut d, i, d_fmt.encode(rng.normal()));
                    }
                    let seed = 0xfa017 + m;
                    let mut host = d.clone();
                    if inject::apply_output_fault(&problem, class, &mut host, seed).is_err() {
                        return Ok(None); // not applicable (tile-rows below M 56): nothing to compare
                    }
                    let buf = checker.upload(&d).map_err(|e| e.to_string())?;
                    let params = abi::QsInjectParams::output(&problem, class, buf.ptr, seed, status.ptr)
                        .map_err(|e| e.to_string())?;
                    let cfg = abi::inject_output_launch(&params).map_err(|e| e.to_string())?;
                    let entry = format!("qs_inject_output_{}", d_fmt.name());
                    let run =
                        InjectRun { d_format: d_fmt, entry: &entry, cfg, params, out: &buf, expected: &host };
                    run.compare(checker, &case).map(Some)
                };
                match run() {
                    Ok(Some(o)) => out.push(o),
                    Ok(None) => {}
                    Err(e) => out.push(error_outcome("inject", case, e)),
                }
            }
        }
    }
    let scale_classes = [
        (FaultClass::ScaleTranspose, ScaleRewrite::Transposed),
        (FaultClass::ScaleIgnore, ScaleRewrite::Ones),
    ];
    for (class, rewrite) in scale_classes {
        let case = format!("{} fp8-block128 A scales", class.name());
        let run = || -> Result<Outcome, String> {
            let problem = scheme_problem("fp8-block128", 200, 256, 512);
            let inputs = random_inputs(&problem, 0x5ca1e).map_err(|e| e.to_string())?;
            let src = inputs.a_scale.as_ref().ok_or("no A scales")?;
            let host =
                inject::prepare_scale_fault(&problem, class, Operand::A, src).map_err(|e| e.to_string())?;
            let src_buf = checker.upload(src).map_err(|e| e.to_string())?;
            let dst_buf = checker.alloc_zeroed(host.len().max(src.len())).map_err(|e| e.to_string())?;
            let params = abi::QsInjectParams::scale(
                &problem,
                Operand::A,
                rewrite,
                src_buf.ptr,
                dst_buf.ptr,
                status.ptr,
            )
            .map_err(|e| e.to_string())?;
            let cfg = abi::inject_scale_launch(&params).map_err(|e| e.to_string())?;
            let run = InjectRun {
                d_format: problem.d.format,
                entry: "qs_inject_scale",
                cfg,
                params,
                out: &dst_buf,
                expected: &host,
            };
            run.compare(checker, &case)
        };
        out.push(run().unwrap_or_else(|e| error_outcome("inject", case, e)));
    }
    out.extend(gpu_inject_permute(checker));
    out
}

/// `no-transpose`: `qs_inject_permute` against `inject::prepare_transpose_fault`, the
/// destination starting as the original bytes (it is the caller's buffer in the shim), so ld
/// padding must come through untouched too.
fn gpu_inject_permute(checker: &GpuChecker) -> Vec<Outcome> {
    use quantshadow_runtime::inject::{self, Operand};
    let mut cases: Vec<(String, GemmProblem, Operand)> = vec![];
    for f in [Format::Bf16, Format::E4m3fn, Format::F32] {
        // Square A stored transposed (K x M), flipped to as-stored.
        let mut p = GemmProblem::row_major(96, 40, 96, f, f, Format::Bf16);
        p.trans_a = Transpose::T;
        cases.push((format!("{f} A 96x96 transposed"), p, Operand::A));
        // Square B, nn.Linear style (N x K stored, transposed).
        let mut p = GemmProblem::row_major(33, 128, 128, f, f, Format::Bf16);
        p.trans_b = Transpose::T;
        cases.push((format!("{f} B 128x128 transposed"), p, Operand::B));
    }
    for f in [Format::Bf16, Format::E4m3fn] {
        // Square A as stored, with ld padding.
        let mut p = GemmProblem::row_major(64, 24, 64, f, f, Format::Bf16);
        p.a.ld = 80;
        p.a.batch_stride = 64 * 80;
        cases.push((format!("{f} A 64x64 ld 80"), p, Operand::A));
        // Batched: three items apart by more than one matrix, column-major B.
        let mut p = GemmProblem::row_major(48, 48, 48, f, f, Format::Bf16);
        p.batch = 3;
        p.a.batch_stride = 48 * 48 + 64;
        p.b = MatrixLayout::packed(f, Order::ColMajor, 48, 48);
        p.b.batch_stride = 48 * 48 + 32;
        p.d.batch_stride = 48 * 48;
        cases.push((format!("{f} batch 3 A 48x48"), p.clone(), Operand::A));
        cases.push((format!("{f} batch 3 B 48x48 column-major"), p, Operand::B));
    }
    let mut out = vec![];
    for (name, problem, operand) in cases {
        let case = format!("no-transpose {name}");
        let run = || -> Result<Outcome, String> {
            let flipped = inject::flip_transpose(&problem, operand)?;
            let (layout, (rows, cols)) = match operand {
                Operand::A => (problem.a, problem.a_stored_dims()),
                Operand::B => (problem.b, problem.b_stored_dims()),
            };
            let f = layout.format;
            let elements = layout.required_elements(rows, cols, problem.batch) as usize;
            let mut rng = SplitMix64::new(elements as u64 ^ 0x9e3);
            let mut src = vec![0u8; f.bytes_for(elements)];
            for i in 0..elements {
                f.store_code(&mut src, i, f.encode(rng.normal()));
            }
            let host = inject::prepare_transpose_fault(&problem, operand, &flipped, &src)
                .map_err(|e| e.to_string())?;
            if host == src {
                return Err("the host rewrite changed nothing (case too symmetric)".into());
            }
            let saved = checker.upload(&src).map_err(|e| e.to_string())?;
            let target = checker.upload(&src).map_err(|e| e.to_string())?;
            let params =
                abi::QsPermuteParams::transpose_fault(&problem, operand, &flipped, saved.ptr, target.ptr, 0)
                    .map_err(|e| e.to_string())?;
            let cfg = abi::inject_permute_launch(&params).map_err(|e| e.to_string())?;
            let run = InjectRun {
                d_format: problem.d.format,
                entry: "qs_inject_permute",
                cfg,
                params,
                out: &target,
                expected: &host,
            };
            run.compare(checker, &case)
        };
        out.push(run().unwrap_or_else(|e| error_outcome("inject", case, e)));
    }
    out
}

/// One inject kernel launch whose output buffer must hold the host transform's bytes.
struct InjectRun<'a, P: abi::KernelParams> {
    d_format: Format,
    entry: &'a str,
    cfg: abi::LaunchConfig,
    params: P,
    out: &'a DeviceBuffer,
    expected: &'a [u8],
}

impl<P: abi::KernelParams> InjectRun<'_, P> {
    fn compare(&self, checker: &GpuChecker, case: &str) -> Result<Outcome, String> {
        let build = KernelBuild::inject(self.d_format).map_err(|e| e.to_string())?;
        checker
            .launch(&build, self.entry, &self.cfg, &self.params, Stream::default())
            .map_err(|e| e.to_string())?;
        checker.runtime().synchronize(Stream::default()).map_err(|e| e.to_string())?;
        let device = self.out.read().map_err(|e| e.to_string())?;
        let n = self.expected.len();
        let diff = device.get(..n).map_or(n, |d| d.iter().zip(self.expected).filter(|(a, b)| a != b).count());
        Ok(outcome("inject device=host", case, diff == 0, format!("{diff} bytes differ of {n}")))
    }
}

fn upload_inputs(
    checker: &GpuChecker,
    problem: &GemmProblem,
    inputs: &HostInputs,
) -> Result<(Vec<DeviceBuffer>, GemmBuffers), DeviceError> {
    let mut keep = Vec::new();
    let mut up = |data: Option<&Vec<u8>>| -> Result<u64, DeviceError> {
        match data {
            None => Ok(0),
            Some(d) => {
                let b = checker.upload(d)?;
                let p = b.ptr;
                keep.push(b);
                Ok(p)
            }
        }
    };
    let a = up(Some(&inputs.a))?;
    let b = up(Some(&inputs.b))?;
    let c = up(inputs.c.as_ref())?;
    let a_scale = up(inputs.a_scale.as_ref())?;
    let b_scale = up(inputs.b_scale.as_ref())?;
    let bias = up(inputs.bias.as_ref())?;
    let d_bytes =
        problem.d.format.bytes_for(problem.d.required_elements(problem.m, problem.n, problem.batch) as usize);
    let d = checker.alloc_zeroed(d_bytes)?;
    let d_ptr = d.ptr;
    keep.push(d);
    Ok((keep, GemmBuffers { a, b, c, d: d_ptr, a_scale, b_scale, bias, amax_d: 0 }))
}

/// NVFP4 tensor scales chosen by the quantizer become host values of the problem.
fn with_tensor_scales(mut p: GemmProblem, inputs: &HostInputs) -> GemmProblem {
    if let Some(v) = inputs.device_scalars.a_tensor_scale {
        p.a_tensor_scale = Some(Scalar::Host(v));
    }
    if let Some(v) = inputs.device_scalars.b_tensor_scale {
        p.b_tensor_scale = Some(Scalar::Host(v));
    }
    p
}

fn read_f32(buf: &DeviceBuffer) -> Result<Vec<f64>, DeviceError> {
    Ok(buf.read()?.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64).collect())
}

fn nmse_and_nan(device: &[f64], oracle: &[f64]) -> (f64, u64) {
    let sums = MetricSums::from_pairs(device, oracle);
    (sums.finish().nmse, sums.nan_prod + sums.inf_prod + sums.nan_ref + sums.inf_ref)
}

const REFERENCE_NMSE_MAX: f64 = 1e-9;

fn gpu_reference_case(checker: &GpuChecker, case: &Case) -> Vec<Outcome> {
    let seed = hash3(0x5e1f, case.name.len() as u64, case.problem.m);
    let run = || -> Result<Vec<Outcome>, String> {
        let inputs = random_inputs(&case.problem, seed).map_err(|e| e.to_string())?;
        let problem = with_tensor_scales(case.problem.clone(), &inputs);
        let (_keep, bufs) = upload_inputs(checker, &problem, &inputs).map_err(|e| e.to_string())?;
        let g = QsGemmDesc::from_problem(&problem, &bufs).map_err(|e| e.to_string())?;
        let total_rows = problem.batch * problem.m;
        let out = checker.alloc((total_rows * problem.n) as usize * 4).map_err(|e| e.to_string())?;
        let started = Instant::now();
        checker.reference(&g, None, &out, problem.n, false, Stream::default()).map_err(|e| e.to_string())?;
        checker.runtime().synchronize(Stream::default()).map_err(|e| e.to_string())?;
        let device_ms = started.elapsed().as_secs_f64() * 1e3;
        let gpu = read_f32(&out).map_err(|e| e.to_string())?;
        let unrounded = OracleOptions { round_output: false, rows: None };
        let oracle = reference_gemm(&problem, &inputs, &unrounded).map_err(|e| e.to_string())?;
        let (nmse, nonfinite) = nmse_and_nan(&gpu, &oracle.values);
        let full = outcome(
            "reference full",
            &case.name,
            nmse <= REFERENCE_NMSE_MAX && nonfinite == 0,
            format!("NMSE {nmse:.2e}, non-finite {nonfinite}, {device_ms:.2} ms"),
        );
        // Rows mode: a seeded subset of global rows, in a scrambled order.
        let mut rng = SplitMix64::new(seed ^ 0x70);
        let count = total_rows.min(37);
        let rows: Vec<u64> = (0..count).map(|_| rng.below(total_rows)).collect();
        let list: Vec<u8> = rows.iter().flat_map(|r| r.to_le_bytes()).collect();
        let list_buf = checker.upload(&list).map_err(|e| e.to_string())?;
        let rows_out = checker.alloc((count * problem.n) as usize * 4).map_err(|e| e.to_string())?;
        checker
            .reference(&g, Some((&list_buf, count)), &rows_out, problem.n, false, Stream::default())
            .map_err(|e| e.to_string())?;
        checker.runtime().synchronize(Stream::default()).map_err(|e| e.to_string())?;
        let gpu_rows = read_f32(&rows_out).map_err(|e| e.to_string())?;
        let n = problem.n as usize;
        let expect: Vec<f64> =
            rows.iter().flat_map(|&r| oracle.values[r as usize * n..(r as usize + 1) * n].to_vec()).collect();
        let (rows_nmse, rows_nonfinite) = nmse_and_nan(&gpu_rows, &expect);
        let rows_outcome = outcome(
            "reference rows",
            &case.name,
            rows_nmse <= REFERENCE_NMSE_MAX && rows_nonfinite == 0,
            format!("{count} rows, NMSE {rows_nmse:.2e}, non-finite {rows_nonfinite}"),
        );
        Ok(vec![full, rows_outcome])
    };
    run().unwrap_or_else(|e| vec![error_outcome("reference", &case.name, e)])
}

/// Device decoders, encoders, hashes and scale entries, bit for bit against the host.
fn gpu_helpers(checker: &GpuChecker) -> Vec<Outcome> {
    let mut out = Vec::new();
    let build = KernelBuild::selftest();
    let launch = |entry: &str, params: &QsSelftestParams| -> Result<(), DeviceError> {
        let blocks = params.n.div_ceil(256).clamp(1, 4096);
        let cfg = abi::LaunchConfig { grid: [blocks as u32, 1, 1], block: [256, 1, 1], shared_bytes: 0 };
        checker.launch(&build, entry, &cfg, params, Stream::default())?;
        checker.runtime().synchronize(Stream::default())
    };
    let blank = |n: u64| QsSelftestParams { n, ..Default::default() };
    for format in Format::ALL {
        let codes: Vec<u32> = match format.bits() {
            32 => {
                let mut rng = SplitMix64::new(format as u64);
                (0..65536)
                    .map(|_| rng.next_u64() as u32)
                    .chain([0, 0x8000_0000, 0x7f80_0000, 0xff80_0000, 0x7fc0_0000, 1])
                    .collect()
            }
            bits => (0..1u32 << bits).collect(),
        };
        let result = (|| -> Result<(usize, String), DeviceError> {
            let input = checker.upload(&codes.iter().flat_map(|c| c.to_le_bytes()).collect::<Vec<_>>())?;
            let output = checker.alloc(codes.len() * 16)?;
            let params = QsSelftestParams {
                in_ptr: input.ptr,
                out_ptr: output.ptr,
                format: format as u32,
                ..blank(codes.len() as u64)
            };
            launch("qs_selftest_decode", &params)?;
            let values: Vec<f64> =
                output.read()?.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect();
            let mut mismatches = 0usize;
            let mut first = String::new();
            for (i, code) in codes.iter().enumerate() {
                let host = format.decode_code(*code);
                let device = values[2 * i];
                let same = host.to_bits() == device.to_bits() || (host.is_nan() && device.is_nan());
                if !same {
                    mismatches += 1;
                    if first.is_empty() {
                        first = format!("code {code:#x}: host {host} device {device}");
                    }
                }
            }
            Ok((mismatches, first))
        })();
        out.push(match result {
            Ok((0, _)) => outcome(
                "helpers",
                format!("decode {format}"),
                true,
                format!("{} codes bit-exact", codes.len()),
            ),
            Ok((n, first)) => outcome(
                "helpers",
                format!("decode {format}"),
                false,
                format!("{n} mismatches, first {first}"),
            ),
            Err(e) => error_outcome("helpers", format!("decode {format}"), e),
        });
    }
    // Encoders used to round the reference to D's format.
    for format in
        [Format::Bf16, Format::F16, Format::E4m3fn, Format::E4m3fnuz, Format::E5m2, Format::E5m2fnuz]
    {
        let mut rng = SplitMix64::new(0xe0c0 + format as u64);
        let max = format.max_finite();
        let values: Vec<f64> = (0..20000)
            .map(|i| match i % 4 {
                0 => rng.uniform(-1.2 * max, 1.2 * max),
                1 => rng.normal(),
                2 => rng.normal() * 1e-3,
                _ => format.decode_code((rng.next_u64() as u32) & ((1 << format.bits()) - 1)),
            })
            .filter(|v| v.is_finite())
            .collect();
        let result = (|| -> Result<(usize, String), DeviceError> {
            let input = checker.upload(&values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>())?;
            let output = checker.alloc(values.len() * 4)?;
            let params = QsSelftestParams {
                in_ptr: input.ptr,
                out_ptr: output.ptr,
                format: format as u32,
                ..blank(values.len() as u64)
            };
            launch("qs_selftest_encode", &params)?;
            let codes: Vec<u32> =
                output.read()?.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
            let bad: Vec<(f64, u32)> = values
                .iter()
                .zip(&codes)
                .filter(|(v, c)| format.encode(**v) != **c)
                .map(|(v, c)| (*v, *c))
                .collect();
            let first = bad
                .first()
                .map(|(v, c)| format!(", first {v:e}: host {:#x} device {c:#x}", format.encode(*v)))
                .unwrap_or_default();
            Ok((bad.len(), first))
        })();
        out.push(match result {
            Ok((0, _)) => outcome(
                "helpers",
                format!("encode {format}"),
                true,
                format!("{} values identical", values.len()),
            ),
            Ok((n, first)) => outcome(
                "helpers",
                format!("encode {format}"),
                false,
                format!("{n} of {} differ{first}", values.len()),
            ),
            Err(e) => error_outcome("helpers", format!("encode {format}"), e),
        });
    }
    // Hashes, probe signs and the row permutation.
    let (seed, stream, total, stride, epoch) = (0x1234_5678_9abc_def0u64, 5u64, 4097u64, 256u64, 3u64);
    let perm = RowPermutation::new(seed, total);
    let result = (|| -> Result<usize, DeviceError> {
        let xs: Vec<u64> = (0..total).collect();
        let input = checker.upload(&xs.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<_>>())?;
        let output = checker.alloc(xs.len() * 24)?;
        let params = QsSelftestParams {
            in_ptr: input.ptr,
            out_ptr: output.ptr,
            seed,
            stream,
            perm_a: perm.a,
            perm_b: perm.b,
            total,
            stride,
            epoch,
            ..blank(xs.len() as u64)
        };
        launch("qs_selftest_hash", &params)?;
        let got: Vec<u64> =
            output.read()?.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect();
        Ok(xs
            .iter()
            .enumerate()
            .filter(|(i, &x)| {
                got[3 * i] != hash3(seed, stream, x)
                    || (got[3 * i + 1] != 0) != sketch::probe_negative(seed, stream as u32, x)
                    || got[3 * i + 2] != perm.sample_row(stride, epoch, x)
            })
            .count())
    })();
    out.push(match result {
        Ok(0) => outcome(
            "helpers",
            "hash3, probe signs, row permutation",
            true,
            format!("{total} indices identical"),
        ),
        Ok(n) => {
            outcome("helpers", "hash3, probe signs, row permutation", false, format!("{n} indices differ"))
        }
        Err(e) => error_outcome("helpers", "hash3, probe signs, row permutation", e),
    });
    // Eager windows (QS_ROWS_WINDOW, start computed on the host) against the permutation, from
    // a few rows to the largest count the window takes (products a x near 2^64).
    // The device's rows of positions 0..count of a window selection, ~0 where refused.
    let window_rows = |sel: &QsRowSel| -> Result<Vec<u64>, DeviceError> {
        let ts: Vec<u64> = (0..sel.count).collect();
        let input = checker.upload(&ts.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<_>>())?;
        let output = checker.alloc(ts.len() * 8)?;
        let params = QsSelftestParams {
            in_ptr: input.ptr,
            out_ptr: output.ptr,
            perm_a: sel.perm_a,
            perm_b: sel.perm_b,
            total: sel.total_rows,
            stride: sel.stride,
            epoch: sel.epoch_value,
            ..blank(ts.len() as u64)
        };
        launch("qs_selftest_window", &params)?;
        Ok(output.read()?.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect())
    };
    let result = (|| -> Result<(usize, usize), DeviceError> {
        let (mut wrong, mut rows) = (0, 0);
        for (total, seed, epoch) in [
            (2u64, 3u64, 1u64),
            (257, 5, 7),
            (4097, seed, 3),
            (1 << 20, 11, 12345),
            (4_294_967_291, 13, u64::MAX / 3),
            (u32::MAX as u64, 17, 1 << 40),
        ] {
            let sample = sketch::RowSample::new(seed, total, 256.min(total - 1));
            let sel = QsRowSel::eager(&sample, epoch);
            if sel.mode != abi::ROWS_WINDOW {
                return Err(DeviceError::Unsupported(format!(
                    "{total} rows: mode {} (want a window)",
                    sel.mode
                )));
            }
            let got = window_rows(&sel)?;
            wrong += got.iter().enumerate().filter(|&(t, &row)| row != sample.row(epoch, t as u64)).count();
            rows += got.len();
        }
        // A corrupt window (its start past the rows) is refused row by row, never misread.
        let sample = sketch::RowSample::new(5, 257, 64);
        let got = window_rows(&QsRowSel { stride: 257, ..QsRowSel::eager(&sample, 0) })?;
        wrong += got.iter().filter(|&&row| row != u64::MAX).count();
        rows += got.len();
        Ok((wrong, rows))
    })();
    out.push(match result {
        Ok((0, rows)) => outcome(
            "helpers",
            "eager row windows",
            true,
            format!("{rows} rows identical (6 row counts; a corrupt window's 64 refused)"),
        ),
        Ok((n, rows)) => outcome("helpers", "eager row windows", false, format!("{n} of {rows} rows differ")),
        Err(e) => error_outcome("helpers", "eager row windows", e),
    });
    // Scale entries for every storage, against problem.rs.
    for (name, spec, outer, inner, batch) in [
        (
            "outer-major ld+3",
            ScaleSpec {
                ld: 7,
                batch_stride: 0,
                ..ScaleSpec::new(ScaleGranularity::Block { outer: 1, inner: 128 }, Format::F32)
            },
            300u64,
            512u64,
            1u64,
        ),
        (
            "inner-major",
            ScaleSpec::new(ScaleGranularity::Block { outer: 128, inner: 128 }, Format::F32)
                .with_storage(ScaleStorage::InnerMajor),
            300,
            512,
            1,
        ),
        (
            "swizzled 128x4",
            ScaleSpec::new(ScaleGranularity::Mx32, Format::Ue8m0).with_storage(ScaleStorage::Swizzled128x4),
            300,
            512,
            1,
        ),
        (
            "per-outer batched",
            ScaleSpec { batch_stride: 301, ..ScaleSpec::new(ScaleGranularity::PerOuter, Format::F32) },
            300,
            512,
            3,
        ),
    ] {
        let result = (|| -> Result<usize, String> {
            let mut rng = SplitMix64::new(outer ^ inner);
            let triples: Vec<[u64; 3]> =
                (0..5000).map(|_| [rng.below(batch), rng.below(outer), rng.below(inner)]).collect();
            let input = checker
                .upload(&triples.iter().flatten().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>())
                .map_err(|e| e.to_string())?;
            let output = checker.alloc(triples.len() * 8).map_err(|e| e.to_string())?;
            let scale =
                QsScaleDesc::from_spec(&spec, 0x1000, outer, inner, batch).map_err(|e| e.to_string())?;
            let params = QsSelftestParams {
                in_ptr: input.ptr,
                out_ptr: output.ptr,
                scale,
                ..blank(triples.len() as u64)
            };
            launch("qs_selftest_scale_entry", &params).map_err(|e| e.to_string())?;
            let got: Vec<u64> = output
                .read()
                .map_err(|e| e.to_string())?
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
                .collect();
            Ok(triples
                .iter()
                .zip(&got)
                .filter(|(t, g)| spec.entry_for_element(t[0], t[1], t[2], outer, inner) != **g)
                .count())
        })();
        out.push(match result {
            Ok(0) => outcome("helpers", format!("scale entry {name}"), true, "5000 entries identical"),
            Ok(n) => outcome("helpers", format!("scale entry {name}"), false, format!("{n} of 5000 differ")),
            Err(e) => error_outcome("helpers", format!("scale entry {name}"), e),
        });
    }
    out
}

/// Compare kernel vs host metrics on planted errors (production uploaded as D).
fn gpu_compare(checker: &GpuChecker) -> Vec<Outcome> {
    let mut out = Vec::new();
    let (m, n, k) = (300u64, 1000u64, 256u64);
    let problem = scheme_problem("fp8-rowwise", m, n, k);
    let inputs = match random_inputs(&problem, 77) {
        Ok(i) => i,
        Err(e) => return vec![error_outcome("compare", "inputs", e)],
    };
    let reference =
        match reference_gemm(&problem, &inputs, &OracleOptions { round_output: false, rows: None }) {
            Ok(r) => r,
            Err(e) => return vec![error_outcome("compare", "oracle", e)],
        };
    type Plant = Box<dyn Fn(usize, usize, f64) -> f64>;
    let plants: Vec<(&str, Plant)> = vec![
        ("honest (bf16 rounding only)", Box::new(|_, _, v| v)),
        ("2x magnitude", Box::new(|_, _, v| 2.0 * v)),
        ("row 211 negated", Box::new(|i, _, v| if i == 211 { -v } else { v })),
        ("one NaN at (5, 7)", Box::new(|i, j, v| if (i, j) == (5, 7) { f64::NAN } else { v })),
    ];
    for (name, plant) in plants {
        let result = (|| -> Result<Outcome, String> {
            let mut d = vec![0u8; problem.d.format.bytes_for((m * n) as usize)];
            for i in 0..m as usize {
                for j in 0..n as usize {
                    let v = plant(i, j, reference.values[i * n as usize + j]);
                    problem.d.format.store_code(&mut d, i * n as usize + j, problem.d.format.encode(v));
                }
            }
            let prod = decode_output(&problem, &d).map_err(|e| e.to_string())?.values;
            let d_buf = checker.upload(&d).map_err(|e| e.to_string())?;
            let ref_f32: Vec<u8> = reference.values.iter().flat_map(|v| (*v as f32).to_le_bytes()).collect();
            let ref_buf = checker.upload(&ref_f32).map_err(|e| e.to_string())?;
            let ref_host: Vec<f64> = reference.values.iter().map(|v| *v as f32 as f64).collect();
            let host = compare_matrix(&prod, &ref_host, m as usize, n as usize);
            let d_desc = QsMatrixDesc::new(&problem.d, d_buf.ptr, Transpose::N, m, n, 1);
            let request = CompareRequest {
                d: d_desc,
                m,
                n,
                rows: QsRowSel::all(m),
                reference: ref_buf.ptr,
                ref_ld: n,
                logits_topk: None,
                kind: abi::CHECK_FULL,
                tag: (1, 2),
            };
            checker.compare(&request, Stream::default()).map_err(|e| e.to_string())?;
            let slot = checker.with_ring(|r| r.poll()).ok_or("no result slot arrived")?;
            let device = sketch::slot_metrics(&slot);
            Ok(metrics_agree("compare", name, &device, &host))
        })();
        out.push(result.unwrap_or_else(|e| error_outcome("compare", name, e)));
    }
    out
}

/// The logits compare (an LM head's rows): softmax KL, top-1 agreement and top-k overlap on
/// the device vs `metrics::compare_logits` per row on the host, aggregated as the slot is (KL
/// mean over rows, NaN when a row is non-finite; top-1 only when every row agrees; overlap mean).
fn gpu_compare_logits(checker: &GpuChecker) -> Vec<Outcome> {
    let (m, n, topk) = (24u64, 50_000u64, 5u32);
    let d_format = Format::Bf16;
    let mut rng = SplitMix64::new(4242);
    // Reference logits: a few strong tokens per row over a noisy floor, as an LM head gives.
    let reference: Vec<f64> = (0..m * n)
        .map(|t| {
            let g = quantshadow_runtime::rng::unit_f64(rng.next_u64()) * 2.0 - 1.0;
            if hash3(7, t / n, t % n).is_multiple_of(997) {
                8.0 + 4.0 * g
            } else {
                2.0 * g
            }
        })
        .collect();
    type Plant = Box<dyn Fn(usize, usize, f64, &[f64]) -> f64>;
    let plants: Vec<(&str, Plant)> = vec![
        ("honest (bf16 rounding only)", Box::new(|_, _, v, _| v)),
        (
            "row 7 logits shifted by one vocabulary id",
            Box::new(|i, j, v, row| if i == 7 { row[(j + 1) % row.len()] } else { v }),
        ),
        ("row 3 at temperature 0.5", Box::new(|i, _, v, _| if i == 3 { 2.0 * v } else { v })),
        ("one NaN in row 11", Box::new(|i, j, v, _| if (i, j) == (11, 123) { f64::NAN } else { v })),
    ];
    let mut out = Vec::new();
    for (name, plant) in plants {
        let result = (|| -> Result<Outcome, String> {
            let mut d = vec![0u8; d_format.bytes_for((m * n) as usize)];
            let mut prod = vec![0f64; (m * n) as usize];
            for i in 0..m as usize {
                let row = &reference[i * n as usize..(i + 1) * n as usize];
                for j in 0..n as usize {
                    let code = d_format.encode(plant(i, j, row[j], row));
                    d_format.store_code(&mut d, i * n as usize + j, code);
                    prod[i * n as usize + j] = d_format.decode_code(code);
                }
            }
            let ref_f32: Vec<u8> = reference.iter().flat_map(|v| (*v as f32).to_le_bytes()).collect();
            let ref_host: Vec<f64> = reference.iter().map(|v| *v as f32 as f64).collect();
            let rows: Vec<_> = (0..m as usize)
                .map(|i| {
                    let r = i * n as usize..(i + 1) * n as usize;
                    compare_logits(&prod[r.clone()], &ref_host[r], topk as usize)
                })
                .collect();
            let host_kl = if rows.iter().any(|r| r.kl.is_nan()) {
                f64::NAN
            } else {
                rows.iter().map(|r| r.kl).sum::<f64>() / m as f64
            };
            let host_top1 = rows.iter().all(|r| r.top1_agree);
            let host_overlap = rows.iter().map(|r| r.topk_overlap).sum::<f64>() / m as f64;
            let d_buf = checker.upload(&d).map_err(|e| e.to_string())?;
            let ref_buf = checker.upload(&ref_f32).map_err(|e| e.to_string())?;
            let layout = quantshadow_runtime::problem::MatrixLayout::packed(
                d_format,
                quantshadow_runtime::problem::Order::RowMajor,
                m,
                n,
            );
            let request = CompareRequest {
                d: QsMatrixDesc::new(&layout, d_buf.ptr, Transpose::N, m, n, 1),
                m,
                n,
                rows: QsRowSel::all(m),
                reference: ref_buf.ptr,
                ref_ld: n,
                logits_topk: Some(topk),
                kind: abi::CHECK_ROWS,
                tag: (3, 4),
            };
            checker.compare(&request, Stream::default()).map_err(|e| e.to_string())?;
            let slot = checker.with_ring(|r| r.poll()).ok_or("no result slot arrived")?;
            let dev = sketch::slot_logits(&slot).ok_or("the slot carries no logits metrics")?;
            let kl_ok = if host_kl.is_nan() {
                dev.kl.is_nan()
            } else {
                (dev.kl - host_kl).abs() <= 1e-6 + 1e-4 * host_kl.abs()
            };
            let ok = kl_ok && dev.top1_agree == host_top1 && (dev.topk_overlap - host_overlap).abs() < 1e-12;
            Ok(outcome(
                "compare",
                format!("logits: {name}"),
                ok,
                format!(
                    "device kl {:.6e} top1 {} overlap {:.4} | host kl {:.6e} top1 {} overlap {:.4}",
                    dev.kl, dev.top1_agree, dev.topk_overlap, host_kl, host_top1, host_overlap
                ),
            ))
        })();
        out.push(result.unwrap_or_else(|e| error_outcome("compare", format!("logits: {name}"), e)));
    }
    out
}

fn rel(a: f64, b: f64) -> f64 {
    if a == b {
        0.0
    } else {
        (a - b).abs() / b.abs().max(1e-300)
    }
}

fn metrics_agree(section: &'static str, name: &str, device: &Metrics, host: &Metrics) -> Outcome {
    let worst_same = device.worst_row.map(|w| w.index) == host.worst_row.map(|w| w.index);
    // Cosine near 1 is a small difference of large sums: agreement is judged in absolute
    // terms (1e-8, far below any threshold's resolution); NMSE is computed from the
    // difference itself and must agree closely in relative terms.
    let close = (device.cosine - host.cosine).abs() <= 1e-8
        && rel(device.nmse, host.nmse) <= 1e-6
        && rel(device.norm_ratio, host.norm_ratio) <= 1e-7
        && device.nan_prod == host.nan_prod
        && device.inf_prod == host.inf_prod;
    outcome(
        section,
        name,
        close && worst_same,
        format!(
            "device cos {:.9} nmse {:.6e} norm {:.9} worst {:?} nan {} | host cos {:.9} nmse {:.6e} norm {:.9} worst {:?} nan {}",
            device.cosine,
            device.nmse,
            device.norm_ratio,
            device.worst_row.map(|w| w.index),
            device.nan_prod,
            host.cosine,
            host.nmse,
            host.norm_ratio,
            host.worst_row.map(|w| w.index),
            host.nan_prod
        ),
    )
}

/// A sketch scenario: a problem, how production is broken, and what must hold.
struct SketchScenario {
    name: &'static str,
    scheme: &'static str,
    m: u64,
    /// Inner dimension K (N is 1024).
    k: u64,
    probes: u32,
    rows_per_call: u64,
    plant: Plant,
}

#[derive(Clone, Copy)]
enum Plant {
    /// Production = reference + relative Gaussian noise of this size (full rank).
    Noise(f64),
    /// One row of A's scale multiplied (low rank: one token wrong).
    ScaleRow { row: u64, factor: f64 },
    /// Production = factor x reference (magnitude bug).
    Magnitude(f64),
    /// One row of D replaced by another row (a single bad row).
    WrongRow(u64),
}

fn gpu_sketch(checker: &GpuChecker, quick: bool) -> Vec<Outcome> {
    let fp8_nmse = Thresholds::default().fp8.nmse_max;
    let mut scenarios = vec![
        SketchScenario {
            name: "full-rank noise k=8",
            scheme: "fp8-rowwise",
            m: 200,
            k: 512,
            probes: 8,
            rows_per_call: 256,
            plant: Plant::Noise(0.05),
        },
        SketchScenario {
            name: "one wrong scale row k=32",
            scheme: "fp8-rowwise",
            m: 200,
            k: 512,
            probes: 32,
            rows_per_call: 256,
            plant: Plant::ScaleRow { row: 17, factor: 3.0 },
        },
        SketchScenario {
            name: "10x above the FP8 NMSE bound",
            scheme: "fp8-block128",
            m: 256,
            k: 512,
            probes: 32,
            rows_per_call: 256,
            plant: Plant::Noise((10.0 * fp8_nmse).sqrt()),
        },
        SketchScenario {
            name: "10x below the FP8 NMSE bound",
            scheme: "fp8-block128",
            m: 256,
            k: 512,
            probes: 32,
            rows_per_call: 256,
            plant: Plant::Noise((0.1 * fp8_nmse).sqrt()),
        },
        SketchScenario {
            name: "2x magnitude (fn read as fnuz)",
            scheme: "fp8-tensor",
            m: 64,
            k: 512,
            probes: 8,
            rows_per_call: 256,
            plant: Plant::Magnitude(0.5),
        },
        SketchScenario {
            name: "one wrong row among 4097",
            scheme: "bf16",
            m: 4097,
            k: 512,
            probes: 32,
            rows_per_call: 256,
            plant: Plant::WrongRow(3001),
        },
    ];
    if quick {
        scenarios.truncate(3);
    }
    // Shapes for the lean kernel (CUDA sm_90+): a partial group of 32 rows with k = 16, the
    // fewest rows it takes (16), and K slices long enough for several load-then-mma iterations
    // per warp.
    scenarios.extend([
        SketchScenario {
            name: "fp8 tensor-wise, 57 rows, full-rank noise k=16",
            scheme: "fp8-tensor",
            m: 57,
            k: 512,
            probes: 16,
            rows_per_call: 256,
            plant: Plant::Noise(0.05),
        },
        SketchScenario {
            name: "bf16 16 rows, K = 4096, full-rank noise k=32",
            scheme: "bf16",
            m: 16,
            k: 4096,
            probes: 32,
            rows_per_call: 256,
            plant: Plant::Noise(0.05),
        },
        SketchScenario {
            name: "bf16 129 rows, K = 8192, full-rank noise k=8",
            scheme: "bf16",
            m: 129,
            k: 8192,
            probes: 8,
            rows_per_call: 256,
            plant: Plant::Noise(0.05),
        },
    ]);
    // An odd K: the last tensor-core k step of the projection is partial.
    scenarios.push(SketchScenario {
        name: "odd K = 509, full-rank noise k=32",
        scheme: "bf16",
        m: 57,
        k: 509,
        probes: 32,
        rows_per_call: 256,
        plant: Plant::Noise(0.05),
    });
    // Every scenario on the general kernel; where the device and the call allow, again on the
    // lean one (which the shim takes there by default).
    let lean_device = checker.lean_sketch();
    let mut out = Vec::new();
    let mut lean_cases = 0;
    for s in &scenarios {
        out.extend(gpu_sketch_scenario(checker, s, false));
        if lean_device {
            let lean = gpu_sketch_scenario(checker, s, true);
            lean_cases += !lean.is_empty() as u32;
            out.extend(lean);
        }
    }
    checker.set_lean_sketch(lean_device);
    if lean_device {
        out.push(outcome(
            "sketch claim",
            "the lean kernel ran the scenarios its calls allow",
            lean_cases >= 3,
            format!("{lean_cases} of {} scenarios on the lean kernel too", scenarios.len()),
        ));
    }
    out.push(gpu_sketch_weight_change(checker));
    out
}

/// A weight overwritten in place (same pointer, new content) must be reported as changed, not
/// judged against the stale projection W_R (a false failure).
fn gpu_sketch_weight_change(checker: &GpuChecker) -> Outcome {
    let case = "weight overwritten under the same pointer: flagged WEIGHT_CHANGED, not judged";
    let run = || -> Result<Outcome, String> {
        let (m, n, k) = (64u64, 512u64, 256u64);
        let problem = scheme_problem("bf16", m, n, k);
        let inputs = random_inputs(&problem, 0x77).map_err(|e| e.to_string())?;
        let (_keep, bufs) = upload_inputs(checker, &problem, &inputs).map_err(|e| e.to_string())?;
        let g = QsGemmDesc::from_problem(&problem, &bufs).map_err(|e| e.to_string())?;
        let (seed, probes) = (0x5eed, 8);
        let weight = checker
            .sketch_weight(&g, problem.a.format, problem.d.format, seed, probes)
            .map_err(|e| e.to_string())?;
        let sample = sketch::RowSample::new(seed, m, 256);
        let scratch = checker.sketch_scratch(sample.count, k, n, probes, false).map_err(|e| e.to_string())?;
        let epoch_buf = checker.alloc_zeroed(8).map_err(|e| e.to_string())?;
        let status = |tag: u64| -> Result<u32, String> {
            let rows = QsRowSel::sample(&sample, epoch_buf.ptr, 0, true);
            checker
                .sketch_check(
                    &g,
                    rows,
                    &weight,
                    &scratch,
                    problem.a.format,
                    problem.d.format,
                    (9, tag),
                    Stream::default(),
                )
                .map_err(|e| e.to_string())?;
            checker.runtime().synchronize(Stream::default()).map_err(|e| e.to_string())?;
            let slot = checker.with_ring(|r| r.poll()).ok_or("no sketch result arrived")?;
            Ok(slot.status)
        };
        let before = status(0)?;
        let other = random_inputs(&problem, 0x78).map_err(|e| e.to_string())?;
        checker.runtime().copy_to_device_sync(bufs.b, &other.b).map_err(|e| e.to_string())?;
        let after = status(1)?;
        let changed = abi::status::WEIGHT_CHANGED;
        Ok(outcome(
            "sketch claim",
            case,
            before & changed == 0 && after & changed != 0,
            format!("status before {before:#x}, after overwriting B {after:#x}"),
        ))
    };
    run().unwrap_or_else(|e| error_outcome("sketch", case, e))
}

/// One scenario on the general kernel (`lean` false) or the lean one (`lean` true: nothing when
/// the call does not allow it).
fn gpu_sketch_scenario(checker: &GpuChecker, s: &SketchScenario, lean: bool) -> Vec<Outcome> {
    let kernel = if lean { " [lean kernel]" } else { "" };
    let name = format!("{}{kernel}", s.name);
    let name = name.as_str();
    let run = || -> Result<Vec<Outcome>, String> {
        let (n, k) = (1024u64, s.k);
        let problem = scheme_problem(s.scheme, s.m, n, k);
        let mut inputs = random_inputs(&problem, 0x5ce7 + s.m).map_err(|e| e.to_string())?;
        let problem = with_tensor_scales(problem, &inputs);
        let reference = reference_gemm(&problem, &inputs, &OracleOptions { round_output: false, rows: None })
            .map_err(|e| e.to_string())?;
        // Production: the reference broken as planted, stored in D's format.
        let mut prod_inputs = inputs.clone();
        if let Plant::ScaleRow { row, factor } = s.plant {
            let spec = problem.a_scale.ok_or("the scale-row plant needs A scales")?;
            let scales = prod_inputs.a_scale.as_mut().ok_or("no A scales")?;
            let entry = problem.a_scale_entry(&spec, 0, row, 0) as usize;
            let v = spec.format.load(scales, entry) * factor;
            spec.format.store_code(scales, entry, spec.format.encode(v));
        }
        let production_exact =
            reference_gemm(&problem, &prod_inputs, &OracleOptions { round_output: false, rows: None })
                .map_err(|e| e.to_string())?;
        let mut rng = SplitMix64::new(99);
        let (m, nn) = (s.m as usize, n as usize);
        let rms =
            (reference.values.iter().map(|v| v * v).sum::<f64>() / reference.values.len() as f64).sqrt();
        let mut d = vec![0u8; problem.d.format.bytes_for(m * nn)];
        for i in 0..m {
            for j in 0..nn {
                let base = production_exact.values[i * nn + j];
                let v = match s.plant {
                    Plant::Noise(eps) => base + eps * rms * rng.normal(),
                    Plant::Magnitude(f) => f * base,
                    Plant::WrongRow(r) if i as u64 == r => production_exact.values[((i + 1) % m) * nn + j],
                    _ => base,
                };
                problem.d.format.store_code(&mut d, i * nn + j, problem.d.format.encode(v));
            }
        }
        let prod = decode_output(&problem, &d).map_err(|e| e.to_string())?.values;
        let exact = compare_matrix(&prod, &reference.values, m, nn);

        // Device: weight projection once, then checks over epochs until every row was sampled.
        let (_keep, mut bufs) = upload_inputs(checker, &problem, &inputs).map_err(|e| e.to_string())?;
        let d_buf = checker.upload(&d).map_err(|e| e.to_string())?;
        bufs.d = d_buf.ptr;
        let g = QsGemmDesc::from_problem(&problem, &bufs).map_err(|e| e.to_string())?;
        let seed = 0xabcdef;
        checker.set_lean_sketch(lean);
        let weight = checker
            .sketch_weight(&g, problem.a.format, problem.d.format, seed, s.probes)
            .map_err(|e| e.to_string())?;
        let sample = sketch::RowSample::new(seed, s.m, s.rows_per_call);
        if lean && !checker.sketch_takes_lean(&g, &weight, sample.count, false) {
            return Ok(vec![]);
        }
        let scratch = checker
            .sketch_scratch(sample.count.min(s.m), k, n, s.probes, false)
            .map_err(|e| e.to_string())?;
        let epoch_buf = checker.alloc_zeroed(8).map_err(|e| e.to_string())?;
        let epochs = sample.epochs_to_cover();
        let mut slots = Vec::new();
        for e in 0..epochs {
            // The general kernel draws its rows by the device's count (as captured checks do),
            // the lean one by the host's (as eager checks on the stream do): both 0, 1, 2...
            let rows = if lean {
                QsRowSel::eager(&sample, e)
            } else {
                QsRowSel::sample(&sample, epoch_buf.ptr, 0, true)
            };
            checker
                .sketch_check(
                    &g,
                    rows,
                    &weight,
                    &scratch,
                    problem.a.format,
                    problem.d.format,
                    (7, e),
                    Stream::default(),
                )
                .map_err(|e| e.to_string())?;
            checker.runtime().synchronize(Stream::default()).map_err(|e| e.to_string())?;
            slots.push(checker.with_ring(|r| r.poll()).ok_or("no sketch result arrived")?);
        }
        // The host mirror of the first epoch, from the oracle's decoded operands.
        let a_dense = decode_operand_a(&problem, &inputs, 0).map_err(|e| e.to_string())?;
        let b_dense = decode_operand_b(&problem, &inputs, 0).map_err(|e| e.to_string())?;
        let dense = DenseGemm {
            m,
            n: nn,
            k: k as usize,
            batch: 1,
            a: &a_dense,
            b: &b_dense,
            c: None,
            bias: None,
            alpha: 1.0,
            beta: 0.0,
            d_scale: 1.0,
        };
        let cfg = SketchConfig { seed, probes: s.probes, rows_per_call: s.rows_per_call };
        // The lean kernel holds W_R as bf16 hi only for FP8 A: the mirror rounds it the same way.
        let rounding = if lean && abi::lean_sketch_hi_only(problem.a.format) {
            sketch::WeightRounding::Bf16Hi
        } else {
            sketch::WeightRounding::Exact
        };
        let host = sketch::sketch_check_rounded(&dense, &prod, &cfg, 0, rounding)
            .map_err(|e| e.to_string())?
            .metrics();
        let device = sketch::slot_metrics(&slots[0]);
        let mut outs = vec![outcome(
            "sketch device=host",
            name,
            rel(device.nmse, host.nmse) <= 1e-3 && rel(device.cosine, host.cosine) <= 1e-6,
            format!(
                "device nmse {:.4e} cos {:.6} | host mirror nmse {:.4e} cos {:.6}",
                device.nmse, device.cosine, host.nmse, host.cosine
            ),
        )];
        let judge = |m: &Metrics| !Thresholds::default().judge(problem.class(), m).is_empty();
        let (claim, pass) = match s.plant {
            Plant::Noise(_) if name.contains("10x above") => ("flagged", judge(&device)),
            Plant::Noise(_) if name.contains("10x below") => ("not flagged", !judge(&device)),
            Plant::Noise(_) => ("NMSE within 25%", rel(device.nmse, exact.nmse) <= 0.25),
            Plant::ScaleRow { .. } => {
                ("NMSE within 2x", device.nmse <= 2.0 * exact.nmse && device.nmse >= 0.5 * exact.nmse)
            }
            Plant::Magnitude(_) => ("flagged", judge(&device)),
            Plant::WrongRow(r) => {
                let found = slots
                    .iter()
                    .any(|slot| sketch::slot_metrics(slot).worst_row.is_some_and(|w| w.index == r));
                ("found as the worst row", found)
            }
        };
        outs.push(outcome(
            "sketch claim",
            format!("{name}: {claim}"),
            pass,
            format!(
                "estimate nmse {:.4e} cos {:.6} norm {:.4} | exact nmse {:.4e} cos {:.6} norm {:.4} ({} epochs)",
                device.nmse, device.cosine, device.norm_ratio, exact.nmse, exact.cosine, exact.norm_ratio, epochs
            ),
        ));
        let _ = &mut inputs;
        Ok(outs)
    };
    run().unwrap_or_else(|e| vec![error_outcome("sketch", name, e)])
}

/// Detached checks (`QUANTSHADOW_SKETCH_DETACH`, `device::snapshot`): the copy kernel and the
/// check over the copy must give what the check in place gives, for every layout the copy
/// handles (4-bit rows, swizzled and K-major scales, column-major A, C with beta, row bias,
/// device-pointer scalars, a batch sharing one weight, row samples rotating over epochs).
fn gpu_sketch_detached(checker: &GpuChecker) -> Vec<Outcome> {
    struct Variant {
        name: &'static str,
        scheme: &'static str,
        m: u64,
        n: u64,
        k: u64,
        tweak: fn(&mut GemmProblem),
        /// alpha read from device memory by the check (copied into the snapshot's header).
        device_alpha: bool,
        /// The case exists for `qs_sketch_snap_all`: it fails if another copy served it.
        every_row_copy: bool,
    }
    fn none(_: &mut GemmProblem) {}
    fn col_a_c_rowbias(p: &mut GemmProblem) {
        p.trans_a = Transpose::T; // A stored K x M row-major: op(A) rows are strided
        p.a = MatrixLayout::packed(p.a.format, Order::RowMajor, p.k, p.m);
        p.c = Some(MatrixLayout::packed(Format::Bf16, Order::ColMajor, p.m, p.n));
        p.beta = Scalar::Host(0.5);
        p.epilogue.bias = Some(Bias { format: Format::Bf16, axis: BiasAxis::Rows });
    }
    fn batch_shared_b(p: &mut GemmProblem) {
        p.batch = 3;
        p.a.batch_stride = p.m * p.k;
        p.d.batch_stride = p.m * p.n;
        p.b.batch_stride = 0;
    }
    let variants = [
        Variant {
            name: "fp8 row-wise, 300 rows (256 sampled)",
            scheme: "fp8-rowwise",
            m: 300,
            n: 1024,
            k: 512,
            tweak: none,
            device_alpha: false,
            every_row_copy: false,
        },
        Variant {
            name: "mxfp4, 57 rows, swizzled scales",
            scheme: "mxfp4",
            m: 57,
            n: 512,
            k: 512,
            tweak: none,
            device_alpha: false,
            every_row_copy: false,
        },
        Variant {
            name: "nvfp4, 129 rows",
            scheme: "nvfp4",
            m: 129,
            n: 256,
            k: 256,
            tweak: none,
            device_alpha: false,
            every_row_copy: false,
        },
        Variant {
            name: "fp8 block 128 (K-major A scales), 4097 rows",
            scheme: "fp8-block128",
            m: 4097,
            n: 256,
            k: 512,
            tweak: none,
            device_alpha: false,
            every_row_copy: false,
        },
        Variant {
            name: "w4a16 int4, 7 rows",
            scheme: "w4a16-int4",
            m: 7,
            n: 4096,
            k: 256,
            tweak: none,
            device_alpha: false,
            every_row_copy: false,
        },
        Variant {
            name: "bf16 op(A) strided, C col-major, beta, row bias",
            scheme: "bf16",
            m: 55,
            n: 200,
            k: 136,
            tweak: col_a_c_rowbias,
            device_alpha: false,
            every_row_copy: false,
        },
        Variant {
            name: "bf16 batch 3 sharing B, device alpha",
            scheme: "bf16",
            m: 100,
            n: 384,
            k: 256,
            tweak: batch_shared_b,
            device_alpha: true,
            every_row_copy: false,
        },
        Variant {
            name: "bf16 contiguous rows, 300 rows (256 sampled)",
            scheme: "bf16",
            m: 300,
            n: 1024,
            k: 512,
            tweak: none,
            device_alpha: false,
            every_row_copy: false,
        },
        Variant {
            // The lean copy with a device-pointer scalar (as FP8 tensor scales are), copied into
            // the snapshot's header.
            name: "bf16 contiguous rows, 300 rows, device alpha",
            scheme: "bf16",
            m: 300,
            n: 1024,
            k: 512,
            tweak: none,
            device_alpha: true,
            every_row_copy: false,
        },
        Variant {
            name: "bf16 contiguous rows, 1 row",
            scheme: "bf16",
            m: 1,
            n: 4096,
            k: 4096,
            tweak: none,
            device_alpha: false,
            every_row_copy: false,
        },
        Variant {
            name: "fp8 tensor-wise, 129 rows",
            scheme: "fp8-tensor",
            m: 129,
            n: 512,
            k: 256,
            tweak: none,
            device_alpha: false,
            every_row_copy: false,
        },
        Variant {
            name: "f16 device alpha, 1 row",
            scheme: "f16",
            m: 1,
            n: 4097,
            k: 4096,
            tweak: none,
            device_alpha: true,
            every_row_copy: false,
        },
        Variant {
            // The copy of every row (qs_sketch_snap_all): 3 slices per row (the grid fills the
            // GPU), more vectors in an A slice (342) than threads in a block, uneven slices, and
            // a device-pointer scalar for the header.
            name: "bf16 device alpha, 100 rows, every row copied",
            scheme: "bf16",
            m: 100,
            n: 520,
            k: 8192,
            tweak: none,
            device_alpha: true,
            every_row_copy: true,
        },
    ];
    let mut kinds: Vec<&'static str> = Vec::new();
    let mut out: Vec<Outcome> = variants
        .iter()
        .enumerate()
        .map(|(i, v)| {
            // Alternate the copy's epoch source: the host's count (eager) or the device counter
            // (graph replays).
            let device_epoch = i % 2 == 1;
            let case = format!(
                "detached = in place: {} ({} epoch)",
                v.name,
                if device_epoch { "device-counted" } else { "host-counted" }
            );
            detached_case(checker, v.scheme, v.m, v.n, v.k, v.tweak, v.device_alpha, device_epoch)
                .map(|(pass, detail, kind)| {
                    kinds.push(kind);
                    let right_copy = !v.every_row_copy || kind == "every-row";
                    outcome("sketch detached", case.clone(), pass && right_copy, detail)
                })
                .unwrap_or_else(|e| error_outcome("sketch detached", case, e))
        })
        .collect();
    // Every copy kernel must have been compared with the in-place check above.
    let count = |kind: &str| kinds.iter().filter(|&&k| k == kind).count();
    let (every_row, lean, general) = (count("every-row"), count("lean"), count("general"));
    out.push(outcome(
        "sketch detached",
        "every snapshot copy covered (every row, lean, general)",
        every_row >= 2 && lean >= 2 && general >= 2,
        format!("cases by copy: {every_row} every-row, {lean} lean, {general} general"),
    ));
    out
}

struct SplitCase {
    name: &'static str,
    scheme: &'static str,
    m: u64,
    n: u64,
    k: u64,
    probes: u32,
    device_alpha: bool,
    /// A NaN planted at (row, column) of D.
    nan: Option<(u64, u64)>,
}

/// Split checks (eager calls, CUDA sm_90+, qs_abi.h QsSplitHeader): the projections on one
/// stream and the finishing on another, behind an event, must give what the lean check gives in
/// place over the same rows. One buffer serves every epoch of a case, so a count the finishing
/// failed to reset shows up in the next epoch.
fn gpu_sketch_split(checker: &GpuChecker) -> Vec<Outcome> {
    const SECTION: &str = "sketch split";
    if !quantshadow_runtime::device::gpu::lean_sketch_device(&checker.info) {
        return vec![outcome(
            SECTION,
            "split check",
            true,
            "not on this device (needs CUDA sm_90+): never taken",
        )];
    }
    let case = |name, scheme, (m, n, k), probes, device_alpha, nan| SplitCase {
        name,
        scheme,
        m,
        n,
        k,
        probes,
        device_alpha,
        nan,
    };
    let cases = [
        case("bf16, 300 rows (256 sampled), k = 32", "bf16", (300, 1024, 2048), 32, false, None),
        case(
            "fp8 tensor-wise, device alpha, 1000 rows, k = 16",
            "fp8-tensor",
            (1000, 512, 1024),
            16,
            true,
            None,
        ),
        case(
            "bf16, 40 rows (a partial group), k = 8, a NaN in D",
            "bf16",
            (40, 256, 512),
            8,
            false,
            Some((17, 33)),
        ),
        case("fp8 tensor-wise, 4096 x 544 x 256, k = 32", "fp8-tensor", (4096, 544, 256), 32, false, None),
    ];
    let lean_was = checker.lean_sketch();
    checker.set_lean_sketch(true);
    let out = cases
        .iter()
        .map(|c| {
            let case = format!("split = lean in place: {}", c.name);
            split_case(checker, c)
                .map(|(pass, detail)| outcome(SECTION, case.clone(), pass, detail))
                .unwrap_or_else(|e| error_outcome(SECTION, case, e))
        })
        .collect();
    checker.set_lean_sketch(lean_was);
    out
}

fn split_case(checker: &GpuChecker, c: &SplitCase) -> Result<(bool, String), String> {
    let SplitCase { scheme, m, n, k, probes, device_alpha, nan, .. } = *c;
    let es = |e: &dyn std::fmt::Display| e.to_string();
    let problem = scheme_problem(scheme, m, n, k);
    let mut inputs = random_inputs(&problem, 0x5b17 + m).map_err(|e| es(&e))?;
    let problem = with_tensor_scales(problem, &inputs);
    let (_keep, g) = noisy_call_on_device(checker, &problem, &inputs, 6, nan, device_alpha)?;
    let (fa, fb, fd) = (problem.a.format, problem.b.format, problem.d.format);
    let seed = 0x5b11_7000;
    let weight = checker.sketch_weight(&g, fa, fd, seed, probes).map_err(|e| es(&e))?;
    let sample = sketch::RowSample::new(seed, g.total_rows(), 256);
    if !checker.sketch_takes_lean(&g, &weight, sample.count, false) {
        return Err("the call does not take the lean check, so neither the split one".into());
    }
    let entries = checker.sketch_entries(fa, fb, fd, weight.kp).map_err(|e| es(&e))?;
    let layout = abi::SplitLayout::new(sample.count, weight.kp);
    let buffer = checker.alloc_zeroed(layout.bytes() as usize).map_err(|e| es(&e))?;
    let in_place = checker.sketch_scratch(sample.count, g.k, g.n, probes, false).map_err(|e| es(&e))?;
    let split = checker.sketch_scratch(sample.count, g.k, g.n, probes, false).map_err(|e| es(&e))?;
    let rt = checker.runtime();
    let (st, side) = (Stream::default(), rt.create_side_stream().map_err(|e| es(&e))?);
    let projected = rt.create_sync_event().map_err(|e| es(&e))?;
    let epochs = sample.epochs_to_cover().clamp(2, 3);
    let mut worst = 0.0f64;
    let mut problems = Vec::new();
    let mut nan_seen = 0;
    for e in 0..epochs {
        let rows = QsRowSel::eager(&sample, e);
        checker.sketch_check(&g, rows, &weight, &in_place, fa, fd, (1, e), st).map_err(|e| es(&e))?;
        let (project, finish) = checker
            .prepare_split_check(entries, &g, rows, &weight, &split, buffer.ptr, (2, e))
            .map_err(|e| es(&e))?;
        checker.launch_prepared(&project, st).map_err(|e| es(&e))?;
        rt.record_event(projected, st).map_err(|e| es(&e))?;
        rt.wait_event(side, projected).map_err(|e| es(&e))?;
        checker.launch_prepared(&finish, side).map_err(|e| es(&e))?;
        rt.synchronize(side).map_err(|e| es(&e))?;
        rt.synchronize(st).map_err(|e| es(&e))?;
        let (a, b) = checker.with_ring(|ring| (ring.poll(), ring.poll()));
        let (a, b) = (a.ok_or("no in-place result")?, b.ok_or("no split result")?);
        let (a, b) = if a.tag == 1 { (a, b) } else { (b, a) };
        worst = worst.max(sums_disagreement(&a, &b));
        let fields = |s: &abi::QsResultSlot| {
            (s.finite, s.pairs, s.nan_prod, s.nan_ref, s.elem_nan_prod, s.elem_inf_prod, s.worst_row, s.epoch)
        };
        if fields(&a) != fields(&b) || (a.rows_checked, a.status) != (b.rows_checked, b.status) {
            problems.push(format!(
                "epoch {e}: in place (finite {}, NaN elements {}, worst row {}, epoch {}, rows {}, status {:#x}), split ({}, {}, {}, {}, {}, {:#x})",
                a.finite, a.elem_nan_prod, a.worst_row, a.epoch, a.rows_checked, a.status,
                b.finite, b.elem_nan_prod, b.worst_row, b.epoch, b.rows_checked, b.status
            ));
        }
        if a.pairs == 0 || a.prod_sq == 0.0 {
            problems.push(format!("epoch {e}: the in-place check saw nothing"));
        }
        nan_seen += b.elem_nan_prod;
    }
    if nan.is_some() && nan_seen == 0 {
        problems.push("the planted NaN was never counted".into());
    }
    let _ = &mut inputs;
    Ok((
        problems.is_empty() && worst <= 1e-12,
        format!(
            "{epochs} epochs of {} rows, buffer {} KiB, sums agree to {worst:.1e} relative{}{}",
            sample.count,
            layout.bytes() >> 10,
            if nan.is_some() { format!(", NaN elements counted {nan_seen}") } else { String::new() },
            if problems.is_empty() { String::new() } else { format!("; {}", problems.join("; ")) }
        ),
    ))
}

/// The largest relative difference between two sketch results of the same check: the sums,
/// the worst row's cosine and the probe sums of the production side.
fn sums_disagreement(a: &abi::QsResultSlot, b: &abi::QsResultSlot) -> f64 {
    let sums = [
        (a.dot, b.dot),
        (a.prod_sq, b.prod_sq),
        (a.ref_sq, b.ref_sq),
        (a.diff_sq, b.diff_sq),
        (a.worst_cosine, b.worst_cosine),
    ];
    sums.into_iter()
        .chain(a.sketch_prod.iter().copied().zip(b.sketch_prod))
        .map(|(x, y)| rel(x, y))
        .fold(0.0, f64::max)
}

/// A call on the device whose D is the oracle's reference with 1% noise from `noise_seed` (never
/// zeros: a check must see real rows), a NaN at `nan` (row, column) if given, and alpha 1.25
/// read from device memory if `device_alpha`: its descriptor and the buffers it points into.
fn noisy_call_on_device(
    checker: &GpuChecker,
    problem: &GemmProblem,
    inputs: &HostInputs,
    noise_seed: u64,
    nan: Option<(u64, u64)>,
    device_alpha: bool,
) -> Result<(Vec<DeviceBuffer>, QsGemmDesc), String> {
    let es = |e: &dyn std::fmt::Display| e.to_string();
    let reference = reference_gemm(problem, inputs, &OracleOptions { round_output: false, rows: None })
        .map_err(|e| es(&e))?;
    let mut rng = SplitMix64::new(noise_seed);
    let f = problem.d.format;
    let elems = problem.d.required_elements(problem.m, problem.n, problem.batch) as usize;
    let mut d = vec![0u8; f.bytes_for(elems)];
    for (idx, v) in reference.values.iter().enumerate() {
        f.store_code(&mut d, idx, f.encode(v * (1.0 + 0.01 * rng.normal())));
    }
    if let Some((row, col)) = nan {
        f.store_code(&mut d, (row * problem.n + col) as usize, f.encode(f64::NAN));
    }
    let (mut keep, mut bufs) = upload_inputs(checker, problem, inputs).map_err(|e| es(&e))?;
    let d_buf = checker.upload(&d).map_err(|e| es(&e))?;
    bufs.d = d_buf.ptr;
    keep.push(d_buf);
    let mut g = QsGemmDesc::from_problem(problem, &bufs).map_err(|e| es(&e))?;
    if device_alpha {
        let alpha = checker.upload(&1.25f32.to_le_bytes()).map_err(|e| es(&e))?;
        g.alpha = abi::QsScalar { value: 0.0, ptr: alpha.ptr, format: Format::F32 as u32, on_device: 1 };
        keep.push(alpha);
    }
    Ok((keep, g))
}

#[allow(clippy::too_many_arguments)]
fn detached_case(
    checker: &GpuChecker,
    scheme: &str,
    m: u64,
    n: u64,
    k: u64,
    tweak: fn(&mut GemmProblem),
    device_alpha: bool,
    device_epoch: bool,
) -> Result<(bool, String, &'static str), String> {
    use quantshadow_runtime::device::gpu::SnapCopy;
    use quantshadow_runtime::device::snapshot::SnapshotLayout;
    let es = |e: &dyn std::fmt::Display| e.to_string();
    let mut problem = scheme_problem(scheme, m, n, k);
    tweak(&mut problem);
    let mut inputs = random_inputs(&problem, 0xde7a + m).map_err(|e| es(&e))?;
    let problem = with_tensor_scales(problem, &inputs);
    let (_keep, g) = noisy_call_on_device(checker, &problem, &inputs, 5, None, device_alpha)?;
    let (seed, probes) = (0x005e_edd7, 32);
    let (fa, fd) = (problem.a.format, problem.d.format);
    let weight = checker.sketch_weight(&g, fa, fd, seed, probes).map_err(|e| es(&e))?;
    let sample = sketch::RowSample::new(seed, g.total_rows(), 256);
    let layout =
        SnapshotLayout::new(&g, sample.count, checker.info.multiprocessors, u64::MAX).map_err(|e| es(&e))?;
    let snap = checker.alloc(layout.bytes as usize).map_err(|e| es(&e))?;
    let counters = checker.alloc_zeroed(16).map_err(|e| es(&e))?;
    let epoch_buf = checker.alloc_zeroed(8).map_err(|e| es(&e))?;
    let in_place = checker.sketch_scratch(sample.count, g.k, g.n, probes, false).map_err(|e| es(&e))?;
    let detached = checker.sketch_scratch(sample.count, g.k, g.n, probes, false).map_err(|e| es(&e))?;
    let st = Stream::default();
    let epochs = sample.epochs_to_cover().clamp(1, 3);
    let mut worst = 0.0f64;
    let mut mismatches = Vec::new();
    let mut copy_kind = "none";
    for e in 0..epochs {
        checker
            .sketch_check(
                &g,
                QsRowSel::sample(&sample, epoch_buf.ptr, 0, true),
                &weight,
                &in_place,
                fa,
                fd,
                (1, e),
                st,
            )
            .map_err(|e| es(&e))?;
        let (rows, counter) = if device_epoch {
            (QsRowSel::sample(&sample, 0, 0, false), counters.ptr)
        } else {
            (QsRowSel::eager(&sample, e), 0)
        };
        let (copy, check) = checker
            .prepare_detached(&g, &layout, rows, snap.ptr, counter, &weight, &detached, (2, e), false)
            .map_err(|e| es(&e))?;
        copy_kind = match &copy {
            SnapCopy::EveryRow(_) => "every-row",
            SnapCopy::Rows(_) if SnapshotLayout::lean_copy(&g) => "lean",
            SnapCopy::Rows(_) => "general",
        };
        checker.launch_copy(&copy, st).map_err(|e| es(&e))?;
        checker.launch_prepared(&check, st).map_err(|e| es(&e))?;
        checker.runtime().synchronize(st).map_err(|e| es(&e))?;
        let (a, b) = checker.with_ring(|ring| (ring.poll(), ring.poll()));
        let (a, b) = (a.ok_or("no in-place result")?, b.ok_or("no detached result")?);
        let (a, b) = if a.tag == 1 { (a, b) } else { (b, a) };
        worst = worst.max(sums_disagreement(&a, &b));
        let same = (a.finite, a.pairs, a.nan_prod, a.nan_ref, a.worst_row, a.epoch, a.rows_checked, a.status)
            == (b.finite, b.pairs, b.nan_prod, b.nan_ref, b.worst_row, b.epoch, b.rows_checked, b.status);
        if !same {
            mismatches.push(format!(
                "epoch {e}: in place (finite {}, worst row {}, epoch {}, rows {}, status {:#x}) detached ({}, {}, {}, {}, {:#x})",
                a.finite, a.worst_row, a.epoch, a.rows_checked, a.status, b.finite, b.worst_row, b.epoch, b.rows_checked, b.status
            ));
        }
        if a.pairs == 0 || a.prod_sq == 0.0 {
            mismatches.push(format!("epoch {e}: the in-place check saw nothing"));
        }
    }
    let _ = &mut inputs;
    let pass = mismatches.is_empty() && worst <= 1e-9;
    Ok((
        pass,
        format!(
            "{epochs} epochs of {} rows, {copy_kind} copy, snapshot {} KiB, grid {:?}: sums agree to {worst:.1e} relative{}",
            sample.count,
            layout.bytes >> 10,
            layout.launch.grid,
            if mismatches.is_empty() { String::new() } else { format!("; {}", mismatches.join("; ")) }
        ),
        copy_kind,
    ))
}

/// Early starts (`QUANTSHADOW_EARLY_START`, programmatic dependent launch, CUDA sm_90+): a check,
/// or a snapshot copy, launched to start before the kernel ahead of it on its stream finishes must
/// still read what that kernel writes. Ahead of it, `qs_selftest_late_copy` lets it start at once,
/// sleeps, and only then writes the honest D over a garbage one.
/// - A probe launched early behind the writer, on a side stream and on the legacy default stream
///   (PyTorch's), times its own wait: started early, it waits out the writer's sleep.
/// - The check (each kernel it can take) and the copy + check must judge the honest D, having
///   started early. A control launches the same work on a second stream with no order at all: it
///   must see the garbage, else the writer was not late enough for the run to show anything
///   (reported as a failure).
fn gpu_early_start(checker: &GpuChecker) -> Vec<Outcome> {
    let (early_was, lean_was) = (checker.early_start(), checker.lean_sketch());
    if !checker.set_early_start(true) {
        return vec![outcome(
            "early",
            "early start",
            true,
            "not run: needs CUDA sm_90+ and a driver with cuLaunchKernelEx (never used here)",
        )];
    }
    let rt = checker.runtime();
    let streams = rt.create_side_stream().and_then(|a| Ok((a, rt.create_side_stream()?)));
    let Ok((ahead, control)) = streams else {
        checker.set_early_start(early_was);
        return vec![error_outcome("early", "side streams", "could not create two streams")];
    };
    let probe = |stream, name: &str| {
        let case = format!("early start takes effect on {name}");
        early_probe(checker, stream, &case).unwrap_or_else(|e| error_outcome("early", case, e))
    };
    let mut out = vec![probe(ahead, "a side stream")];
    for (lean, tag) in [(false, 0xea01), (true, 0xea02)] {
        if checker.set_lean_sketch(lean) != lean {
            continue; // no lean kernel on this device
        }
        let name = if lean { "check on the stream [lean kernel]" } else { "check on the stream" };
        out.push(
            early_case(checker, (ahead, control), false, lean, tag)
                .unwrap_or_else(|e| error_outcome("early", name, e)),
        );
    }
    checker.set_lean_sketch(lean_was);
    out.push(
        early_case(checker, (ahead, control), true, false, 0xea03)
            .unwrap_or_else(|e| error_outcome("early", "snapshot copy, then its check", e)),
    );
    // Every row sampled: the decode copy (qs_sketch_snap_all).
    out.push(
        early_case_rows(checker, (ahead, control), true, false, 0xea04, 64)
            .unwrap_or_else(|e| error_outcome("early", "snapshot copy of every row, then its check", e)),
    );
    // Last: a driver refusing early starts there turns them off for what follows.
    out.push(probe(Stream::default(), "the legacy default stream (PyTorch's default)"));
    checker.set_early_start(early_was);
    out
}

/// The late writer's sleep before it writes, ns.
const LATE_WRITER_NS: u64 = 200_000;

/// The late writer (one block: the work behind it must find free SMs while it sleeps).
fn launch_late_writer(
    checker: &GpuChecker,
    from: u64,
    to: u64,
    words: u64,
    on: Stream,
) -> Result<(), String> {
    let late = QsSelftestParams {
        in_ptr: from,
        out_ptr: to,
        n: words,
        stream: LATE_WRITER_NS,
        ..Default::default()
    };
    let one_block = abi::LaunchConfig { grid: [1, 1, 1], block: [256, 1, 1], shared_bytes: 0 };
    checker
        .launch(&KernelBuild::selftest(), "qs_selftest_late_copy", &one_block, &late, on)
        .map_err(|e| e.to_string())
}

/// The probe behind the late writer on `on`: how long its wait took.
fn early_probe(checker: &GpuChecker, on: Stream, case: &str) -> Result<Outcome, String> {
    let es = |e: &dyn std::fmt::Display| e.to_string();
    let (src, dst, times) = (
        checker.upload(&[7u8; 256]).map_err(|e| es(&e))?,
        checker.alloc(256).map_err(|e| es(&e))?,
        checker.alloc_zeroed(16).map_err(|e| es(&e))?,
    );
    let params = QsSelftestParams { out_ptr: times.ptr, ..Default::default() };
    let cfg = abi::LaunchConfig { grid: [1, 1, 1], block: [32, 1, 1], shared_bytes: 0 };
    let mut probe = checker
        .prepare_kernel(&KernelBuild::selftest(), "qs_selftest_early_probe", cfg, params)
        .map_err(|e| es(&e))?;
    probe.early_start = true;
    let early =
        run_behind_writer(checker, (src.ptr, dst.ptr, 64), on, on, |s| checker.launch_prepared(&probe, s))?;
    let t: Vec<u64> = times
        .read()
        .map_err(|e| es(&e))?
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let waited_us = t[1].saturating_sub(t[0]) as f64 / 1e3;
    Ok(outcome(
        "early",
        case,
        early == 1 && waited_us > LATE_WRITER_NS as f64 / 1e3 / 2.0,
        format!(
            "the probe waited {waited_us:.1} us for the writer's {} us sleep ({}); {early} early launch(es)",
            LATE_WRITER_NS / 1000,
            if waited_us > LATE_WRITER_NS as f64 / 2e3 {
                "it started early"
            } else {
                "it started after the writer: no early start"
            }
        ),
    ))
}

/// One early-start case: the check on the stream (`copy` false, the lean kernel if `lean`) or
/// the detached snapshot copy followed by its check (`copy` true), behind the late writer on
/// `streams.0`, then the same on `streams.1` with no order (the control). `tag`: the ring tag.
fn early_case(
    checker: &GpuChecker,
    streams: (Stream, Stream),
    copy: bool,
    lean: bool,
    tag: u64,
) -> Result<Outcome, String> {
    early_case_rows(checker, streams, copy, lean, tag, 32)
}

/// [`early_case`] with `sampled` of the problem's 64 rows checked per call (64: every row, which
/// a copy takes with `qs_sketch_snap_all`).
fn early_case_rows(
    checker: &GpuChecker,
    streams: (Stream, Stream),
    copy: bool,
    lean: bool,
    tag: u64,
    sampled: u64,
) -> Result<Outcome, String> {
    use quantshadow_runtime::device::gpu::SnapCopy;
    use quantshadow_runtime::device::snapshot::SnapshotLayout;
    let es = |e: &dyn std::fmt::Display| e.to_string();
    let (ahead, control) = streams;
    // 64 rows of a bf16 1024 x 1024 layer, 32 sampled per call (the lean kernel takes 16 or
    // more), or every row.
    let problem = scheme_problem("bf16", 64, 1024, 1024);
    let inputs = random_inputs(&problem, 0xea71).map_err(|e| es(&e))?;
    let reference = reference_gemm(&problem, &inputs, &OracleOptions { round_output: true, rows: None })
        .map_err(|e| es(&e))?;
    let f = problem.d.format;
    let elems = (problem.m * problem.n) as usize;
    let (mut honest, mut garbage) = (vec![0u8; f.bytes_for(elems)], vec![0u8; f.bytes_for(elems)]);
    let mut rng = SplitMix64::new(0xbad);
    for (i, v) in reference.values.iter().enumerate() {
        f.store_code(&mut honest, i, f.encode(*v));
        f.store_code(&mut garbage, i, f.encode(rng.normal()));
    }
    let (_keep, mut bufs) = upload_inputs(checker, &problem, &inputs).map_err(|e| es(&e))?;
    let honest_buf = checker.upload(&honest).map_err(|e| es(&e))?;
    let d_buf = checker.upload(&garbage).map_err(|e| es(&e))?;
    bufs.d = d_buf.ptr;
    let g = QsGemmDesc::from_problem(&problem, &bufs).map_err(|e| es(&e))?;
    let (seed, probes) = (0x0ea7, 32);
    let weight = checker.sketch_weight(&g, f, f, seed, probes).map_err(|e| es(&e))?;
    let sample = sketch::RowSample::new(seed, g.total_rows(), sampled);
    let every_row = sample.is_all();
    let scratch = checker.sketch_scratch(sample.count, g.k, g.n, probes, false).map_err(|e| es(&e))?;
    let layout =
        SnapshotLayout::new(&g, sample.count, checker.info.multiprocessors, u64::MAX).map_err(|e| es(&e))?;
    let snap = checker.alloc(layout.bytes as usize).map_err(|e| es(&e))?;
    let took_lean = !copy && checker.sketch_takes_lean(&g, &weight, sample.count, false);
    let every_row_copies = std::cell::Cell::new(0u32);
    let rt = checker.runtime();
    // Runs the work behind the late writer on `on`; returns (flagged, metrics, early launches).
    let run = |on: Stream, call: u64| -> Result<(bool, Metrics, u64), String> {
        rt.copy_to_device_sync(d_buf.ptr, &garbage).map_err(|e| es(&e))?;
        let writer = (honest_buf.ptr, d_buf.ptr, honest.len() as u64 / 4);
        // Prepared first: nothing on the host between the writer's launch and the work's.
        let early = if copy {
            let rows = QsRowSel::eager(&sample, call);
            let (c, check) = checker
                .prepare_detached(&g, &layout, rows, snap.ptr, 0, &weight, &scratch, (tag, call), false)
                .map_err(|e| es(&e))?;
            every_row_copies.set(every_row_copies.get() + matches!(c, SnapCopy::EveryRow(_)) as u32);
            run_behind_writer(checker, writer, on, ahead, |on| {
                checker.launch_copy(&c, on)?;
                checker.launch_prepared(&check, on)
            })?
        } else {
            // As the shim's eager checks on the stream: the epoch counted on the host.
            let rows = QsRowSel::eager(&sample, call);
            let check = checker
                .prepare_sketch_check(&g, rows, &weight, &scratch, f, f, (tag, call), false)
                .map_err(|e| es(&e))?;
            run_behind_writer(checker, writer, on, ahead, |on| checker.launch_prepared(&check, on))?
        };
        judge_slot(checker, &problem, (tag, call), sample.count, early)
    };
    let (flagged, m, early) = run(ahead, 0)?;
    let (control_flagged, cm, _) = run(control, 1)?;
    let one_queue = std::env::var("CUDA_DEVICE_MAX_CONNECTIONS").is_ok_and(|v| v.trim() == "1");
    let name = match (copy, lean) {
        (true, _) if every_row => "snapshot copy of every row, then its check",
        (true, _) => "snapshot copy, then its check",
        (false, true) => "check on the stream [lean kernel]",
        (false, false) => "check on the stream",
    };
    // A copy of every row must have taken its own kernel (both calls), or this case tests the
    // other one.
    let copy_kernel_right = !copy || (every_row_copies.get() == 2) == every_row;
    Ok(outcome(
        "early",
        name,
        !flagged && early >= 1 && control_flagged && took_lean == lean && copy_kernel_right,
        format!(
            "behind the late writer: cos {:.6} nmse {:.2e} ({}), {early} early launch(es), {} kernel{}; control on another stream: cos {:.4} ({})",
            m.cosine,
            m.nmse,
            if flagged { "FLAGGED: read D before it was written" } else { "honest" },
            if took_lean { "lean" } else if copy { "general (over the snapshot)" } else { "general" },
            if copy { format!(", {} of 2 copies by qs_sketch_snap_all", every_row_copies.get()) } else { String::new() },
            cm.cosine,
            match (control_flagged, one_queue) {
                (true, _) => "garbage seen, as it must be",
                (false, true) => "NOT flagged: CUDA_DEVICE_MAX_CONNECTIONS=1 queues it behind the writer; inconclusive",
                (false, false) => "NOT flagged: the writer was not late enough; inconclusive",
            }
        ),
    ))
}

/// The late writer on `ahead` (copying `words` u32 from `honest.0` to `honest.1`), then `work`
/// on `on`; waits for both streams whatever happened (nothing may still run on buffers the
/// caller frees). Returns the early launches `work` made.
fn run_behind_writer(
    checker: &GpuChecker,
    honest: (u64, u64, u64),
    on: Stream,
    ahead: Stream,
    work: impl FnOnce(Stream) -> Result<(), DeviceError>,
) -> Result<u64, String> {
    let rt = checker.runtime();
    // The garbage D and every set-up copy landed before the side streams start.
    rt.synchronize(Stream::default()).map_err(|e| e.to_string())?;
    let before = checker.early_launches();
    let launched = launch_late_writer(checker, honest.0, honest.1, honest.2, ahead)
        .and_then(|()| work(on).map_err(|e| e.to_string()));
    let early = checker.early_launches() - before;
    let synced = rt.synchronize(on).and_then(|()| rt.synchronize(ahead)).map_err(|e| e.to_string());
    launched?;
    synced?;
    Ok(early)
}

/// The ring slot tagged `tag` (anything else in the ring is not this run's), judged: (flagged,
/// metrics, early launches). A slot that is not valid or did not check `rows` rows is an error.
fn judge_slot(
    checker: &GpuChecker,
    problem: &GemmProblem,
    tag: (u64, u64),
    rows: u64,
    early: u64,
) -> Result<(bool, Metrics, u64), String> {
    let slot = std::iter::from_fn(|| checker.with_ring(|r| r.poll()))
        .find(|slot| (slot.tag, slot.tag2) == tag)
        .ok_or("no result arrived")?;
    if !sketch::slot_is_valid(&slot) || slot.rows_checked != rows {
        return Err(format!(
            "slot not valid (status {:#x}, {} rows checked of {rows})",
            slot.status, slot.rows_checked
        ));
    }
    let m = sketch::slot_metrics(&slot);
    Ok((!Thresholds::default().judge(problem.class(), &m).is_empty(), m, early))
}

// ---------------------------------------------------------------------------------------------
// Host device (no GPU)

fn host_selftest(quick: bool) -> Vec<Outcome> {
    // The host device's reference is the oracle itself, so what can be tested here is the
    // sketch estimator (the host mirror of the device kernel) against exact metrics.
    let fp8_nmse = Thresholds::default().fp8.nmse_max;
    let mut out = Vec::new();
    let cases: Vec<(&str, f64, u32)> = vec![
        ("full-rank noise k=8", 0.05, 8),
        ("10x above the FP8 NMSE bound", (10.0 * fp8_nmse).sqrt(), 32),
        ("10x below the FP8 NMSE bound", (0.1 * fp8_nmse).sqrt(), 32),
    ];
    let take = if quick { 1 } else { cases.len() };
    for (name, eps, probes) in cases.into_iter().take(take) {
        let (m, n, k) = (200usize, 512usize, 256usize);
        let problem = scheme_problem("fp8-rowwise", m as u64, n as u64, k as u64);
        let run = || -> Result<Outcome, String> {
            let inputs = random_inputs(&problem, 11).map_err(|e| e.to_string())?;
            let a = decode_operand_a(&problem, &inputs, 0).map_err(|e| e.to_string())?;
            let b = decode_operand_b(&problem, &inputs, 0).map_err(|e| e.to_string())?;
            let dense = DenseGemm {
                m,
                n,
                k,
                batch: 1,
                a: &a,
                b: &b,
                c: None,
                bias: None,
                alpha: 1.0,
                beta: 0.0,
                d_scale: 1.0,
            };
            let reference = dense.reference();
            let rms = (reference.iter().map(|v| v * v).sum::<f64>() / reference.len() as f64).sqrt();
            let mut rng = SplitMix64::new(5);
            let prod: Vec<f64> = reference.iter().map(|v| v + eps * rms * rng.normal()).collect();
            let exact = compare_matrix(&prod, &reference, m, n);
            let cfg = SketchConfig { seed: 3, probes, rows_per_call: 256 };
            let est = sketch::sketch_check(&dense, &prod, &cfg, 0).map_err(|e| e.to_string())?.metrics();
            let flagged = !Thresholds::default().judge(FormatClass::Fp8, &est).is_empty();
            let pass = if name.contains("above") {
                flagged
            } else if name.contains("below") {
                !flagged
            } else {
                rel(est.nmse, exact.nmse) <= 0.25
            };
            Ok(outcome(
                "sketch claim (host)",
                name,
                pass,
                format!("estimate nmse {:.4e} | exact {:.4e}", est.nmse, exact.nmse),
            ))
        };
        out.push(run().unwrap_or_else(|e| error_outcome("sketch (host)", name, e)));
    }
    out
}
