use super::*;
use crate::metrics::compare_matrix;
use crate::oracle::{decode_output, reference_gemm, OracleOptions, OracleOutput};
use crate::problem::{HostInputs, ScaleGranularity, Transpose};
use crate::quantize::random_inputs;

/// D bytes laid out as `p.d` says, from oracle values.
pub(crate) fn encode_output(p: &GemmProblem, out: &OracleOutput) -> Vec<u8> {
    let f = p.d.format;
    let mut d = vec![0u8; f.bytes_for(p.d.required_elements(p.m, p.n, p.batch) as usize)];
    for b in 0..p.batch {
        for (pos, &i) in out.rows.iter().enumerate() {
            for (j, v) in out.row(b, pos).unwrap().iter().enumerate() {
                f.store_code(&mut d, GemmProblem::out_offset(&p.d, b, i, j as u64) as usize, f.encode(*v));
            }
        }
    }
    d
}

fn fp8_problem(m: u64, n: u64, k: u64, a: Option<ScaleSpec>, b: Option<ScaleSpec>) -> GemmProblem {
    let mut p = GemmProblem::row_major(m, n, k, Format::E4m3fn, Format::E4m3fn, Format::Bf16);
    p.a_scale = a;
    p.b_scale = b;
    p
}

fn run(p: &GemmProblem, inputs: &HostInputs) -> OracleOutput {
    reference_gemm(p, inputs, &OracleOptions::default()).unwrap()
}

fn setup(p: &GemmProblem, seed: u64) -> (HostInputs, Vec<u8>, Vec<f64>) {
    let inputs = random_inputs(p, seed).unwrap();
    let out = run(p, &inputs);
    assert!(out.values.iter().all(|v| *v != 0.0 && v.is_finite()), "test data must be non-zero");
    (inputs, encode_output(p, &out), out.values)
}

fn metrics_of(p: &GemmProblem, d: &[u8], reference: &[f64]) -> crate::metrics::Metrics {
    let prod = decode_output(p, d).unwrap().values;
    compare_matrix(&prod, reference, (p.batch * p.m) as usize, p.n as usize)
}

fn block(o: u32, i: u32) -> ScaleSpec {
    ScaleSpec::new(ScaleGranularity::Block { outer: o, inner: i }, Format::F32)
}

#[test]
fn parse_targets_and_errors() {
    let s = InjectSpec::parse(" garbage , nan@3,tile-rows@*mlp*, Scale-Ignore@layers.?.q").unwrap();
    assert_eq!(s.entries.len(), 4);
    assert_eq!(s.entries[1], InjectEntry { class: FaultClass::Nan, target: Target::Ordinal(3) });
    assert_eq!(s.entries[2].target, Target::Pattern("*mlp*".into()));
    assert_eq!(s.entries[3].class, FaultClass::ScaleIgnore);
    assert_eq!(s.spec_string(), "garbage,nan@3,tile-rows@*mlp*,scale-ignore@layers.?.q");
    assert_eq!(InjectSpec::parse(&s.spec_string()).unwrap(), s);
    assert!(InjectSpec::parse("").unwrap().entries.is_empty());
    assert!(InjectPlan::from_spec_str("  ").unwrap().is_none());
    let e = InjectSpec::parse("garbage,bogus@2").unwrap_err();
    assert!(matches!(e, InjectError::UnknownClass { ref name, .. } if name == "bogus"));
    assert!(e.to_string().contains("scale-transpose"), "{e}");
    assert!(matches!(InjectSpec::parse("nan,,garbage"), Err(InjectError::EmptyItem { position: 1, .. })));
    assert!(matches!(InjectSpec::parse("nan@"), Err(InjectError::EmptyTarget { .. })));
    assert!(matches!(InjectSpec::parse("nan@1@2"), Err(InjectError::TwoTargets { .. })));
    assert!(matches!(InjectSpec::parse("nan@99999999999999999999999"), Err(InjectError::BadOrdinal { .. })));
    for c in FaultClass::ALL {
        assert_eq!(FaultClass::from_name(c.name()), Some(c));
    }
}

