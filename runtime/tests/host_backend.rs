//! The host check backend (`engine::host`) on host buffers: honest calls pass in every mode,
//! planted errors (2x, one bad row, NaN) fail in every mode, rows mode and sketch rotate over
//! every row, in-place C (C == D, beta != 0) is saved before the call, device-mode scalars and
//! array-of-pointers batches are read from memory, logits, queue bounds and skip reasons.

use quantshadow_runtime::engine::backend::{
    Backend, CheckOutcome, CheckRequest, Diagnose, Polled, PreCall, SketchSettings,
};
use quantshadow_runtime::engine::host::HostBackend;
use quantshadow_runtime::formats::Format;
use quantshadow_runtime::intercept::{InterceptedGemm, PointerArrays};
use quantshadow_runtime::oracle::{reference_gemm, OracleOptions};
use quantshadow_runtime::problem::{
    Bias, BiasAxis, GemmBuffers, GemmProblem, HostInputs, MatrixLayout, Order, Scalar, ScaleGranularity,
    ScaleSpec, Transpose,
};
use quantshadow_runtime::record::{flags, CheckMode};
use quantshadow_runtime::rng::SplitMix64;
use quantshadow_runtime::sketch::RowSample;
use quantshadow_runtime::thresholds::Thresholds;

const SEED: u64 = 0x51;

/// Random values of `layout` for a stored `rows x cols` matrix, `batch` items.
fn random_matrix(layout: &MatrixLayout, rows: u64, cols: u64, batch: u64, seed: u64) -> Vec<u8> {
    let n = layout.required_elements(rows, cols, batch) as usize;
    let mut bytes = vec![0u8; layout.format.bytes_for(n)];
    let mut rng = SplitMix64::new(seed);
    let hi = if layout.format.class() == quantshadow_runtime::formats::FormatClass::Fp8 { 2.0 } else { 1.0 };
    for i in 0..n {
        layout.format.store_code(&mut bytes, i, layout.format.encode(rng.uniform(-hi, hi)));
    }
    bytes
}

fn random_vec(format: Format, len: u64, seed: u64, lo: f64, hi: f64) -> Vec<u8> {
    let mut bytes = vec![0u8; format.bytes_for(len as usize)];
    let mut rng = SplitMix64::new(seed);
    for i in 0..len as usize {
        format.store_code(&mut bytes, i, format.encode(rng.uniform(lo, hi)));
    }
    bytes
}

/// A call's host buffers (kept alive while the backend reads them).
struct Call {
    problem: GemmProblem,
    a: Vec<u8>,
    b: Vec<u8>,
    c: Option<Vec<u8>>,
    d: Vec<u8>,
    a_scale: Option<Vec<u8>>,
    b_scale: Option<Vec<u8>>,
    bias: Option<Vec<u8>>,
}

impl Call {
    /// FP8 e4m3 A with per-token f32 scales, bf16 B^T (the weight), a column bias, bf16 D.
    fn fp8(m: u64, n: u64, k: u64, batch: u64) -> Call {
        let mut p = GemmProblem::row_major(m, n, k, Format::E4m3fn, Format::Bf16, Format::Bf16);
        p.batch = batch;
        p.trans_b = Transpose::T;
        p.b = MatrixLayout::packed(Format::Bf16, Order::RowMajor, n, k);
        p.a_scale =
            Some(ScaleSpec { batch_stride: m, ..ScaleSpec::new(ScaleGranularity::PerOuter, Format::F32) });
        p.epilogue.bias = Some(Bias { format: Format::Bf16, axis: BiasAxis::Cols });
        p.alpha = Scalar::Host(0.5);
        let a = random_matrix(&p.a, m, k, batch, SEED);
        let b = random_matrix(&p.b, n, k, batch, SEED + 1);
        let a_scale = Some(random_vec(Format::F32, m * batch, SEED + 2, 0.01, 0.05));
        let bias = Some(random_vec(Format::Bf16, n, SEED + 3, -0.1, 0.1));
        let d = vec![0u8; Format::Bf16.bytes_for((m * n * batch) as usize)];
        Call { problem: p, a, b, c: None, d, a_scale, b_scale: None, bias }
    }

    fn inputs(&self) -> HostInputs {
        HostInputs {
            a: self.a.clone(),
            b: self.b.clone(),
            c: self.c.clone(),
            a_scale: self.a_scale.clone(),
            b_scale: self.b_scale.clone(),
            bias: self.bias.clone(),
            device_scalars: Default::default(),
        }
    }

