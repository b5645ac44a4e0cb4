use super::*;
use crate::formats::Format;
use crate::inject::{apply_output_fault, plan_call, prepare_scale_fault, CallRewrite, FaultClass, Operand};
use crate::oracle::{decode_output, OracleOutput};
use crate::problem::{MatrixLayout, Order, ScaleGranularity, ScaleSpec, ScaleStorage, Transpose};
use crate::quantize::random_inputs;

fn block(o: u32, i: u32) -> ScaleSpec {
    ScaleSpec::new(ScaleGranularity::Block { outer: o, inner: i }, Format::F32)
}

fn fp8(m: u64, n: u64, k: u64, a: Option<ScaleSpec>, b: Option<ScaleSpec>) -> GemmProblem {
    let mut p = GemmProblem::row_major(m, n, k, Format::E4m3fn, Format::E4m3fn, Format::Bf16);
    p.a_scale = a;
    p.b_scale = b;
    p
}

fn full(p: &GemmProblem, inputs: &HostInputs) -> OracleOutput {
    reference_gemm(p, inputs, &OracleOptions::default()).unwrap()
}

/// Rows `rows` (global) of a full batch-1 output, as production hands them to `diagnose`.
fn rows_of(out: &OracleOutput, rows: &[u64]) -> Vec<(u64, Vec<f64>)> {
    rows.iter().map(|&r| (r, out.row(0, r as usize).unwrap().to_vec())).collect()
}

fn sample_rows(m: u64) -> Vec<u64> {
    (0..m).step_by(3).collect()
}

fn expect(p: &GemmProblem, inputs: &HostInputs, prod: &OracleOutput, id: &str) -> Diagnosis {
    let d = diagnose(p, inputs, &rows_of(prod, &sample_rows(p.m))).unwrap();
    let e = d.explanation.as_ref().unwrap_or_else(|| panic!("no explanation for {id} on {p}: {}", d.text));
    // An output that two readings produce identically (A or B read as fnuz: both exactly 0.5x)
    // names the first and lists the other as equivalent.
    let named = e.reading.id == id || d.equivalent.iter().any(|r| r.id == id);
    assert!(named, "{id} expected on {p}: {}", d.text);
    assert!(d.text.starts_with("production matches the reference with"), "{}", d.text);
    assert!(d.recommendation.is_some());
    d
}

fn with_scale_fault(p: &GemmProblem, class: FaultClass, seed: u64) -> (HostInputs, OracleOutput) {
    let inputs = random_inputs(p, seed).unwrap();
    let CallRewrite::ReplaceScale { operand, .. } = plan_call(p, class).unwrap() else { panic!() };
    let mut faulted = inputs.clone();
    let slot = match operand {
        Operand::A => &mut faulted.a_scale,
        Operand::B => &mut faulted.b_scale,
    };
    *slot = Some(prepare_scale_fault(p, class, operand, slot.as_ref().unwrap()).unwrap());
    let prod = full(p, &faulted);
    (inputs, prod)
}

#[test]
fn names_transposed_scales() {
    // A 1x128 (non-square grid 64x4), column-major declared A scales, and B 128x128 alone.
    let cases = [
        (fp8(64, 64, 512, Some(block(1, 128)), Some(block(128, 128))), "a-scales-inner-major"),
        (
            fp8(48, 64, 384, Some(block(1, 128).with_storage(ScaleStorage::InnerMajor)), None),
            "a-scales-outer-major",
        ),
        (fp8(32, 256, 384, None, Some(block(128, 128))), "b-scales-inner-major"),
    ];
    for (p, id) in cases {
        let (inputs, prod) = with_scale_fault(&p, FaultClass::ScaleTranspose, 21);
        let d = expect(&p, &inputs, &prod, id);
        assert!(d.declared.metrics.cosine < 0.99, "{}", d.text);
        assert!(d.text.contains("scales read"), "{}", d.text);
    }
}

#[test]
fn names_ignored_scales() {
    let p = fp8(40, 64, 256, Some(block(1, 128)), Some(block(128, 128)));
    let (inputs, prod) = with_scale_fault(&p, FaultClass::ScaleIgnore, 22);
    expect(&p, &inputs, &prod, "a-scales-ignored");
    let vectors = fp8(24, 40, 128, None, Some(ScaleSpec::new(ScaleGranularity::PerOuter, Format::F32)));
    let (inputs, prod) = with_scale_fault(&vectors, FaultClass::ScaleIgnore, 23);
    expect(&vectors, &inputs, &prod, "b-scales-ignored");
}

