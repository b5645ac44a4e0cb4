//! `quantshadow bench gpu`: the reference side's kernels timed on the present GPU.
//!
//! Method (the device tool's METHOD.md): random data, warm-up launches, then CUDA events around
//! `reps` back-to-back launches on one stream, median of `trials`. Prints markdown tables:
//! full reference GEMM throughput, sketch check time per call, compare bandwidth against the
//! device's copy bandwidth measured in the same run. cuBLAS / PyTorch production times are
//! measured by tests/gpu/bench_torch.py in the same command; docs/measurements/ puts them side
//! by side.

use quantshadow_runtime::device::abi::{QsGemmDesc, QsMatrixDesc, QsRowSel};
use quantshadow_runtime::device::cuda::CudaRuntime;
use quantshadow_runtime::device::gpu::{CompareRequest, GpuChecker};
use quantshadow_runtime::device::snapshot::SnapshotLayout;
use quantshadow_runtime::device::{DeviceError, GpuRuntime, Stream};
use quantshadow_runtime::formats::Format;
use quantshadow_runtime::problem::{GemmBuffers, GemmProblem, ScaleGranularity, ScaleSpec, Transpose};
use quantshadow_runtime::rng::SplitMix64;
use quantshadow_runtime::sketch::{RowSample, DEFAULT_ROWS_PER_CALL};
use std::sync::Arc;