    /// The exact result, [batch][m][n].
    fn exact(&self) -> Vec<f64> {
        let opts = OracleOptions { round_output: false, rows: None };
        let mut p = self.problem.clone();
        // Device scalars are host floats here: resolve them for the oracle.
        for s in [&mut p.alpha, &mut p.beta] {
            if let Scalar::Device { ptr, .. } = *s {
                *s = Scalar::Host(unsafe { *(ptr as *const f32) } as f64);
            }
        }
        reference_gemm(&p, &self.inputs(), &opts).unwrap().values
    }

    /// Stores `values` ([batch][m][n]) into D's layout.
    fn store(&mut self, values: &[f64]) {
        let p = &self.problem;
        for item in 0..p.batch {
            for i in 0..p.m {
                for j in 0..p.n {
                    let v = values[((item * p.m + i) * p.n + j) as usize];
                    let at = GemmProblem::out_offset(&p.d, item, i, j) as usize;
                    p.d.format.store_code(&mut self.d, at, p.d.format.encode(v));
                }
            }
        }
    }

    /// An honest library: the exact value with FP32-accumulation-sized noise, rounded to D.
    fn produce_honest(&mut self) -> Vec<f64> {
        let mut rng = SplitMix64::new(9);
        let v: Vec<f64> = self.exact().iter().map(|x| x * (1.0 + 1e-7 * rng.normal())).collect();
        self.store(&v);
        v
    }

    fn intercepted(&self) -> InterceptedGemm {
        let addr = |v: &Option<Vec<u8>>| v.as_ref().map_or(0, |v| v.as_ptr() as u64);
        InterceptedGemm {
            entry: "test",
            problem: self.problem.clone(),
            buffers: GemmBuffers {
                a: self.a.as_ptr() as u64,
                b: self.b.as_ptr() as u64,
                c: addr(&self.c),
                d: self.d.as_ptr() as u64,
                a_scale: addr(&self.a_scale),
                b_scale: addr(&self.b_scale),
                bias: addr(&self.bias),
                amax_d: 0,
            },
            stream: 0,
            pointer_arrays: None,
        }
    }
}

fn request(call: &InterceptedGemm, mode: CheckMode, epoch: u64) -> CheckRequest<'_> {
    CheckRequest {
        call,
        mode,
        site_ordinal: 3,
        site_id: 0xabc,
        call_seq: 11,
        site_epoch: epoch,
        sketch: SketchSettings { seed: 0x5ce7, probes: 32, rows_per_call: 64 },
        rows_per_call: 48,
        logits_topk: None,
        device_gate: None,
        scratch: None,
        diagnose: Diagnose::No,
        thresholds: &DEFAULT_THRESHOLDS,
        rewrites_inputs: false,
    }
}

static DEFAULT_THRESHOLDS: std::sync::LazyLock<Thresholds> = std::sync::LazyLock::new(Thresholds::default);

/// Runs one check through the backend's whole protocol and returns the outcome.
fn run(backend: &HostBackend, req: &CheckRequest) -> CheckOutcome {
    let pre = backend.before_call(req).expect("before_call");
    backend.after_call(req, pre).expect("after_call");
    let mut out = Vec::new();
    backend.poll(&mut out);
    assert_eq!(out.len(), 1, "one result per call");
    match out.pop().unwrap() {
        Polled::Done(o) => *o,
        Polled::Failed { reason, .. } => panic!("check failed: {reason}"),
        other => panic!("unexpected result {other:?}"),
    }
}

fn passes(call: &Call, o: &CheckOutcome) -> bool {
    Thresholds::default().judge(call.problem.class(), &o.metrics).is_empty()
}

const MODES: [CheckMode; 3] = [CheckMode::Full, CheckMode::Rows, CheckMode::Sketch];