#[test]
fn names_fn_as_fnuz_with_its_twin() {
    let p = fp8(32, 48, 256, Some(block(1, 128)), Some(block(128, 128)));
    let inputs = random_inputs(&p, 24).unwrap();
    let honest = full(&p, &inputs);
    let mut d = crate::inject::tests_support::encode_output(&p, &honest);
    apply_output_fault(&p, FaultClass::FnAsFnuz, &mut d, 0).unwrap();
    let prod = decode_output(&p, &d).unwrap();
    let diag = expect(&p, &inputs, &prod, "a-as-e4m3fnuz");
    assert_eq!(diag.declared.metrics.norm_ratio, 0.5);
    assert!(diag.declared.metrics.cosine > 0.999_999);
    assert_eq!(diag.equivalent.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), ["b-as-e4m3fnuz"]);
    assert!(diag.text.contains("equally explained by: B read as e4m3fnuz"), "{}", diag.text);
    // e5m2 read as e5m2fnuz, planted through the oracle on B only.
    let mut q = p.clone();
    q.b.format = Format::E5m2;
    let inputs = random_inputs(&q, 25).unwrap();
    let mut wrong = q.clone();
    wrong.b.format = Format::E5m2fnuz;
    let prod = full(&wrong, &inputs);
    let d = expect(&q, &inputs, &prod, "b-as-e5m2fnuz");
    assert_eq!(d.explanation.unwrap().reading.id, "a-as-e4m3fnuz");
}

#[test]
fn names_a_transpose_not_applied_square_and_non_square() {
    // Square: M = K, A declared transposed, the library reads it as stored.
    let mut p = GemmProblem::row_major(64, 48, 64, Format::Bf16, Format::Bf16, Format::Bf16);
    p.trans_a = Transpose::T;
    let inputs = random_inputs(&p, 26).unwrap();
    let CallRewrite::FlipTranspose { problem: called, .. } = plan_call(&p, FaultClass::NoTranspose).unwrap()
    else {
        panic!()
    };
    expect(&p, &inputs, &full(&called, &inputs), "a-transpose-flipped");
    // Non-square where the ld allows it: A stored K x M = 64 x 32 row-major with ld 64.
    let mut q = GemmProblem::row_major(32, 40, 64, Format::Bf16, Format::Bf16, Format::Bf16);
    q.trans_a = Transpose::T;
    q.a = MatrixLayout { ld: 64, ..MatrixLayout::packed(Format::Bf16, Order::RowMajor, 64, 32) };
    let inputs = random_inputs(&q, 27).unwrap();
    let mut wrong = q.clone();
    wrong.trans_a = Transpose::N;
    expect(&q, &inputs, &full(&wrong, &inputs), "a-transpose-flipped");
    // B: N = K, transposed weight read as stored.
    let mut r = fp8(24, 128, 128, Some(ScaleSpec::new(ScaleGranularity::PerOuter, Format::F32)), None);
    r.trans_b = Transpose::T;
    let inputs = random_inputs(&r, 28).unwrap();
    let mut wrong = r.clone();
    wrong.trans_b = Transpose::N;
    expect(&r, &inputs, &full(&wrong, &inputs), "b-transpose-flipped");
}

#[test]
fn names_swapped_scales_and_block_size() {
    let v = || Some(ScaleSpec::new(ScaleGranularity::PerOuter, Format::F32));
    let p = fp8(48, 48, 128, v(), v());
    let inputs = random_inputs(&p, 29).unwrap();
    let mut swapped = inputs.clone();
    std::mem::swap(&mut swapped.a_scale, &mut swapped.b_scale);
    expect(&p, &inputs, &full(&p, &swapped), "ab-scales-swapped");
    // The quantizer wrote 1x32 groups... read by a GEMM using 1x128: declared 1x32, the
    // library applies the first K/128 entries per row as 1x128 blocks.
    let q = fp8(32, 64, 256, Some(block(1, 32)), None);
    let inputs = random_inputs(&q, 30).unwrap();
    let mut wrong = q.clone();
    wrong.a_scale = Some(block(1, 128));
    expect(&q, &inputs, &full(&wrong, &inputs), "a-scale-block-1x128");
}