#[test]
fn plan_targets_sites_and_zero_after_first() {
    let plan = InjectPlan::from_spec_str("nan@2,garbage@*.mlp.*,zero-after-first").unwrap().unwrap();
    assert!(plan.banner().contains("FAULT INJECTION ACTIVE"));
    assert!(plan.banner().contains("sites matching '*.mlp.*'"));
    // The first site zero-after-first sees is spared, every other one zeroed.
    let s0 = plan.applies(0, "layers.0.attn.qkv", 0);
    assert!(s0.is_empty());
    let s0_again = plan.applies(0, "layers.0.attn.qkv", 1);
    assert!(s0_again.is_empty());
    let s1 = plan.applies(1, "layers.0.mlp.up", 0);
    assert_eq!(s1.iter().collect::<Vec<_>>(), [FaultClass::Garbage, FaultClass::ZeroAfterFirst]);
    let s2 = plan.applies(2, "layers.1.attn.o", 0);
    assert_eq!(s2.iter().collect::<Vec<_>>(), [FaultClass::ZeroAfterFirst, FaultClass::Nan]);
    assert_ne!(plan.seed(1, 0), plan.seed(1, 1));
    assert!(glob_match(b"a*b?c", b"axxxbyc") && !glob_match(b"a*b?c", b"axxxbc") && glob_match(b"*", b""));
}

#[test]
fn garbage_has_same_rms_and_no_correlation() {
    let p = fp8_problem(64, 96, 256, Some(block(1, 128)), Some(block(128, 128)));
    let (_, mut d, reference) = setup(&p, 1);
    let e = apply_output_fault(&p, FaultClass::Garbage, &mut d, 7).unwrap();
    assert_eq!(e.rows_touched, 64);
    let m = metrics_of(&p, &d, &reference);
    assert!(m.cosine.abs() < 0.1, "cosine {}", m.cosine);
    assert!((m.norm_ratio - 1.0).abs() < 0.1, "norm ratio {}", m.norm_ratio);
    // Deterministic: same seed, same bytes; another seed, other noise.
    let (_, mut d2, _) = setup(&p, 1);
    apply_output_fault(&p, FaultClass::Garbage, &mut d2, 7).unwrap();
    assert_eq!(d, d2);
    let (_, mut d3, _) = setup(&p, 1);
    apply_output_fault(&p, FaultClass::Garbage, &mut d3, 8).unwrap();
    assert_ne!(d, d3);
}

#[test]
fn fn_as_fnuz_is_exactly_half() {
    for d_fmt in [Format::Bf16, Format::F16, Format::F32] {
        let mut p =
            fp8_problem(32, 48, 128, Some(ScaleSpec::new(ScaleGranularity::PerOuter, Format::F32)), None);
        p.d = MatrixLayout::packed(d_fmt, Order::ColMajor, 32, 48);
        let (_, mut d, reference) = setup(&p, 2);
        apply_output_fault(&p, FaultClass::FnAsFnuz, &mut d, 0).unwrap();
        let m = metrics_of(&p, &d, &reference);
        assert_eq!(m.norm_ratio, 0.5, "{d_fmt}");
        assert!(m.cosine > 1.0 - 1e-15, "{d_fmt}: cosine {}", m.cosine);
        let prod = decode_output(&p, &d).unwrap().values;
        assert!(prod.iter().zip(&reference).all(|(p, r)| *p == r * 0.5));
    }
    let mut p = GemmProblem::row_major(8, 8, 8, Format::Int8, Format::Int8, Format::I32);
    p.compute = crate::problem::ComputeType::I32;
    assert!(matches!(plan_call(&p, FaultClass::FnAsFnuz), Err(NotApplicable { .. })));
}