#[test]
fn honest_calls_pass_in_every_mode_with_rounding_sized_nmse() {
    let backend = HostBackend::default();
    let mut call = Call::fp8(20, 24, 64, 2);
    call.produce_honest();
    let ig = call.intercepted();
    for mode in MODES {
        let o = run(&backend, &request(&ig, mode, 0));
        assert!(passes(&call, &o), "{mode:?}: {:?}", o.metrics);
        // bf16 rounding: relative error <= 2^-9 per element.
        assert!(o.metrics.nmse < 1e-5, "{mode:?}: nmse {}", o.metrics.nmse);
        assert_eq!((o.site_ordinal, o.site_id, o.call_seq), (3, 0xabc, 11));
        assert_eq!(o.mode, mode);
        assert_eq!(o.flags & flags::ROW_SAMPLE, 0, "40 rows fit in one sample");
        assert_eq!(o.rows_checked, 40);
        if mode == CheckMode::Sketch {
            assert_eq!((o.sketch_prod.len(), o.sketch_ref.len()), (32, 32));
            // Fingerprints agree up to D's rounding (sums over rows cancel, so compare norms).
            let diff: f32 = o.sketch_prod.iter().zip(&o.sketch_ref).map(|(y, x)| (y - x) * (y - x)).sum();
            let norm: f32 = o.sketch_ref.iter().map(|x| x * x).sum();
            assert!(diff <= 1e-4 * norm, "fingerprints {:?} vs {:?}", o.sketch_prod, o.sketch_ref);
        } else {
            assert!(o.sketch_prod.is_empty());
        }
    }
    assert_eq!(backend.dropped(), 0);
}

#[test]
fn planted_errors_fail_in_every_mode() {
    let backend = HostBackend::default();
    let base = {
        let mut c = Call::fp8(20, 24, 64, 2);
        c.produce_honest();
        c
    };
    let exact = base.exact();
    let (m, n) = (20usize, 24usize);
    type Plant = Box<dyn Fn(&mut Vec<f64>)>;
    let plants: Vec<(&str, Plant)> = vec![
        ("2x", Box::new(|v: &mut Vec<f64>| v.iter_mut().for_each(|x| *x *= 2.0))),
        ("bad row 31", Box::new(move |v: &mut Vec<f64>| v[31 * n..32 * n].iter_mut().for_each(|x| *x = -*x))),
        ("nan", Box::new(move |v: &mut Vec<f64>| v[(m + 5) * n + 7] = f64::NAN)),
    ];
    for (name, plant) in plants {
        let mut call = Call { d: base.d.clone(), ..Call::fp8(20, 24, 64, 2) };
        let mut values = exact.clone();
        plant(&mut values);
        call.store(&values);
        let ig = call.intercepted();
        for mode in MODES {
            let o = run(&backend, &request(&ig, mode, 0));
            assert!(!passes(&call, &o), "{name} passed in {mode:?}: {:?}", o.metrics);
            match name {
                "2x" => assert!((o.metrics.norm_ratio - 2.0).abs() < 1e-2, "{mode:?}: {:?}", o.metrics),
                "nan" => assert!(o.metrics.nan_prod >= 1),
                _ => assert_eq!(o.metrics.worst_row.unwrap().index, 31, "{mode:?}"),
            }
        }
    }
}

#[test]
fn rows_and_sketch_rotation_cover_every_row() {
    // 2 x 150 rows, 48 (rows) / 64 (sketch) per call: a bad row is found in exactly the
    // epochs whose window holds it, and within ceil(300 / per_call) epochs for any row.
    let backend = HostBackend::default();
    let mut call = Call::fp8(150, 16, 32, 2);
    let mut values = call.exact();
    for bad in [0usize, 149, 150, 299] {
        values[bad * 16..(bad + 1) * 16].iter_mut().for_each(|x| *x = -*x - 1.0);
    }
    call.store(&values);
    let ig = call.intercepted();
    for (mode, per_call) in [(CheckMode::Rows, 48u64), (CheckMode::Sketch, 64)] {
        let sample = RowSample::new(0x5ce7, 300, per_call);
        let mut covered = vec![false; 300];
        let mut flagged = Vec::new();
        for epoch in 0..sample.epochs_to_cover() {
            sample.rows(epoch).iter().for_each(|r| covered[*r as usize] = true);
            let o = run(&backend, &request(&ig, mode, epoch));
            assert_eq!(o.rows_checked, per_call);
            assert_ne!(o.flags & flags::ROW_SAMPLE, 0);
            if !passes(&call, &o) {
                flagged.push(o.metrics.worst_row.unwrap().index);
            }
        }
        assert!(covered.iter().all(|c| *c), "{mode:?}: the sample covers every row");
        assert!(flagged.iter().all(|r| [0, 149, 150, 299].contains(r)), "{mode:?}: {flagged:?}");
        let windows_with_bad = (0..sample.epochs_to_cover())
            .filter(|e| sample.rows(*e).iter().any(|r| [0, 149, 150, 299].contains(r)))
            .count();
        assert_eq!(flagged.len(), windows_with_bad, "{mode:?}: exactly the windows holding a bad row fail");
    }
}