#[test]
fn honest_output_gets_no_false_explanation() {
    let problems = [
        fp8(64, 64, 512, Some(block(1, 128)), Some(block(128, 128))),
        fp8(
            48,
            48,
            128,
            Some(ScaleSpec::new(ScaleGranularity::PerOuter, Format::F32)),
            Some(ScaleSpec::new(ScaleGranularity::PerOuter, Format::F32)),
        ),
        {
            let mut p = GemmProblem::row_major(64, 48, 64, Format::Bf16, Format::Bf16, Format::Bf16);
            p.trans_a = Transpose::T;
            p
        },
    ];
    for p in problems {
        let inputs = random_inputs(&p, 31).unwrap();
        let d = diagnose(&p, &inputs, &rows_of(&full(&p, &inputs), &sample_rows(p.m))).unwrap();
        assert!(d.explanation.is_none(), "{p}: {}", d.text);
        assert_eq!(d.ranked[0].reading.kind, ReadingKind::Declared, "{}", d.text);
        assert!(d.text.starts_with("the declared contract is the best reading"), "{}", d.text);
        assert!(d.ranked.len() >= 2);
    }
}

#[test]
fn garbage_is_explained_by_nothing() {
    let p = fp8(32, 48, 256, Some(block(1, 128)), Some(block(128, 128)));
    let inputs = random_inputs(&p, 32).unwrap();
    let mut d = crate::inject::tests_support::encode_output(&p, &full(&p, &inputs));
    apply_output_fault(&p, FaultClass::Garbage, &mut d, 3).unwrap();
    let prod = decode_output(&p, &d).unwrap();
    let diag = diagnose(&p, &inputs, &rows_of(&prod, &sample_rows(p.m))).unwrap();
    assert!(diag.explanation.is_none());
    assert!(diag.text.starts_with("no reading of the contract explains production"), "{}", diag.text);
    // Zeros: nothing explains them either, and the text does not call the declared reading fine.
    let zeros: Vec<(u64, Vec<f64>)> = (0..p.m).map(|r| (r, vec![0.0; p.n as usize])).collect();
    let diag = diagnose(&p, &inputs, &zeros).unwrap();
    assert!(diag.explanation.is_none());
    assert!(
        diag.text.starts_with(
            "no reading of the contract explains production: declared gives cosine 0.0000, norm ratio 0.000"
        ),
        "{}",
        diag.text
    );
}

#[test]
fn error_map_finds_tile_rows_from_m_56() {
    let mut per_call = vec![];
    for m in [16u64, 32, 48, 56, 64, 80] {
        let p = fp8(m, 256, 128, Some(block(1, 128)), Some(block(128, 128)));
        let inputs = random_inputs(&p, m).unwrap();
        let honest = full(&p, &inputs);
        let mut d = crate::inject::tests_support::encode_output(&p, &honest);
        apply_output_fault(&p, FaultClass::TileRows, &mut d, 0).unwrap();
        let prod = decode_output(&p, &d).unwrap();
        let rows: Vec<u64> = (0..m).collect();
        let map = error_map(&prod.values, &honest.values, &rows, p.n as usize, &p);
        if m >= 56 {
            let expected: Vec<u64> = (15..m).step_by(16).collect();
            assert_eq!(map.bad_rows, expected, "M = {m}");
            assert_eq!(map.row_period, Some(RowPeriod { period: 16, offset: 15, first_row: 15 }), "M = {m}");
            assert!(map.summary.contains("every 16th row (i = 15 mod 16) from row 15"), "{}", map.summary);
            assert_eq!(map.bad_a_scale_blocks.as_deref(), Some(&expected[..]));
            assert_eq!(map.bad_col_blocks, [0, 1]);
        } else {
            assert!(map.bad_rows.is_empty() && map.row_period.is_none(), "M = {m}: {}", map.summary);
        }
        per_call.push((m, !map.bad_rows.is_empty()));
    }
    assert_eq!(onset_m(&per_call), Some(56));
    assert_eq!(onset_m(&[(16, true), (64, false)]), None);
}

#[test]
fn error_map_localises_a_bad_column_block() {
    let p = fp8(16, 384, 128, None, Some(block(128, 128)));
    let inputs = random_inputs(&p, 40).unwrap();
    let honest = full(&p, &inputs);
    let mut prod = honest.values.clone();
    for i in 0..16 {
        for j in 128..256 {
            prod[i * 384 + j] *= -1.0;
        }
    }
    let rows: Vec<u64> = (0..16).collect();
    let map = error_map(&prod, &honest.values, &rows, 384, &p);
    assert_eq!(map.bad_col_blocks, [1]);
    assert_eq!(map.bad_b_scale_blocks.as_deref(), Some(&[1u64][..]));
    assert_eq!(map.bad_a_scale_blocks, None);
}