#[test]
fn tile_rows_breaks_exactly_the_tile_boundary_rows_from_m_56() {
    let p = GemmProblem::row_major(64, 40, 64, Format::Bf16, Format::Bf16, Format::Bf16);
    let (_, mut d, reference) = setup(&p, 3);
    let e = apply_output_fault(&p, FaultClass::TileRows, &mut d, 0).unwrap();
    assert_eq!(e.rows_touched, 4);
    let prod = decode_output(&p, &d).unwrap().values;
    let n = p.n as usize;
    let bad: Vec<usize> = (0..p.m as usize)
        .filter(|&i| compare_matrix(&prod[i * n..][..n], &reference[i * n..][..n], 1, n).cosine < 0.99)
        .collect();
    assert_eq!(bad, [15, 31, 47, 63]);
    let small = GemmProblem::row_major(48, 40, 64, Format::Bf16, Format::Bf16, Format::Bf16);
    let (_, mut d, _) = setup(&small, 3);
    let before = d.clone();
    let e = apply_output_fault(&small, FaultClass::TileRows, &mut d, 0).unwrap();
    assert_eq!((e.rows_touched, d == before), (0, true));
    assert!(e.note.unwrap().contains("M = 48"));
}

#[test]
fn nan_is_one_element_and_zero_is_all() {
    let mut p = fp8_problem(24, 40, 64, None, None);
    p.batch = 2;
    p.a.batch_stride = 24 * 64;
    p.b.batch_stride = 0;
    p.d.batch_stride = 24 * 40;
    let (_, mut d, reference) = setup(&p, 4);
    let e = apply_output_fault(&p, FaultClass::Nan, &mut d, 11).unwrap();
    let m = metrics_of(&p, &d, &reference);
    assert_eq!((m.nan_prod, m.introduced_nonfinite()), (1, 1));
    let (b, i, j) = e.nan_at.unwrap();
    assert!(decode_output(&p, &d).unwrap().row(b, i as usize).unwrap()[j as usize].is_nan());
    let (_, mut d, reference) = setup(&p, 4);
    apply_output_fault(&p, FaultClass::ZeroAfterFirst, &mut d, 0).unwrap();
    let m = metrics_of(&p, &d, &reference);
    assert_eq!((m.prod_sq_is_zero(), m.cosine), (true, 0.0));
}

trait ZeroNorm {
    fn prod_sq_is_zero(&self) -> bool;
}
impl ZeroNorm for crate::metrics::Metrics {
    fn prod_sq_is_zero(&self) -> bool {
        self.norm_ratio == 0.0
    }
}

/// Runs the real call with the rewritten scale buffer and checks it changes the output, and
/// that it equals the reference under the reading the class stands for.
fn scale_fault_case(p: &GemmProblem, class: FaultClass, seed: u64) {
    let rewrite = plan_call(p, class).unwrap();
    let CallRewrite::ReplaceScale { operand, .. } = rewrite else { panic!("{rewrite:?}") };
    let inputs = random_inputs(p, seed).unwrap();
    let honest = run(p, &inputs);
    let mut faulted = inputs.clone();
    let slot = match operand {
        Operand::A => &mut faulted.a_scale,
        Operand::B => &mut faulted.b_scale,
    };
    *slot = Some(prepare_scale_fault(p, class, operand, slot.as_ref().unwrap()).unwrap());
    let prod = run(p, &faulted);
    let m = compare_matrix(&prod.values, &honest.values, p.m as usize, p.n as usize);
    assert!(m.cosine < 0.999 || (m.norm_ratio - 1.0).abs() > 0.01, "{class} left {p} unchanged: {m:?}");
    // The same output as the declared call under the alternative reading.
    let mut reading = p.clone();
    let spec = match operand {
        Operand::A => &mut reading.a_scale,
        Operand::B => &mut reading.b_scale,
    };
    *spec = match class {
        FaultClass::ScaleTranspose => Some(flipped_storage(spec.as_ref().unwrap()).unwrap()),
        _ => None,
    };
    assert_eq!(run(&reading, &inputs).values, prod.values, "{class} on {p}");
}