#[test]
fn in_place_c_with_beta_is_saved_before_the_call() {
    // D = alpha A B + beta C with C == D (one buffer), beta = 1, beta in "device" memory.
    let (m, n, k) = (13u64, 11u64, 17u64);
    let mut p = GemmProblem::row_major(m, n, k, Format::Bf16, Format::Bf16, Format::F32);
    let layout = MatrixLayout::packed(Format::F32, Order::RowMajor, m, n);
    p.c = Some(layout);
    let beta = Box::new(1.0f32);
    p.beta = Scalar::Device { ptr: &*beta as *const f32 as u64, format: Format::F32 };
    let a = random_matrix(&p.a, m, k, 1, 1);
    let b = random_matrix(&p.b, k, n, 1, 2);
    let c0 = random_matrix(&layout, m, n, 1, 3);
    let mut call =
        Call { problem: p, a, b, c: Some(c0.clone()), d: c0, a_scale: None, b_scale: None, bias: None };
    let result = call.exact();
    let mut ig = call.intercepted();
    ig.buffers.c = ig.buffers.d; // in place

    let backend = HostBackend::default();
    for mode in MODES {
        // Reset D to C, then: before_call, the "library" overwrites D, after_call.
        let c0 = call.c.clone().unwrap();
        call.d.copy_from_slice(&c0);
        let req = request(&ig, mode, 0);
        let pre = backend.before_call(&req).unwrap();
        assert!(pre.0.is_some(), "C aliases D with beta != 0: it must be saved");
        call.store(&result);
        backend.after_call(&req, pre).unwrap();
        let mut out = Vec::new();
        backend.poll(&mut out);
        let Some(Polled::Done(o)) = out.pop() else { panic!("no result") };
        assert!(o.metrics.nmse < 1e-12, "{mode:?}: {:?}", o.metrics);

        // Without the saved copy the check would read the overwritten C and fail.
        backend.after_call(&req, PreCall::default()).unwrap();
        backend.poll(&mut out);
        let Some(Polled::Done(o)) = out.pop() else { panic!("no result") };
        assert!(o.metrics.nmse > 1e-3, "{mode:?}: reading D as C must not pass: {:?}", o.metrics);
    }

    // beta == 0: nothing to save.
    let zero = Box::new(0.0f32);
    ig.problem.beta = Scalar::Device { ptr: &*zero as *const f32 as u64, format: Format::F32 };
    assert!(backend.before_call(&request(&ig, CheckMode::Full, 0)).unwrap().0.is_none());
    drop(beta);
}

#[test]
fn pointer_arrays_are_gathered_item_by_item() {
    let (m, n, k, batch) = (9u64, 7u64, 12u64, 3u64);
    let p = GemmProblem::row_major(m, n, k, Format::F16, Format::F16, Format::F32);
    let one = |l: &MatrixLayout, r, c, s| random_matrix(l, r, c, 1, s);
    let a: Vec<Vec<u8>> = (0..batch).map(|i| one(&p.a, m, k, 10 + i)).collect();
    let b: Vec<Vec<u8>> = (0..batch).map(|i| one(&p.b, k, n, 20 + i)).collect();
    // The same call as a strided one, for the expected values.
    let mut strided = Call {
        problem: GemmProblem { batch, ..p.clone() },
        a: a.concat(),
        b: b.concat(),
        c: None,
        d: vec![0u8; (4 * m * n * batch) as usize],
        a_scale: None,
        b_scale: None,
        bias: None,
    };
    let values = strided.produce_honest();
    let mut d: Vec<Vec<u8>> = strided.d.chunks((4 * m * n) as usize).map(|c| c.to_vec()).collect();
    let ptrs = |v: &[Vec<u8>]| v.iter().map(|x| x.as_ptr() as u64).collect::<Vec<u64>>();
    let (pa, pb, pd) = (ptrs(&a), ptrs(&b), ptrs(&d));
    let mut problem = strided.problem.clone();
    for l in [&mut problem.a, &mut problem.b, &mut problem.d] {
        l.batch_stride = 0xdead; // ignored for pointer arrays
    }
    let ig = InterceptedGemm {
        entry: "test",
        problem,
        buffers: GemmBuffers::default(),
        stream: 0,
        pointer_arrays: Some(PointerArrays {
            a: pa.as_ptr() as u64,
            b: pb.as_ptr() as u64,
            d: pd.as_ptr() as u64,
        }),
    };
    let backend = HostBackend::default();
    let o = run(&backend, &request(&ig, CheckMode::Full, 0));
    assert!(o.metrics.nmse < 1e-12 && o.rows_checked == m * batch, "{:?}", o.metrics);
    // Break item 2, row 4: the worst row is global row 2 * 9 + 4.
    let at = (4 * n) as usize;
    Format::F32.store_code(&mut d[2], at, Format::F32.encode(-values[((2 * m + 4) * n) as usize] + 5.0));
    let o = run(&backend, &request(&ig, CheckMode::Full, 0));
    assert_eq!(o.metrics.worst_row.unwrap().index, 2 * m + 4);
}