#[test]
fn scale_layout_in_words() {
    let p =
        fp8(57, 256, 4096, Some(block(1, 128)), Some(block(128, 128).with_storage(ScaleStorage::InnerMajor)));
    let s = scale_layout_summary(&p);
    assert!(s.starts_with("A scales: 1x128 blocks, grid 57x32, f32, OuterMajor, ld 32"), "{s}");
    assert!(s.contains("B scales: 128x128 blocks, grid 2x32, f32, InnerMajor, ld 2"), "{s}");
    let q = fp8(8, 8, 64, None, Some(ScaleSpec::new(ScaleGranularity::PerOuter, Format::F32)));
    assert!(scale_layout_summary(&q).contains("A scales: none; B scales: per-column (1x64), grid 8x1"));
}

#[test]
fn alternatives_have_unique_ids() {
    let mut p = fp8(64, 256, 512, Some(block(1, 128)), Some(block(128, 128)));
    p.trans_b = Transpose::T;
    p.b = MatrixLayout::packed(Format::E4m3fn, Order::RowMajor, 256, 512);
    let alts = alternatives(&p);
    let mut ids: Vec<&str> = alts.iter().map(|(r, _)| r.id.as_str()).collect();
    assert_eq!(ids[0], "declared");
    let n = ids.len();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), n);
    for want in [
        "a-scales-inner-major",
        "b-scales-inner-major",
        "a-scales-ignored",
        "a-as-e4m3fnuz",
        "ab-scales-swapped",
        "a-scale-block-1x32",
    ] {
        assert!(ids.contains(&want), "{want} missing from {ids:?}");
    }
}

#[test]
fn names_fn_as_fnuz_when_negative_zero_bytes_turn_nan_under_the_reading() {
    // PyTorch's e4m3fn data holds -0 bytes (0x80) wherever small values round to zero; read as
    // e4m3fnuz they are NaN, and every output of their rows too. Production (0.5x, no NaN) is
    // still explained by the fnuz reading on its finite values.
    let p = fp8(24, 40, 128, None, None);
    let mut inputs = random_inputs(&p, 77).unwrap();
    for i in (0..inputs.a.len()).step_by(997) {
        inputs.a[i] = 0x80;
    }
    let honest = full(&p, &inputs);
    let mut d = crate::inject::tests_support::encode_output(&p, &honest);
    apply_output_fault(&p, FaultClass::FnAsFnuz, &mut d, 0).unwrap();
    let prod = decode_output(&p, &d).unwrap();
    let diag = expect(&p, &inputs, &prod, "b-as-e4m3fnuz");
    let e = diag.explanation.as_ref().unwrap();
    assert_eq!(e.reading.id, "b-as-e4m3fnuz", "B has no -0 bytes: its reading invents nothing");
    let a = diag.ranked.iter().find(|r| r.reading.id == "a-as-e4m3fnuz").unwrap();
    assert!(a.invented > 0 && a.missed() == 0 && a.explains(), "{a:?}");
    // With -0 bytes in both operands, each fnuz reading invents NaN: it still explains.
    for i in (0..inputs.b.len()).step_by(997) {
        inputs.b[i] = 0x80;
    }
    let honest = full(&p, &inputs);
    let mut d = crate::inject::tests_support::encode_output(&p, &honest);
    apply_output_fault(&p, FaultClass::FnAsFnuz, &mut d, 0).unwrap();
    let prod = decode_output(&p, &d).unwrap();
    let diag = expect(&p, &inputs, &prod, "a-as-e4m3fnuz");
    assert!(
        diag.text.contains("turns") && diag.text.contains("NaN/Inf that production computed"),
        "{}",
        diag.text
    );
    // A reading that leaves almost nothing finite is not an explanation, whatever its cosine.
    let garbage_nan = ReadingResult {
        reading: diag.ranked[0].reading.clone(),
        metrics: crate::metrics::Metrics { count: 1000, ..diag.ranked[0].metrics },
        nonfinite_mismatch: 950,
        invented: 950,
    };
    assert!(garbage_nan.key() > diag.declared.key());
}