/// Prints a piece of the report at once (a run cut short by a time limit keeps what it had)
/// and keeps it for the return value.
fn emit(report: &mut String, text: &str) {
    use std::io::Write;
    print!("{text}");
    let _ = std::io::stdout().flush();
    report.push_str(text);
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Milliseconds per launch of `f`: median over trials of (events around `reps` launches)/reps.
fn time_ms(
    rt: &dyn GpuRuntime,
    reps: u32,
    trials: u32,
    mut f: impl FnMut() -> Result<(), DeviceError>,
) -> Result<f64, DeviceError> {
    let s = Stream::default();
    for _ in 0..3 {
        f()?;
    }
    rt.synchronize(s)?;
    let (start, end) = (rt.create_event()?, rt.create_event()?);
    let mut samples = Vec::new();
    for _ in 0..trials {
        rt.record_event(start, s)?;
        for _ in 0..reps {
            f()?;
        }
        rt.record_event(end, s)?;
        rt.synchronize(s)?;
        samples.push(rt.elapsed_ms(start, end)? as f64 / reps as f64);
    }
    Ok(median(samples))
}

/// Random finite codes of `format`, fast enough for gigabyte buffers: random words with the
/// top exponent bit cleared (8-bit floats: never NaN/Inf) or the exponent pinned near 1
/// (16/32-bit floats: magnitudes in [0.5, 1) with random signs). Never all zeros.
fn random_bytes(bytes: usize, seed: u64, format: Format) -> Vec<u8> {
    let mut rng = SplitMix64::new(seed);
    let mut out = vec![0u8; bytes.div_ceil(8) * 8];
    for chunk in out.chunks_exact_mut(8) {
        let w = rng.next_u64();
        let v = match format {
            Format::E4m3fn | Format::E4m3fnuz | Format::E5m2 | Format::E5m2fnuz => w & 0xBFBF_BFBF_BFBF_BFBF,
            Format::Bf16 => (w & 0x807F_807F_807F_807F) | 0x3F00_3F00_3F00_3F00,
            Format::F16 => (w & 0x83FF_83FF_83FF_83FF) | 0x3800_3800_3800_3800,
            Format::F32 => (w & 0x807F_FFFF_807F_FFFF) | 0x3F00_0000_3F00_0000,
            _ => w | 0x1111_1111_1111_1111,
        };
        chunk.copy_from_slice(&v.to_le_bytes());
    }
    out.truncate(bytes);
    out
}

pub fn run(
    only: &[String],
    ring_slots: u32,
    probe_counts: &[u32],
    sketch_m: &[u64],
) -> Result<String, String> {
    for s in only {
        if !["copy", "reference", "sketch", "compare"].contains(&s.as_str()) {
            return Err(format!("unknown section {s:?} (copy, reference, sketch, compare)"));
        }
    }
    let want = |s: &str| only.iter().any(|o| o == s);
    let cuda = CudaRuntime::load().map_err(|e| e.to_string())?;
    cuda.activate_primary_context(0).map_err(|e| e.to_string())?;
    let checker = GpuChecker::new(Arc::new(cuda), ring_slots).map_err(|e| e.to_string())?;
    let rt = checker.runtime().clone();
    let mut report = String::new();
    emit(
        &mut report,
        &format!(
            "GPU: {} ({}, {} SMs), results ring of {ring_slots} slots\n\n",
            checker.info.name, checker.info.arch, checker.info.multiprocessors
        ),
    );

    // Copy bandwidth: also the yardstick of the compare section.
    let mut copy_gbs = f64::NAN;
    if want("copy") || want("compare") {
        let bytes = 1usize << 30;
        let (src, dst) = (
            checker.alloc(bytes).map_err(|e| e.to_string())?,
            checker.alloc(bytes).map_err(|e| e.to_string())?,
        );
        let copy_ms =
            time_ms(rt.as_ref(), 5, 5, || rt.copy_async(dst.ptr, src.ptr, bytes, Stream::default()))
                .map_err(|e| e.to_string())?;
        copy_gbs = 2.0 * bytes as f64 / (copy_ms * 1e-3) / 1e9;
        emit(&mut report, &format!("Device copy bandwidth (read + write): {copy_gbs:.0} GB/s\n\n"));
        drop((src, dst));
    }

    if want("reference") {
        // Full reference GEMM throughput.
        emit(&mut report, "| full reference | M x N x K | ms | TFLOP/s |\n| --- | --- | --- | --- |\n");
        for (a, b, m, n, k) in [
            (Format::Bf16, Format::Bf16, 4096u64, 4096u64, 4096u64),
            (Format::E4m3fn, Format::E4m3fn, 4096, 4096, 4096),
            (Format::Bf16, Format::Bf16, 4096, 14336, 4096),
            (Format::Bf16, Format::Bf16, 4096, 4096, 14336),
            (Format::E4m3fn, Format::E4m3fn, 4096, 14336, 4096),
        ] {
            let mut p = GemmProblem::row_major(m, n, k, a, b, Format::Bf16);
            if a.bits() == 8 {
                p.a_scale = Some(ScaleSpec::new(ScaleGranularity::PerOuter, Format::F32));
                p.b_scale = Some(ScaleSpec::new(ScaleGranularity::PerOuter, Format::F32));
            }
            let up = |bytes: usize, seed, f| {
                checker.upload(&random_bytes(bytes, seed, f)).map_err(|e| e.to_string())
            };
            let a_buf = up(a.bytes_for((m * k) as usize), 1, a)?;
            let b_buf = up(b.bytes_for((k * n) as usize), 2, b)?;
            let sa = up((m * 4) as usize, 3, Format::F32)?;
            let sb = up((n * 4) as usize, 4, Format::F32)?;
            let bufs = GemmBuffers {
                a: a_buf.ptr,
                b: b_buf.ptr,
                a_scale: sa.ptr,
                b_scale: sb.ptr,
                ..Default::default()
            };
            let out = checker.alloc((m * n * 4) as usize).map_err(|e| e.to_string())?;
            let mut bufs = bufs;
            bufs.d = out.ptr;
            let g = QsGemmDesc::from_problem(&p, &bufs).map_err(|e| e.to_string())?;
            let ms =
                time_ms(rt.as_ref(), 3, 5, || checker.reference(&g, None, &out, n, false, Stream::default()))
                    .map_err(|e| e.to_string())?;
            let tflops = 2.0 * (m * n * k) as f64 / (ms * 1e-3) / 1e12;
            emit(&mut report, &format!("| {a}x{b} | {m}x{n}x{k} | {ms:.3} | {tflops:.1} |\n"));
        }
    }

    // Checks back to back with nothing between them: an early start would overlap a check with
    // the one before it, which production never does (a GEMM comes between). Timed in order; the
    // early start's gain is measured behind real GEMMs (tests/gpu/overhead_gemm.py under the shim).
    let early = checker.early_start();
    checker.set_early_start(false);
    for &probes in probe_counts.iter().filter(|_| want("sketch")) {
        // Sketch check per call (weight projection done once, outside the timing).
        emit(&mut report, &format!(
            "\n| sketch check (k = {probes}, {DEFAULT_ROWS_PER_CALL} rows/call) | formats | M | N x K | in place, us per call | in place, epoch counted on the device, us | kernel | general kernel in place, us | detached: copy on the caller's stream, us | detached: check over the copy, us | split: projections on the caller's stream, us | split: finishing (side stream), us |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
        ));
        for (a, d) in [(Format::Bf16, Format::Bf16), (Format::E4m3fn, Format::Bf16)] {
            for (n, k) in [(4096u64, 4096u64), (14336, 4096), (4096, 14336), (128256, 4096)] {
                for &m in sketch_m {
                    let mut p = GemmProblem::row_major(m, n, k, a, a, d);
                    if a.bits() == 8 {
                        p.a_scale = Some(ScaleSpec::new(ScaleGranularity::Tensor, Format::F32));
                        p.b_scale = Some(ScaleSpec::new(ScaleGranularity::Tensor, Format::F32));
                    }
                    let up = |bytes: usize, seed, f| {
                        checker.upload(&random_bytes(bytes, seed, f)).map_err(|e| e.to_string())
                    };
                    let a_buf = up(a.bytes_for((m * k) as usize), 5, a)?;
                    let b_buf = up(a.bytes_for((k * n) as usize), 6, a)?;
                    let d_buf = up(d.bytes_for((m * n) as usize), 7, d)?;
                    let sa = up(4, 8, Format::F32)?;
                    let sb = up(4, 9, Format::F32)?;
                    let bufs = GemmBuffers {
                        a: a_buf.ptr,
                        b: b_buf.ptr,
                        d: d_buf.ptr,
                        a_scale: sa.ptr,
                        b_scale: sb.ptr,
                        ..Default::default()
                    };
                    let g = QsGemmDesc::from_problem(&p, &bufs).map_err(|e| e.to_string())?;
                    let weight = checker.sketch_weight(&g, a, d, 42, probes).map_err(|e| e.to_string())?;
                    let sample = RowSample::new(42, m, DEFAULT_ROWS_PER_CALL);
                    let scratch = checker
                        .sketch_scratch(sample.count.min(m), k, n, probes, false)
                        .map_err(|e| e.to_string())?;
                    let epoch = checker.alloc_zeroed(8).map_err(|e| e.to_string())?;
                    // Drain the ring between timings so it never fills.
                    // Resolved once, as the shim's per-call path does: each call is one launch.
                    // As the shim's eager calls, the host counts the row epoch: each call takes
                    // the next rows (not the same, L2-resident ones) and loads no counter first.
                    let rows = QsRowSel::eager(&sample, 0);
                    let mut prepared = checker
                        .prepare_sketch_check(&g, rows, &weight, &scratch, a, d, (1, 0), false)
                        .map_err(|e| e.to_string())?;
                    let ms = time_ms(rt.as_ref(), 50, 5, || {
                        prepared.params.rows.next_epoch();
                        checker.launch_prepared(&prepared, Stream::default())
                    })
                    .map_err(|e| e.to_string())?;
                    while checker.with_ring(|r| r.poll()).is_some() {}
                    // Side by side: the epoch counted on the device, as captured checks do (a load
                    // before the rows are drawn, an add at the end).
                    let device_rows = QsRowSel::sample(&sample, epoch.ptr, 0, true);
                    let device_epoch = checker
                        .prepare_sketch_check(&g, device_rows, &weight, &scratch, a, d, (1, 0), false)
                        .map_err(|e| e.to_string())?;
                    let device_ms = time_ms(rt.as_ref(), 50, 5, || {
                        checker.launch_prepared(&device_epoch, Stream::default())
                    })
                    .map_err(|e| e.to_string())?;
                    while checker.with_ring(|r| r.poll()).is_some() {}
                    // The general kernel on the same call, side by side, where the lean one ran.
                    let lean = checker.sketch_takes_lean(&g, &weight, rows.count, false);
                    let general = if lean {
                        checker.set_lean_sketch(false);
                        let general =
                            checker.prepare_sketch_check(&g, rows, &weight, &scratch, a, d, (1, 0), false);
                        checker.set_lean_sketch(true);
                        let mut general = general.map_err(|e| e.to_string())?;
                        let ms = time_ms(rt.as_ref(), 50, 5, || {
                            general.params.rows.next_epoch();
                            checker.launch_prepared(&general, Stream::default())
                        })
                        .map_err(|e| e.to_string())?;
                        while checker.with_ring(|r| r.poll()).is_some() {}
                        format!("{:.1}", ms * 1e3)
                    } else {
                        "-".into()
                    };
                    // Split (eager calls that take the lean check): the projections, which the
                    // caller's stream pays, and the finishing, which runs on a side stream.
                    let (proj_us, fin_us) = if lean {
                        let entries =
                            checker.sketch_entries(a, a, d, weight.kp).map_err(|e| e.to_string())?;
                        let layout =
                            quantshadow_runtime::device::abi::SplitLayout::new(rows.count, weight.kp);
                        let buffer =
                            checker.alloc_zeroed(layout.bytes() as usize).map_err(|e| e.to_string())?;
                        let split_scratch = checker
                            .sketch_scratch(sample.count.min(m), k, n, probes, false)
                            .map_err(|e| e.to_string())?;
                        let (mut project, finish) = checker
                            .prepare_split_check(
                                entries,
                                &g,
                                rows,
                                &weight,
                                &split_scratch,
                                buffer.ptr,
                                (1, 0),
                            )
                            .map_err(|e| e.to_string())?;
                        let proj_ms = time_ms(rt.as_ref(), 50, 5, || {
                            project.params.rows.next_epoch();
                            checker.launch_prepared(&project, Stream::default())
                        })
                        .map_err(|e| e.to_string())?;
                        let fin_ms = time_ms(rt.as_ref(), 50, 5, || {
                            checker.launch_prepared(&finish, Stream::default())
                        })
                        .map_err(|e| e.to_string())?;
                        while checker.with_ring(|r| r.poll()).is_some() {}
                        (format!("{:.1}", proj_ms * 1e3), format!("{:.1}", fin_ms * 1e3))
                    } else {
                        ("-".into(), "-".into())
                    };
                    // Detached (QUANTSHADOW_SKETCH_DETACH, the shim's default): what the caller's
                    // stream pays (the copy kernel) and the check over the copy, apart.
                    let (copy_us, check_us) =
                        match SnapshotLayout::new(&g, sample.count, checker.info.multiprocessors, u64::MAX) {
                            Ok(layout) => {
                                let snap = checker.alloc(layout.bytes as usize).map_err(|e| e.to_string())?;
                                let det_scratch = checker
                                    .sketch_scratch(sample.count.min(m), k, n, probes, false)
                                    .map_err(|e| e.to_string())?;
                                // As the shim's eager calls: the host counts the epoch, so each copy
                                // takes the next rows (not the same, L2-resident ones).
                                let (mut copy, check) = checker
                                    .prepare_detached(
                                        &g,
                                        &layout,
                                        QsRowSel::eager(&sample, 0),
                                        snap.ptr,
                                        0,
                                        &weight,
                                        &det_scratch,
                                        (1, 0),
                                        false,
                                    )
                                    .map_err(|e| e.to_string())?;
                                let copy_ms = time_ms(rt.as_ref(), 50, 5, || {
                                    copy.advance_epoch();
                                    checker.launch_copy(&copy, Stream::default())
                                })
                                .map_err(|e| e.to_string())?;
                                let check_ms = time_ms(rt.as_ref(), 50, 5, || {
                                    checker.launch_prepared(&check, Stream::default())
                                })
                                .map_err(|e| e.to_string())?;
                                while checker.with_ring(|r| r.poll()).is_some() {}
                                (format!("{:.1}", copy_ms * 1e3), format!("{:.1}", check_ms * 1e3))
                            }
                            Err(e) => (format!("({e})"), "-".into()),
                        };
                    emit(
                        &mut report,
                        &format!(
                            "| sketch | {a}->{d} | {m} | {n}x{k} | {:.1} | {:.1} | {} | {general} | {copy_us} | {check_us} | {proj_us} | {fin_us} |\n",
                            ms * 1e3,
                            device_ms * 1e3,
                            if lean { "lean" } else { "general" }
                        ),
                    );
                }
            }
        }
    }

    checker.set_early_start(early);

    if want("compare") {
        // Compare bandwidth: bf16 D (4096 x 14336) against its f32 reference.
        let (m, n) = (4096u64, 14336u64);
        let d_buf = checker
            .upload(&random_bytes((m * n * 2) as usize, 10, Format::Bf16))
            .map_err(|e| e.to_string())?;
        let r_buf = checker
            .upload(&random_bytes((m * n * 4) as usize, 11, Format::F32))
            .map_err(|e| e.to_string())?;
        let layout = quantshadow_runtime::problem::MatrixLayout::packed(
            Format::Bf16,
            quantshadow_runtime::problem::Order::RowMajor,
            m,
            n,
        );
        let d_desc = QsMatrixDesc::new(&layout, d_buf.ptr, Transpose::N, m, n, 1);
        let scratch = checker.compare_scratch(m, n, false).map_err(|e| e.to_string())?;
        let request = CompareRequest {
            d: d_desc,
            m,
            n,
            rows: QsRowSel::all(m),
            reference: r_buf.ptr,
            ref_ld: n,
            logits_topk: None,
            kind: quantshadow_runtime::device::abi::CHECK_FULL,
            tag: (1, 0),
        };
        let prepared = checker.prepare_compare(&request, &scratch).map_err(|e| e.to_string())?;
        let ms = time_ms(rt.as_ref(), 20, 5, || checker.launch_prepared(&prepared, Stream::default()))
            .map_err(|e| e.to_string())?;
        while checker.with_ring(|r| r.poll()).is_some() {}
        let gbs = (m * n * 6) as f64 / (ms * 1e-3) / 1e9;
        emit(
            &mut report,
            &format!(
            "\nCompare (bf16 D vs f32 reference, {m}x{n}): {ms:.3} ms, {gbs:.0} GB/s = {:.2} of copy bandwidth\n",
            gbs / copy_gbs
        ),
        );
    }
    Ok(report)
}