#[test]
fn scale_faults_change_the_output_for_row_column_and_block_scales() {
    let per_row_groups = fp8_problem(64, 64, 512, Some(block(1, 128)), Some(block(128, 128)));
    let column_major = fp8_problem(
        64,
        64,
        512,
        Some(block(1, 128).with_storage(ScaleStorage::InnerMajor)),
        Some(block(128, 128)),
    );
    let blocks = fp8_problem(256, 384, 512, None, Some(block(128, 128)));
    for p in [&per_row_groups, &column_major, &blocks] {
        scale_fault_case(p, FaultClass::ScaleTranspose, 5);
        scale_fault_case(p, FaultClass::ScaleIgnore, 5);
    }
    // Per-row and per-column scale vectors: ignoring them changes the output; transposing a
    // vector is the identity, and the plan says so.
    let vectors = fp8_problem(
        32,
        48,
        128,
        Some(ScaleSpec::new(ScaleGranularity::PerOuter, Format::F32)),
        Some(ScaleSpec::new(ScaleGranularity::PerOuter, Format::F32)),
    );
    scale_fault_case(&vectors, FaultClass::ScaleIgnore, 6);
    let e = plan_call(&vectors, FaultClass::ScaleTranspose).unwrap_err();
    assert!(e.reason.contains("vector"), "{e}");
    let e = plan_call(&fp8_problem(8, 8, 8, None, None), FaultClass::ScaleIgnore).unwrap_err();
    assert!(e.to_string().contains("no scales"));
}

#[test]
fn no_transpose_is_representable_for_square_operands_and_fitting_lds() {
    let mut p = GemmProblem::row_major(64, 32, 64, Format::Bf16, Format::Bf16, Format::Bf16);
    p.trans_a = Transpose::T;
    p.a = MatrixLayout::packed(Format::Bf16, Order::RowMajor, 64, 64);
    let CallRewrite::FlipTranspose { operand, problem } = plan_call(&p, FaultClass::NoTranspose).unwrap()
    else {
        panic!()
    };
    assert_eq!((operand, problem.trans_a), (Operand::A, Transpose::N));
    let (inputs, _, reference) = setup(&p, 9);
    let m = compare_matrix(&run(&problem, &inputs).values, &reference, 64, 32);
    assert!(m.cosine < 0.5, "{m:?}");
    // Non-square, packed: neither operand can be re-read with swapped dimensions.
    let q = GemmProblem::row_major(16, 24, 40, Format::Bf16, Format::Bf16, Format::Bf16);
    let e = plan_call(&q, FaultClass::NoTranspose).unwrap_err();
    assert!(e.reason.contains("ld"), "{e}");
}

#[test]
fn transpose_fault_buffer_makes_the_declared_call_compute_the_flipped_one() {
    // A square operand of each kind: the rewritten buffer read under the declared contract must
    // give exactly what the original buffer gives under the flipped contract.
    for (operand, fmt) in [(Operand::A, Format::Bf16), (Operand::B, Format::E4m3fn)] {
        let mut p = GemmProblem::row_major(48, 48, 48, fmt, fmt, Format::F32);
        p.trans_b = Transpose::T;
        p.b = MatrixLayout::packed(fmt, Order::RowMajor, 48, 48);
        let flipped = flip_transpose(&p, operand).unwrap();
        let (inputs, _, _) = setup(&p, 31);
        let mut faulted = inputs.clone();
        match operand {
            Operand::A => faulted.a = prepare_transpose_fault(&p, operand, &flipped, &inputs.a).unwrap(),
            Operand::B => faulted.b = prepare_transpose_fault(&p, operand, &flipped, &inputs.b).unwrap(),
        }
        let production = run(&p, &faulted).values;
        let expected = run(&flipped, &inputs).values;
        assert_eq!(production, expected, "{operand:?}");
        assert!(compare_matrix(&production, &run(&p, &inputs).values, 48, 48).cosine < 0.5);
    }
    let q = GemmProblem::row_major(8, 8, 8, Format::E2m1, Format::E2m1, Format::Bf16);
    let flipped = flip_transpose(&q, Operand::A).unwrap();
    assert!(prepare_transpose_fault(&q, Operand::A, &flipped, &[0u8; 32]).is_err());
}