#[test]
fn logits_of_an_lm_head() {
    let (m, n, k) = (5u64, 64u64, 16u64);
    let p = GemmProblem::row_major(m, n, k, Format::Bf16, Format::Bf16, Format::F32);
    let a = random_matrix(&p.a, m, k, 1, 5);
    let b = random_matrix(&p.b, k, n, 1, 6);
    let mut call = Call {
        problem: p,
        a,
        b,
        c: None,
        d: vec![0u8; (4 * m * n) as usize],
        a_scale: None,
        b_scale: None,
        bias: None,
    };
    let mut values = call.produce_honest();
    let backend = HostBackend::default();
    let ig = call.intercepted();
    for mode in MODES {
        let mut req = request(&ig, mode, 0);
        req.logits_topk = Some(5);
        let o = run(&backend, &req);
        let l = o.logits.expect("logits");
        assert!(l.top1_agree && l.kl < 1e-9 && l.topk_overlap == 1.0 && l.k == 5, "{mode:?}: {l:?}");
        assert_eq!(o.logits_rows.len(), 1);
        assert_eq!(o.logits_rows[0].prod_top.len(), 5);
    }
    // Row 3's argmax moves to another token.
    let row = &mut values[3 * 64..4 * 64];
    let best = (0..64).max_by(|&x, &y| row[x].total_cmp(&row[y])).unwrap();
    row[(best + 1) % 64] = row[best] + 5.0;
    call.store(&values);
    let ig = call.intercepted();
    let mut req = request(&ig, CheckMode::Full, 0);
    req.logits_topk = Some(5);
    let o = run(&backend, &req);
    let l = o.logits.unwrap();
    assert!(!l.top1_agree && l.kl > 1e-3, "{l:?}");
    assert_eq!(o.logits_rows[0].row, 3);
}

#[test]
fn full_queue_drops_and_counts_and_errors_are_skips() {
    let backend = HostBackend::new(1);
    let mut call = Call::fp8(8, 8, 16, 1);
    call.produce_honest();
    let ig = call.intercepted();
    let req = request(&ig, CheckMode::Full, 0);
    for _ in 0..3 {
        backend.after_call(&req, PreCall::default()).unwrap();
    }
    assert_eq!(backend.dropped(), 2);
    let mut out = Vec::new();
    backend.poll(&mut out);
    assert_eq!(out.len(), 1);

    let observe = request(&ig, CheckMode::Observe, 0);
    assert_eq!(backend.after_call(&observe, PreCall::default()).unwrap_err().0, "host: observe mode");
    let mut null_a = call.intercepted();
    null_a.buffers.a = 0;
    let e = backend.after_call(&request(&null_a, CheckMode::Full, 0), PreCall::default()).unwrap_err();
    assert_eq!(e.0, "host: null a pointer");
    let mut bad = call.intercepted();
    bad.problem.a.ld = 1;
    let e = backend.after_call(&request(&bad, CheckMode::Full, 0), PreCall::default()).unwrap_err();
    assert_eq!(e.0, "host: invalid problem");
    assert_eq!(backend.name(), "host");
}

#[test]
fn sketch_of_a_nonlinear_epilogue_falls_back_to_rows() {
    let mut call = Call::fp8(20, 12, 16, 1);
    call.problem.epilogue.activation = quantshadow_runtime::problem::Activation::Relu;
    call.produce_honest();
    let ig = call.intercepted();
    let o = run(&HostBackend::default(), &request(&ig, CheckMode::Sketch, 0));
    assert_eq!(o.mode, CheckMode::Rows);
    assert!(passes(&call, &o), "{:?}", o.metrics);
}
