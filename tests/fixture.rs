//! The C fixture BLAS (tests/fixtures/) through its Rust wrapper: decoders and encoders
//! against the Rust ones in `formats.rs`, small GEMMs with exact expected values for every
//! layout, transposition and scale scheme, the epilogue, and each planted fault.
//!
//! Test data are small integers and powers of two, so FP32 accumulation is exact and results
//! compare with `==`. Buffers are pre-filled with 0xFF so that reading padding (NaN, -1 or -6
//! depending on the format) shows up in the result.

use quantshadow_cli::fixture::{self, Fault, FixtureError};
use quantshadow_runtime::formats::Format;
use quantshadow_runtime::problem::{
    Activation, Bias, BiasAxis, Epilogue, GemmProblem, HostInputs, MatrixLayout, Order, Scalar,
    ScaleGranularity, ScaleSpec, ScaleStorage, Transpose,
};
use quantshadow_runtime::rng::SplitMix64;

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// Logical value source: (batch, row, col) -> value.
type Values<'a> = &'a dyn Fn(u64, u64, u64) -> f64;

/// A stored matrix with `pad` extra elements per leading dimension (one more where a packed
/// 4-bit layout needs an even ld) and a batch stride with a gap.
fn layout(format: Format, order: Order, rows: u64, cols: u64, pad: u64) -> MatrixLayout {
    let mut l = MatrixLayout::packed(format, order, rows, cols);
    l.ld += pad;
    if format.bits() == 4 {
        l.ld += l.ld % 2;
    }
    let item = l.required_elements(rows, cols, 1) + pad;
    l.batch_stride = item + item % 2;
    l
}

fn store_exact(format: Format, bytes: &mut [u8], index: u64, value: f64) {
    let code = format.encode(value);
    assert!(same(format.decode_code(code), value), "test value {value} is not exact in {format}");
    format.store_code(bytes, index as usize, code);
}

/// Bytes of a stored matrix whose element (r, c) of batch item b is `value(b, r, c)`.
fn matrix_bytes(l: &MatrixLayout, rows: u64, cols: u64, batch: u64, value: Values) -> Vec<u8> {
    let mut bytes = vec![0xFF; l.format.bytes_for(l.required_elements(rows, cols, batch) as usize)];
    let items = if l.batch_stride == 0 { 1 } else { batch };
    for b in 0..items {
        for r in 0..rows {
            for c in 0..cols {
                store_exact(
                    l.format,
                    &mut bytes,
                    b * l.batch_stride + l.order.offset(r, c, l.ld),
                    value(b, r, c),
                );
            }
        }
    }
    bytes
}

/// A's stored bytes from logical op(A)(b, i, k).
fn a_bytes(p: &GemmProblem, a: Values) -> Vec<u8> {
    let (rows, cols) = p.a_stored_dims();
    let t = p.trans_a == Transpose::T;
    matrix_bytes(&p.a, rows, cols, p.batch, &|b, r, c| if t { a(b, c, r) } else { a(b, r, c) })
}

/// B's stored bytes from logical op(B)(b, k, j).
fn b_bytes(p: &GemmProblem, bv: Values) -> Vec<u8> {
    let (rows, cols) = p.b_stored_dims();
    let t = p.trans_b == Transpose::T;
    matrix_bytes(&p.b, rows, cols, p.batch, &|b, r, c| if t { bv(b, c, r) } else { bv(b, r, c) })
}

/// Scale bytes from grid values `value(batch, outer_block, inner_block)`, placed with the
/// problem model's `entry_index`.
fn scale_bytes(spec: &ScaleSpec, outer: u64, inner: u64, batch: u64, value: Values) -> Vec<u8> {
    let grid = spec.granularity.grid(outer, inner);
    let entries = spec.required_entries(outer, inner, batch) as usize;
    let mut bytes = vec![0xFF; spec.format.bytes_for(entries)];
    let items = if spec.batch_stride == 0 { 1 } else { batch };
    for b in 0..items {
        for ob in 0..grid.0 {
            for ib in 0..grid.1 {
                let index = b * spec.batch_stride + spec.entry_index(ob, ib, grid);
                store_exact(spec.format, &mut bytes, index, value(b, ob, ib));
            }
        }
    }
    bytes
}

/// Per-element scale from grid values, for the test's own reference.
fn element_scale<'a>(
    spec: &'a ScaleSpec,
    outer_extent: u64,
    inner_extent: u64,
    grid: Values<'a>,
) -> impl Fn(u64, u64, u64) -> f64 + 'a {
    move |b, outer, inner| {
        let (bo, bi) = spec.granularity.block_shape(outer_extent, inner_extent);
        let b = if spec.batch_stride == 0 { 0 } else { b };
        grid(b, outer / bo, inner / bi)
    }
}

/// sum_k a(b,i,k) sa(b,i,k) b(b,k,j) sb(b,k,j) in f64, batch-major then row-major.
fn naive(p: &GemmProblem, a: Values, sa: Values, bv: Values, sb: Values) -> Vec<f64> {
    let mut out = Vec::new();
    for b in 0..p.batch {
        for i in 0..p.m {
            for j in 0..p.n {
                out.push((0..p.k).map(|k| a(b, i, k) * sa(b, i, k) * bv(b, k, j) * sb(b, j, k)).sum());
            }
        }
    }
    out
}

fn one(_: u64, _: u64, _: u64) -> f64 {
    1.0
}

/// D as logical values, batch-major then row-major.
fn read_d(p: &GemmProblem, d: &[u8]) -> Vec<f64> {
    assert_eq!(d.len(), p.d.format.bytes_for(p.d.required_elements(p.m, p.n, p.batch) as usize));
    let mut out = Vec::new();
    for b in 0..p.batch {
        for i in 0..p.m {
            for j in 0..p.n {
                out.push(p.d.format.load(d, GemmProblem::out_offset(&p.d, b, i, j) as usize));
            }
        }
    }
    out
}

fn inputs(a: Vec<u8>, b: Vec<u8>) -> HostInputs {
    HostInputs { a, b, ..HostInputs::default() }
}

fn run(p: &GemmProblem, inp: &HostInputs, fault: Fault, seed: u64) -> Vec<f64> {
    let d = fixture::fixture_gemm(p, inp, fault, seed).unwrap_or_else(|e| panic!("{p}: {e}"));
    read_d(p, &d)
}

fn rows_of(v: &[f64], n: u64) -> Vec<Vec<f64>> {
    v.chunks(n as usize).map(<[f64]>::to_vec).collect()
}

/// Same values, NaN equal to NaN, -0 equal to +0.
fn same(x: f64, y: f64) -> bool {
    (x.is_nan() && y.is_nan()) || x == y
}

fn cosine(x: &[f64], y: &[f64]) -> f64 {
    let dot: f64 = x.iter().zip(y).map(|(a, b)| a * b).sum();
    let nx: f64 = x.iter().map(|a| a * a).sum::<f64>().sqrt();
    let ny: f64 = y.iter().map(|a| a * a).sum::<f64>().sqrt();
    dot / (nx * ny)
}

fn rms(x: &[f64]) -> f64 {
    (x.iter().map(|a| a * a).sum::<f64>() / x.len() as f64).sqrt()
}

const A24: [[f64; 4]; 2] = [[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]];
const B43: [[f64; 3]; 4] = [[1.0, 0.0, 2.0], [0.0, 1.0, 0.0], [1.0, 1.0, 1.0], [2.0, 0.0, -1.0]];
/// A24 x B43, by hand.
const D23: [[f64; 3]; 2] = [[12.0, 5.0, 1.0], [28.0, 13.0, 9.0]];

fn a24(_: u64, i: u64, k: u64) -> f64 {
    A24[i as usize][k as usize]
}

fn b43(_: u64, k: u64, j: u64) -> f64 {
    B43[k as usize][j as usize]
}

/// 2x3x4 problem with the given formats, transposes, orders (a, b, d) and padding.
fn small(
    fa: Format,
    fb: Format,
    fd: Format,
    (ta, tb): (Transpose, Transpose),
    (oa, ob, od): (Order, Order, Order),
    pad: u64,
) -> GemmProblem {
    let mut p = GemmProblem::row_major(2, 3, 4, fa, fb, fd);
    p.trans_a = ta;
    p.trans_b = tb;
    let (ar, ac) = p.a_stored_dims();
    let (br, bc) = p.b_stored_dims();
    p.a = layout(fa, oa, ar, ac, pad);
    p.b = layout(fb, ob, br, bc, pad);
    p.d = layout(fd, od, 2, 3, pad);
    p
}

fn row_major_small(fa: Format, fb: Format, fd: Format) -> GemmProblem {
    small(fa, fb, fd, (Transpose::N, Transpose::N), (Order::RowMajor, Order::RowMajor, Order::RowMajor), 0)
}

// ---------------------------------------------------------------------------------------------
// Decoders and encoders
// ---------------------------------------------------------------------------------------------

#[test]
fn c_decoders_agree_with_rust_on_every_small_code() {
    for format in Format::ALL {
        let codes: Vec<u32> = match format.bits() {
            4 | 8 | 16 => (0..1u32 << format.bits()).collect(),
            _ => {
                // 32-bit: edges plus a seeded sample.
                let mut rng = SplitMix64::new(32);
                let mut c =
                    vec![0, 1, 0x7F7F_FFFF, 0x7F80_0000, 0xFF80_0000, 0x7FC0_0000, 0x8000_0000, 0xFFFF_FFFF];
                c.extend((0..20_000).map(|_| rng.next_u64() as u32));
                c
            }
        };
        for code in codes {
            let c = fixture::decode(format, code).unwrap();
            let rust = format.decode_code(code);
            let agree = (c.is_nan() && rust.is_nan()) || c.to_bits() == rust.to_bits();
            assert!(agree, "{format} code {code:#x}: C {c:?}, Rust {rust:?}");
        }
    }
}

/// Values that exercise rounding in `format`: its own values, exact midpoints (ties), points
/// just off the midpoints, out-of-range values, specials, and a seeded spread.
fn rounding_probes(format: Format) -> Vec<f64> {
    let mut v = vec![0.0, -0.0, f64::INFINITY, f64::NEG_INFINITY, f64::NAN, 1e30, -1e30, 1e-30, -1e-30];
    if format.bits() <= 16 && !format.is_integer() {
        let mut values: Vec<f64> =
            (0..1u32 << format.bits()).map(|c| format.decode_code(c)).filter(|x| x.is_finite()).collect();
        values.sort_by(f64::total_cmp);
        values.dedup();
        for w in values.windows(2) {
            let mid = 0.5 * (w[0] + w[1]);
            v.extend([w[0], mid, mid + (w[1] - w[0]) * 1e-3, mid - (w[1] - w[0]) * 1e-3]);
        }
        let max = format.max_finite();
        v.extend([max * 1.01, -max * 1.01, max * 2.0]);
    }
    if format.is_integer() {
        let max = format.max_finite();
        for x in [-max - 1.5, -max - 1.0, -max - 0.5, max + 0.5, max + 1.0, -2.5, -1.5, -0.5, 0.5, 1.5, 2.5] {
            v.push(x);
        }
    }
    let mut rng = SplitMix64::new(format as u64);
    for _ in 0..20_000 {
        let magnitude = 2f64.powf(rng.uniform(-30.0, 35.0));
        v.push(if rng.below(2) == 0 { magnitude } else { -magnitude });
    }
    v
}

#[test]
fn c_encoders_agree_with_rust() {
    for format in Format::ALL.into_iter().filter(|f| !f.is_scale_only()) {
        let mut probes = rounding_probes(format);
        // Within 2^-29 of an f16 midpoint: rounding via f32 would tie and pick 1794/16384.
        probes.push(-0.10952758918532549);
        for x in probes {
            let c = format.decode_code(fixture::encode(format, x).unwrap());
            let rust = format.round(x);
            assert!(same(c, rust), "{format}: encode({x:e}) C {c:e}, Rust {rust:e}");
        }
    }
    assert_eq!(
        fixture::decode(Format::F16, fixture::encode(Format::F16, -0.10952758918532549).unwrap()),
        Ok(-1795.0 / 16384.0)
    );
    assert!(matches!(fixture::encode(Format::Ue8m0, 1.0), Err(FixtureError::Library { status: -3, .. })));
}

#[test]
fn output_rounding_matches_rust_encoder() {
    // D(0, j) = 1 * b(j) exactly in f32, so D holds round_to(d.format, b(j)).
    let probes: Vec<f64> =
        [Format::Bf16, Format::F16, Format::E4m3fn, Format::E5m2fnuz, Format::E2m1, Format::Int8]
            .into_iter()
            .flat_map(rounding_probes)
            .filter(|x| x.is_nan() || (*x as f32) as f64 == *x)
            .collect();
    let n = probes.len() as u64;
    for fd in Format::ALL.into_iter().filter(|f| !f.is_scale_only()) {
        let p = GemmProblem::row_major(1, n, 1, Format::F32, Format::F32, fd);
        let p = GemmProblem { d: layout(fd, Order::RowMajor, 1, n, 0), ..p };
        let inp = inputs(
            matrix_bytes(&p.a, 1, 1, 1, &one),
            matrix_bytes(&p.b, 1, n, 1, &|_, _, j| probes[j as usize]),
        );
        let d = run(&p, &inp, Fault::None, 0);
        for (j, x) in probes.iter().enumerate() {
            assert!(same(d[j], fd.round(*x)), "{fd}: D for {x:e} is {:e}, want {:e}", d[j], fd.round(*x));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// GEMMs with exact results
// ---------------------------------------------------------------------------------------------

#[test]
fn hand_computed_2x3x4() {
    let p = row_major_small(Format::F32, Format::F32, Format::F32);
    let inp = inputs(a_bytes(&p, &a24), b_bytes(&p, &b43));
    let d = run(&p, &inp, Fault::None, 0);
    assert_eq!(rows_of(&d, 3), D23.iter().map(|r| r.to_vec()).collect::<Vec<_>>());
}

const ORDERS: [Order; 2] = [Order::RowMajor, Order::ColMajor];
const OPS: [Transpose; 2] = [Transpose::N, Transpose::T];
const FLOAT8_AND_WIDE: [Format; 7] = [
    Format::F32,
    Format::F16,
    Format::Bf16,
    Format::E4m3fn,
    Format::E4m3fnuz,
    Format::E5m2,
    Format::E5m2fnuz,
];

#[test]
fn every_layout_transpose_and_format() {
    let want: Vec<f64> = D23.iter().flatten().copied().collect();
    let mut cases = 0;
    for ta in OPS {
        for tb in OPS {
            for oa in ORDERS {
                for ob in ORDERS {
                    for od in ORDERS {
                        for pad in [0, 3] {
                            for (n, fa) in FLOAT8_AND_WIDE.into_iter().enumerate() {
                                let fb = FLOAT8_AND_WIDE[(n + 3) % FLOAT8_AND_WIDE.len()];
                                for fd in [Format::F32, Format::Bf16, Format::E4m3fn] {
                                    let p = small(fa, fb, fd, (ta, tb), (oa, ob, od), pad);
                                    let inp = inputs(a_bytes(&p, &a24), b_bytes(&p, &b43));
                                    assert_eq!(
                                        run(&p, &inp, Fault::None, 0),
                                        want,
                                        "{p} {oa:?} {ob:?} {od:?} pad {pad}"
                                    );
                                    cases += 1;
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    assert_eq!(cases, 2 * 2 * 8 * 2 * 7 * 3);
}

#[test]
fn packed_4bit_operands_every_layout() {
    // Values representable in both e2m1 and int4.
    const A: [[f64; 4]; 2] = [[1.0, 2.0, 3.0, 4.0], [6.0, -1.0, -2.0, 0.0]];
    let a = |_: u64, i: u64, k: u64| A[i as usize][k as usize];
    // A x B43 by hand.
    let want = [12.0, 5.0, 1.0, 4.0, -3.0, 10.0];
    for (fa, fb, fd) in [
        (Format::E2m1, Format::E2m1, Format::F32),
        (Format::Int4, Format::Int4, Format::I32),
        (Format::Int4, Format::Int8, Format::I32),
        (Format::E2m1, Format::Bf16, Format::Int4),
        (Format::Int8, Format::E2m1, Format::E2m1),
    ] {
        for ta in OPS {
            for tb in OPS {
                for oa in ORDERS {
                    for ob in ORDERS {
                        for od in ORDERS {
                            for pad in [0, 1] {
                                let p = small(fa, fb, fd, (ta, tb), (oa, ob, od), pad);
                                let inp = inputs(a_bytes(&p, &a), b_bytes(&p, &b43));
                                // Narrow outputs hold the rounded (int4: saturated) values.
                                let expect: Vec<f64> = want.iter().map(|x| fd.round(*x)).collect();
                                assert_eq!(run(&p, &inp, Fault::None, 0), expect, "{p}");
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn int8_accumulates_exactly_past_float_precision() {
    // 127 * 127 * 1100 = 17_741_900 > 2^24: an FP32 accumulator would round, INT32 does not.
    let k = 1100;
    let mut p = GemmProblem::row_major(2, 2, k, Format::Int8, Format::Int8, Format::I32);
    p.alpha = Scalar::Host(2.0);
    let inp = inputs(
        matrix_bytes(&p.a, 2, k, 1, &|_, i, kk| if i == 1 && kk == 0 { -128.0 } else { 127.0 }),
        matrix_bytes(&p.b, k, 2, 1, &|_, _, _| 127.0),
    );
    let d = run(&p, &inp, Fault::None, 0);
    let full = 2.0 * 127.0 * 127.0 * k as f64;
    let second = 2.0 * (127.0 * 127.0 * (k - 1) as f64 - 128.0 * 127.0);
    assert_eq!(d, vec![full, full, second, second]);
    let mut f32_sum = 0f32;
    for _ in 0..k {
        f32_sum += 127.0 * 127.0;
    }
    assert_ne!(2.0 * f32_sum as f64, full, "the case must be beyond an FP32 accumulator's exact range");
}

#[test]
fn batched_strided_and_broadcast() {
    let batch = 3;
    let a = |b: u64, i: u64, k: u64| (b + 1) as f64 * A24[i as usize][k as usize];
    for broadcast_b in [false, true] {
        for (ta, oa) in [
            (Transpose::N, Order::RowMajor),
            (Transpose::T, Order::ColMajor),
            (Transpose::T, Order::RowMajor),
        ] {
            let mut p = small(
                Format::Bf16,
                Format::E4m3fn,
                Format::F32,
                (ta, Transpose::N),
                (oa, Order::ColMajor, Order::RowMajor),
                1,
            );
            p.batch = batch;
            if broadcast_b {
                p.b.batch_stride = 0;
            }
            let bv = |b: u64, k: u64, j: u64| {
                if broadcast_b {
                    b43(0, k, j)
                } else {
                    (b as f64 - 1.0) * b43(0, k, j)
                }
            };
            let inp = inputs(a_bytes(&p, &a), b_bytes(&p, &bv));
            let want = naive(&p, &a, &one, &bv, &one);
            assert_eq!(run(&p, &inp, Fault::None, 0), want, "{p} broadcast {broadcast_b}");
        }
    }
    // Every batch item writing the same D is refused, not raced.
    let mut p = row_major_small(Format::F32, Format::F32, Format::F32);
    p.batch = 2;
    p.a.batch_stride = 0;
    p.b.batch_stride = 0;
    p.d.batch_stride = 0;
    let inp = inputs(a_bytes(&p, &a24), b_bytes(&p, &b43));
    assert!(matches!(
        fixture::fixture_gemm(&p, &inp, Fault::None, 0),
        Err(FixtureError::Library { status: -2, .. })
    ));
}

// ---------------------------------------------------------------------------------------------
// Scales
// ---------------------------------------------------------------------------------------------

/// A scaled case: problem plus logical data and scale grids, checked against `naive`.
struct Scaled<'a> {
    p: GemmProblem,
    a: Values<'a>,
    b: Values<'a>,
    a_grid: Values<'a>,
    b_grid: Values<'a>,
}

impl Scaled<'_> {
    fn inputs(&self) -> HostInputs {
        let p = &self.p;
        let mut inp = inputs(a_bytes(p, self.a), b_bytes(p, self.b));
        inp.a_scale = p.a_scale.as_ref().map(|s| scale_bytes(s, p.m, p.k, p.batch, self.a_grid));
        inp.b_scale = p.b_scale.as_ref().map(|s| scale_bytes(s, p.n, p.k, p.batch, self.b_grid));
        inp
    }

    /// Exact expected D; `a_grid` overrides A's grid (to model faults).
    fn expected_with(&self, a_grid: Values) -> Vec<f64> {
        let p = &self.p;
        let unit = ScaleSpec::new(ScaleGranularity::Tensor, Format::F32);
        let a_spec = p.a_scale.unwrap_or(unit);
        let b_spec = p.b_scale.unwrap_or(unit);
        let unit_grid: Values = &one;
        let sa = element_scale(&a_spec, p.m, p.k, if p.a_scale.is_some() { a_grid } else { unit_grid });
        let sb = element_scale(&b_spec, p.n, p.k, if p.b_scale.is_some() { self.b_grid } else { unit_grid });
        let ts = p.a_tensor_scale.and_then(|s| s.host_value()).unwrap_or(1.0)
            * p.b_tensor_scale.and_then(|s| s.host_value()).unwrap_or(1.0);
        naive(p, self.a, &sa, self.b, &sb).into_iter().map(|x| x * ts).collect()
    }

    fn expected(&self) -> Vec<f64> {
        self.expected_with(self.a_grid)
    }

    fn check(&self) -> Vec<f64> {
        let got = run(&self.p, &self.inputs(), Fault::None, 0);
        assert_eq!(got, self.expected(), "{}", self.p);
        assert!(got.iter().any(|x| *x != 0.0));
        got
    }
}

/// Powers of two that vary with every coordinate, so any mis-indexing changes the result.
fn pow2_grid(b: u64, o: u64, i: u64) -> f64 {
    2f64.powi(((b * 5 + o * 3 + i * 7) % 7) as i32 - 3)
}

fn scaled_problem(
    m: u64,
    n: u64,
    k: u64,
    fa: Format,
    fb: Format,
    a: Option<ScaleSpec>,
    b: Option<ScaleSpec>,
) -> GemmProblem {
    let mut p = GemmProblem::row_major(m, n, k, fa, fb, Format::F32);
    p.a_scale = a;
    p.b_scale = b;
    p
}

/// Small integers in [-3, 3] that vary with every coordinate.
fn ints(b: u64, r: u64, c: u64) -> f64 {
    ((b * 7 + r * 5 + c * 3) % 7) as f64 - 3.0
}

#[test]
fn tensor_per_outer_and_per_inner_scales() {
    for fmt in [Format::F32, Format::Bf16, Format::F16, Format::Ue8m0] {
        for (ga, gb) in [
            (ScaleGranularity::Tensor, ScaleGranularity::Tensor),
            (ScaleGranularity::PerOuter, ScaleGranularity::PerOuter),
            (ScaleGranularity::PerInner, ScaleGranularity::PerOuter),
            (ScaleGranularity::PerOuter, ScaleGranularity::PerInner),
        ] {
            for storage in [ScaleStorage::OuterMajor, ScaleStorage::InnerMajor] {
                let a = ScaleSpec::new(ga, fmt).with_storage(storage);
                let b = ScaleSpec::new(gb, fmt);
                let case = Scaled {
                    p: scaled_problem(5, 6, 7, Format::E4m3fn, Format::E4m3fn, Some(a), Some(b)),
                    a: &ints,
                    b: &ints,
                    a_grid: &pow2_grid,
                    b_grid: &pow2_grid,
                };
                case.check();
            }
        }
    }
    // Hand-computed: rows of A scaled by [2, 0.5], columns of B by [1, 4, 0.5].
    let a = ScaleSpec::new(ScaleGranularity::PerOuter, Format::F32);
    let b = ScaleSpec::new(ScaleGranularity::PerOuter, Format::Bf16);
    let case = Scaled {
        p: scaled_problem(2, 3, 4, Format::F32, Format::F32, Some(a), Some(b)),
        a: &a24,
        b: &b43,
        a_grid: &|_, o, _| [2.0, 0.5][o as usize],
        b_grid: &|_, o, _| [1.0, 4.0, 0.5][o as usize],
    };
    assert_eq!(case.check(), vec![24.0, 40.0, 1.0, 14.0, 26.0, 2.25]);
}

#[test]
fn block_scales_both_storages_with_ld_and_batches() {
    for storage in [ScaleStorage::OuterMajor, ScaleStorage::InnerMajor] {
        for (bo, bi) in [(1, 2), (2, 2), (3, 4), (1, 128), (128, 128)] {
            for (ld_pad, batch_stride) in [(0, 0), (3, 0), (0, 1), (2, 1)] {
                let spec = |outer: u64, k: u64| {
                    let mut s = ScaleSpec::new(ScaleGranularity::Block { outer: bo, inner: bi }, Format::F32)
                        .with_storage(storage);
                    let grid = s.granularity.grid(outer, k);
                    let minor = if storage == ScaleStorage::OuterMajor { grid.1 } else { grid.0 };
                    if ld_pad > 0 {
                        s.ld = minor + ld_pad;
                    }
                    if batch_stride > 0 {
                        s.batch_stride = s.entries_per_item(grid) + batch_stride;
                    }
                    s
                };
                let (m, n, k) = (5, 4, 9);
                let mut p =
                    scaled_problem(m, n, k, Format::E4m3fn, Format::E5m2, Some(spec(m, k)), Some(spec(n, k)));
                p.batch = 2;
                p.a = layout(Format::E4m3fn, Order::RowMajor, m, k, 0);
                p.b = layout(Format::E5m2, Order::RowMajor, k, n, 0);
                p.d = layout(Format::F32, Order::RowMajor, m, n, 0);
                let case = Scaled { p, a: &ints, b: &ints, a_grid: &pow2_grid, b_grid: &pow2_grid };
                case.check();
            }
        }
    }
}

#[test]
fn mx32_and_nvfp4_plain_and_swizzled() {
    for storage in [ScaleStorage::OuterMajor, ScaleStorage::InnerMajor, ScaleStorage::Swizzled128x4] {
        // 130 rows cross a 128-row swizzle tile; K = 160 gives 5 MX blocks (two 4-wide tiles).
        let mx = ScaleSpec::new(ScaleGranularity::Mx32, Format::Ue8m0).with_storage(storage);
        let p = scaled_problem(130, 3, 160, Format::E4m3fn, Format::E5m2, Some(mx), Some(mx));
        Scaled { p, a: &ints, b: &ints, a_grid: &pow2_grid, b_grid: &pow2_grid }.check();

        let mx_fp4 = ScaleSpec::new(ScaleGranularity::Mx32, Format::Ue8m0).with_storage(storage);
        let p = scaled_problem(33, 4, 96, Format::E2m1, Format::E2m1, Some(mx_fp4), Some(mx_fp4));
        Scaled { p, a: &|b, r, c| ints(b, r, c).abs(), b: &ints, a_grid: &pow2_grid, b_grid: &pow2_grid }
            .check();

        // NVFP4: ue4m3 block scales (non-powers of two are fine: e2m1 x ue4m3 is exact in f32).
        let nv = ScaleSpec::new(ScaleGranularity::Nvfp4, Format::Ue4m3).with_storage(storage);
        let mut p = scaled_problem(130, 6, 48, Format::E2m1, Format::E2m1, Some(nv), Some(nv));
        p.a_tensor_scale = Some(Scalar::Host(0.25));
        p.b_tensor_scale = Some(Scalar::Host(3.0));
        let grid = |b: u64, o: u64, i: u64| {
            [0.5, 1.5, 3.0, 6.0, 0.75, 10.0, 1.0][((b + o * 3 + i * 2) % 7) as usize]
        };
        Scaled { p, a: &ints, b: &|b, r, c| ints(b, c, r), a_grid: &grid, b_grid: &grid }.check();
    }
}

#[test]
fn swizzled_offsets_written_out() {
    // All ue8m0 scales 1.0 except two placed by hand with the cuBLAS 128x4 tile formula:
    // row 33, k-block 1 -> (33 % 32) * 16 + (33 % 128) / 32 * 4 + 1 = 21;
    // row 129, k-block 0 -> tile 1 * 512 + (129 % 32) * 16 + 0 + 0 = 528.
    let (m, k) = (130, 64);
    let spec =
        ScaleSpec::new(ScaleGranularity::Mx32, Format::Ue8m0).with_storage(ScaleStorage::Swizzled128x4);
    let p = scaled_problem(m, 1, k, Format::E4m3fn, Format::E4m3fn, Some(spec), None);
    let mut scales = vec![127u8; 1024]; // two 128-row tiles x one 4-wide tile x 512 entries
    scales[21] = 128; // 2.0
    scales[528] = 129; // 4.0
    let mut inp = inputs(matrix_bytes(&p.a, m, k, 1, &one), matrix_bytes(&p.b, k, 1, 1, &one));
    inp.a_scale = Some(scales);
    let d = run(&p, &inp, Fault::None, 0);
    for (i, x) in d.iter().enumerate() {
        let want = match i {
            33 => 32.0 + 64.0,
            129 => 128.0 + 32.0,
            _ => 64.0,
        };
        assert_eq!(*x, want, "row {i}");
    }
}

// ---------------------------------------------------------------------------------------------
// Epilogue
// ---------------------------------------------------------------------------------------------

#[test]
fn alpha_beta_c_bias_relu_and_d_scale() {
    let c = |_: u64, i: u64, j: u64| (i * 3 + j) as f64 - 2.0;
    for bias_axis in [BiasAxis::Rows, BiasAxis::Cols] {
        for bias_format in [Format::F32, Format::Bf16, Format::F16] {
            let mut p = row_major_small(Format::F32, Format::F32, Format::F32);
            p.alpha = Scalar::Host(2.0);
            p.beta = Scalar::Host(0.5);
            p.c = Some(layout(Format::Bf16, Order::ColMajor, 2, 3, 1));
            p.d_scale = Some(Scalar::Host(0.25));
            p.epilogue = Epilogue {
                bias: Some(Bias { format: bias_format, axis: bias_axis }),
                activation: Activation::Relu,
            };
            let bias: Vec<f64> = match bias_axis {
                BiasAxis::Rows => vec![-30.0, 1.5],
                BiasAxis::Cols => vec![1.0, -100.0, 0.5],
            };
            let mut inp = inputs(a_bytes(&p, &a24), b_bytes(&p, &b43));
            inp.c = Some(matrix_bytes(p.c.as_ref().unwrap(), 2, 3, 1, &c));
            let mut bias_bytes = vec![0u8; bias_format.bytes_for(bias.len())];
            for (i, v) in bias.iter().enumerate() {
                store_exact(bias_format, &mut bias_bytes, i as u64, *v);
            }
            inp.bias = Some(bias_bytes);
            let d = run(&p, &inp, Fault::None, 0);
            for i in 0..2 {
                for j in 0..3 {
                    let b = bias[if bias_axis == BiasAxis::Rows { i } else { j }];
                    let t = 2.0 * D23[i][j] + 0.5 * c(0, i as u64, j as u64) + b;
                    assert_eq!(d[i * 3 + j], t.max(0.0) * 0.25, "({i},{j}) {bias_axis:?} {bias_format}");
                }
            }
        }
    }
}

#[test]
fn beta_zero_does_not_read_c_and_gelu_matches_formula() {
    let mut p = row_major_small(Format::F32, Format::F32, Format::F32);
    p.c = Some(layout(Format::F32, Order::RowMajor, 2, 3, 0));
    p.beta = Scalar::Device { ptr: 0x1000, format: Format::F32 };
    p.epilogue = Epilogue { bias: None, activation: Activation::GeluTanh };
    let mut inp = inputs(a_bytes(&p, &a24), b_bytes(&p, &b43));
    inp.c = Some(vec![0xFF; 24]); // NaN everywhere: must not leak in with beta == 0
    inp.device_scalars.beta = Some(0.0);
    for alpha in [0.125, -0.25] {
        p.alpha = Scalar::Host(alpha);
        let d = run(&p, &inp, Fault::None, 0);
        for (x, r) in d.iter().zip(D23.iter().flatten()) {
            let t = alpha * r;
            let gelu =
                0.5 * t * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (t + 0.044715 * t * t * t)).tanh());
            // D is f32: one rounding of the f64 formula.
            assert!((x - gelu).abs() <= 1e-7 * gelu.abs().max(1e-3), "gelu({t}) = {x}, want {gelu}");
        }
    }
    // A device scalar that was not read is an error, not a guess.
    inp.device_scalars.beta = None;
    assert!(matches!(fixture::fixture_gemm(&p, &inp, Fault::None, 0), Err(FixtureError::Problem(_))));
    // A non-zero beta without C has nothing to scale.
    let mut no_c = row_major_small(Format::F32, Format::F32, Format::F32);
    no_c.beta = Scalar::Host(1.0);
    let inp = inputs(a_bytes(&no_c, &a24), b_bytes(&no_c, &b43));
    assert!(matches!(fixture::fixture_gemm(&no_c, &inp, Fault::None, 0), Err(FixtureError::Unsupported(_))));
}

// ---------------------------------------------------------------------------------------------
// Planted faults
// ---------------------------------------------------------------------------------------------

/// Seeded random case: e4m3fn A (no -0 / NaN codes), bf16 B, f32 D.
fn random_case(m: u64, n: u64, k: u64, seed: u64) -> (GemmProblem, HostInputs) {
    let p = GemmProblem::row_major(m, n, k, Format::E4m3fn, Format::Bf16, Format::F32);
    let mut rng = SplitMix64::new(seed);
    let mut a = vec![0u8; (m * k) as usize];
    for byte in &mut a {
        *byte = loop {
            let code = rng.below(256) as u8;
            if !matches!(code, 0x7F | 0x80 | 0xFF) {
                break code;
            }
        };
    }
    let b: Vec<u8> =
        (0..k * n).flat_map(|_| (Format::Bf16.encode(rng.normal()) as u16).to_le_bytes()).collect();
    (p, inputs(a, b))
}

#[test]
fn fault_zero_and_nan() {
    let (p, inp) = random_case(20, 24, 32, 1);
    let honest = run(&p, &inp, Fault::None, 0);
    assert!(honest.iter().all(|x| x.is_finite()) && honest.iter().any(|x| *x != 0.0));
    assert!(run(&p, &inp, Fault::Zero, 0).iter().all(|x| *x == 0.0));

    let mut positions = std::collections::BTreeSet::new();
    for seed in 0..8 {
        let d = run(&p, &inp, Fault::Nan, seed);
        let nans: Vec<usize> = (0..d.len()).filter(|i| d[*i].is_nan()).collect();
        assert_eq!(nans.len(), 1, "seed {seed}");
        for (i, (x, h)) in d.iter().zip(&honest).enumerate() {
            assert!(i == nans[0] || x == h, "seed {seed}: element {i} changed");
        }
        assert_eq!(run(&p, &inp, Fault::Nan, seed).iter().position(|x| x.is_nan()), Some(nans[0]));
        positions.insert(nans[0]);
    }
    assert!(positions.len() > 1, "the NaN position must follow the seed");

    // Integer and FP4 outputs cannot hold a NaN: refused, not silently dropped.
    let p = GemmProblem::row_major(2, 2, 2, Format::Int8, Format::Int8, Format::I32);
    let inp = inputs(vec![1; 4], vec![1; 4]);
    assert!(matches!(
        fixture::fixture_gemm(&p, &inp, Fault::Nan, 0),
        Err(FixtureError::Library { status: -3, .. })
    ));
}

#[test]
fn fault_garbage_keeps_rms_and_loses_correlation() {
    let (p, inp) = random_case(64, 64, 64, 2);
    let honest = run(&p, &inp, Fault::None, 0);
    let garbage = run(&p, &inp, Fault::Garbage, 7);
    let cos = cosine(&garbage, &honest);
    assert!(cos.abs() < 0.05, "cosine {cos}");
    let ratio = rms(&garbage) / rms(&honest);
    assert!((0.95..1.05).contains(&ratio), "rms ratio {ratio}");
    assert_eq!(run(&p, &inp, Fault::Garbage, 7), garbage, "deterministic per seed");
    assert_ne!(run(&p, &inp, Fault::Garbage, 8), garbage);
}

#[test]
fn fault_fn_as_fnuz_is_exactly_half() {
    let (p, inp) = random_case(16, 12, 48, 3);
    let honest = run(&p, &inp, Fault::None, 0);
    let wrong = run(&p, &inp, Fault::FnAsFnuz, 0);
    for (w, h) in wrong.iter().zip(&honest) {
        assert_eq!(*w, 0.5 * h);
    }
    assert!((cosine(&wrong, &honest) - 1.0).abs() < 1e-12);

    // e5m2 bytes read as e5m2fnuz halve as well.
    let p = row_major_small(Format::E5m2, Format::F32, Format::F32);
    let inp = inputs(a_bytes(&p, &a24), b_bytes(&p, &b43));
    let want: Vec<f64> = D23.iter().flatten().map(|x| 0.5 * x).collect();
    assert_eq!(run(&p, &inp, Fault::FnAsFnuz, 0), want);

    // Other A formats are unaffected.
    let p = row_major_small(Format::Bf16, Format::E4m3fn, Format::F32);
    let inp = inputs(a_bytes(&p, &a24), b_bytes(&p, &b43));
    assert_eq!(run(&p, &inp, Fault::FnAsFnuz, 0), run(&p, &inp, Fault::None, 0));

    // fn's -0 (0x80, the fnuz NaN code) reads as 0, so quantized data that holds it still
    // gives the pure 0.5x magnitude bug rather than NaN.
    let p = row_major_small(Format::E4m3fn, Format::F32, Format::F32);
    let mut inp = inputs(a_bytes(&p, &a24), b_bytes(&p, &b43));
    inp.a[0] = 0x80; // A(0, 0): 1 -> -0
    let honest = run(&p, &inp, Fault::None, 0);
    assert_eq!(honest[..3], [11.0, 5.0, -1.0]);
    let wrong = run(&p, &inp, Fault::FnAsFnuz, 0);
    assert_eq!(wrong, honest.iter().map(|x| 0.5 * x).collect::<Vec<_>>());
}

#[test]
fn fault_tile_rows_only_rows_15_31_and_only_for_m_56_and_up() {
    for m in [55u64, 56, 64, 100] {
        let (p, inp) = random_case(m, 8, 16, 4);
        let honest = rows_of(&run(&p, &inp, Fault::None, 0), 8);
        let wrong = rows_of(&run(&p, &inp, Fault::TileRows, 0), 8);
        for i in 0..m as usize {
            if m >= 56 && i % 16 == 15 {
                assert_eq!(wrong[i], honest[i - 1], "m {m} row {i} must copy row {}", i - 1);
                assert_ne!(wrong[i], honest[i], "m {m} row {i} must change");
            } else {
                assert_eq!(wrong[i], honest[i], "m {m} row {i} must be honest");
            }
        }
    }
}

#[test]
fn fault_no_transpose_reads_b_as_stored() {
    // Square B stored N x K (trans_b = T): the faulty read takes op(B)(k, j) = stored(k, j).
    let n = 4;
    let mut p = small(
        Format::F32,
        Format::Bf16,
        Format::F32,
        (Transpose::N, Transpose::T),
        (Order::RowMajor, Order::RowMajor, Order::RowMajor),
        1,
    );
    p.n = n;
    p.b = layout(Format::Bf16, Order::RowMajor, n, 4, 1);
    p.d = layout(Format::F32, Order::RowMajor, 2, n, 0);
    let bv = |_: u64, k: u64, j: u64| (k * 4 + j) as f64 - 5.0;
    let inp = inputs(a_bytes(&p, &a24), b_bytes(&p, &bv));
    let honest = run(&p, &inp, Fault::None, 0);
    assert_eq!(honest, naive(&p, &a24, &one, &bv, &one));
    let wrong = run(&p, &inp, Fault::NoTranspose, 0);
    assert_eq!(wrong, naive(&p, &a24, &one, &|b, k, j| bv(b, j, k), &one));
    assert_ne!(wrong, honest);

    // With trans_b = N the flag has nothing to ignore.
    let p = row_major_small(Format::F32, Format::F32, Format::F32);
    let inp = inputs(a_bytes(&p, &a24), b_bytes(&p, &b43));
    assert_eq!(run(&p, &inp, Fault::NoTranspose, 0), run(&p, &inp, Fault::None, 0));

    // K > N would read past B: refused instead of reading out of bounds.
    let p = small(
        Format::F32,
        Format::F32,
        Format::F32,
        (Transpose::N, Transpose::T),
        (Order::RowMajor, Order::RowMajor, Order::RowMajor),
        0,
    );
    let inp = inputs(a_bytes(&p, &a24), b_bytes(&p, &b43));
    assert!(matches!(
        fixture::fixture_gemm(&p, &inp, Fault::NoTranspose, 0),
        Err(FixtureError::Library { status: -3, .. })
    ));
}

#[test]
fn fault_scale_transpose_and_ignore() {
    // A: 1 x 2 blocks over 2 x 4 -> a 2 x 2 grid [[1, 2], [4, 8]] stored outer-major.
    let grid = |_: u64, o: u64, i: u64| [[1.0, 2.0], [4.0, 8.0]][o as usize][i as usize];
    let transposed = |_: u64, o: u64, i: u64| [[1.0, 4.0], [2.0, 8.0]][o as usize][i as usize];
    let a_spec = ScaleSpec::new(ScaleGranularity::Block { outer: 1, inner: 2 }, Format::F32);
    let case = Scaled {
        p: scaled_problem(2, 3, 4, Format::F32, Format::F32, Some(a_spec), None),
        a: &a24,
        b: &b43,
        a_grid: &grid,
        b_grid: &one,
    };
    let honest = case.check();
    let wrong = run(&case.p, &case.inputs(), Fault::ScaleTranspose, 0);
    assert_eq!(wrong, case.expected_with(&transposed));
    assert_ne!(wrong, honest);
    let ignored = run(&case.p, &case.inputs(), Fault::ScaleIgnore, 0);
    assert_eq!(ignored, D23.iter().flatten().copied().collect::<Vec<_>>());

    // Inner-major storage read as outer-major: the same swap from the other side.
    let case = Scaled {
        p: scaled_problem(
            2,
            3,
            4,
            Format::F32,
            Format::F32,
            Some(a_spec.with_storage(ScaleStorage::InnerMajor)),
            None,
        ),
        ..case
    };
    assert_eq!(run(&case.p, &case.inputs(), Fault::ScaleTranspose, 0), case.expected_with(&transposed));

    // Swizzled MX scales read as plain outer-major: differs, and matches that reading.
    let (m, k) = (40, 128);
    let spec =
        ScaleSpec::new(ScaleGranularity::Mx32, Format::Ue8m0).with_storage(ScaleStorage::Swizzled128x4);
    let case = Scaled {
        p: scaled_problem(m, 3, k, Format::E4m3fn, Format::E4m3fn, Some(spec), None),
        a: &ints,
        b: &ints,
        a_grid: &pow2_grid,
        b_grid: &one,
    };
    let honest = case.check();
    let mut inp = case.inputs();
    // Entries the swizzled layout leaves unused hold 0xFF (NaN) poison; the plain reading
    // lands on some of them, so give them a value (0.5) to compare numbers, not NaNs.
    for byte in inp.a_scale.as_mut().unwrap() {
        if *byte == 0xFF {
            *byte = 126;
        }
    }
    let stored = inp.a_scale.clone().unwrap();
    let plain = |_: u64, o: u64, i: u64| Format::Ue8m0.load(&stored, (o * (k / 32) + i) as usize);
    let wrong = run(&case.p, &inp, Fault::ScaleTranspose, 0);
    assert_eq!(wrong, case.expected_with(&plain));
    assert_ne!(wrong, honest);

    // A vector of scales has one memory order: the transposed read is the honest one (as with
    // the real bug), while ignoring the scales still shows.
    let a_spec = ScaleSpec::new(ScaleGranularity::PerOuter, Format::F32);
    let case = Scaled {
        p: scaled_problem(2, 3, 4, Format::F32, Format::F32, Some(a_spec), None),
        a: &a24,
        b: &b43,
        a_grid: &|_, o, _| [2.0, 0.5][o as usize],
        b_grid: &one,
    };
    let honest = case.check();
    assert_eq!(run(&case.p, &case.inputs(), Fault::ScaleTranspose, 0), honest);
    assert_ne!(run(&case.p, &case.inputs(), Fault::ScaleIgnore, 0), honest);
}

// ---------------------------------------------------------------------------------------------
// Sizes, errors and the shared library
// ---------------------------------------------------------------------------------------------

#[test]
fn c_and_model_buffer_sizes_agree() {
    let mut problems = Vec::new();
    for ta in OPS {
        for tb in OPS {
            for oa in ORDERS {
                for od in ORDERS {
                    for fmt in [Format::F32, Format::Bf16, Format::E4m3fn, Format::E2m1] {
                        let mut p = small(fmt, fmt, fmt, (ta, tb), (oa, od, od), 2);
                        p.batch = 3;
                        p.c = Some(layout(Format::Bf16, od, 2, 3, 5));
                        p.epilogue.bias = Some(Bias { format: Format::F16, axis: BiasAxis::Rows });
                        problems.push(p);
                    }
                }
            }
        }
    }
    for granularity in [
        ScaleGranularity::Tensor,
        ScaleGranularity::PerOuter,
        ScaleGranularity::PerInner,
        ScaleGranularity::Block { outer: 128, inner: 128 },
        ScaleGranularity::Block { outer: 1, inner: 7 },
        ScaleGranularity::Mx32,
        ScaleGranularity::Nvfp4,
    ] {
        let storages: &[ScaleStorage] =
            if matches!(granularity, ScaleGranularity::Mx32 | ScaleGranularity::Nvfp4) {
                &[ScaleStorage::OuterMajor, ScaleStorage::InnerMajor, ScaleStorage::Swizzled128x4]
            } else {
                &[ScaleStorage::OuterMajor, ScaleStorage::InnerMajor]
            };
        for storage in storages {
            for (ld, batch_stride) in [(0, 0), (0, 9000), (700, 0)] {
                let mut s = ScaleSpec::new(granularity, Format::Ue8m0).with_storage(*storage);
                s.ld = ld;
                s.batch_stride = batch_stride;
                let mut p = scaled_problem(300, 200, 520, Format::E4m3fn, Format::E4m3fn, Some(s), Some(s));
                p.batch = 2;
                p.a.batch_stride = 300 * 520;
                p.b.batch_stride = 0;
                p.d.batch_stride = 300 * 200;
                p.epilogue.bias = Some(Bias { format: Format::Bf16, axis: BiasAxis::Cols });
                problems.push(p);
            }
        }
    }
    for p in &problems {
        let c = fixture::required_bytes(p).unwrap_or_else(|e| panic!("{p}: {e}"));
        assert_eq!(fixture::model_required_bytes(p).unwrap(), c, "{p}");
        assert!(c.a > 0 && c.b > 0 && c.d > 0);
        assert_eq!(c.c > 0, p.c.is_some());
        assert_eq!(c.bias > 0, p.epilogue.bias.is_some());
        assert_eq!(c.a_scale > 0, p.a_scale.is_some());
    }
}

#[test]
fn buffer_errors_are_reported_before_c_runs() {
    let p = row_major_small(Format::F32, Format::F32, Format::F32);
    let good = inputs(a_bytes(&p, &a24), b_bytes(&p, &b43));

    let mut short = good.clone();
    short.b.pop();
    assert_eq!(
        fixture::fixture_gemm(&p, &short, Fault::None, 0),
        Err(FixtureError::BufferTooSmall { buffer: "b", have: 47, need: 48 })
    );
    let mut extra = good.clone();
    extra.bias = Some(vec![0; 12]);
    assert_eq!(
        fixture::fixture_gemm(&p, &extra, Fault::None, 0),
        Err(FixtureError::UnexpectedBuffer { buffer: "bias" })
    );

    let mut scaled = p.clone();
    scaled.a_scale = Some(ScaleSpec::new(ScaleGranularity::PerOuter, Format::F32));
    assert_eq!(
        fixture::fixture_gemm(&scaled, &good, Fault::None, 0),
        Err(FixtureError::MissingBuffer { buffer: "a_scale" })
    );
    let mut with_scale = good.clone();
    with_scale.a_scale = Some(vec![0; 4]);
    assert!(matches!(
        fixture::fixture_gemm(&scaled, &with_scale, Fault::None, 0),
        Err(FixtureError::BufferTooSmall { buffer: "a_scale", need: 8, .. })
    ));

    let mut bad_ld = p.clone();
    bad_ld.a.ld = 3;
    assert!(matches!(fixture::fixture_gemm(&bad_ld, &good, Fault::None, 0), Err(FixtureError::Problem(_))));

    let mut huge = p.clone();
    huge.a.batch_stride = u64::MAX / 2;
    huge.batch = 3;
    huge.b.batch_stride = 0;
    huge.d.batch_stride = 6;
    assert!(fixture::fixture_gemm(&huge, &good, Fault::None, 0).is_err());

    let i32_input = GemmProblem::row_major(2, 2, 2, Format::I32, Format::Int8, Format::I32);
    assert!(matches!(
        fixture::fixture_gemm(&i32_input, &inputs(vec![0; 16], vec![0; 4]), Fault::None, 0),
        Err(FixtureError::Unsupported(_))
    ));

    assert_eq!(fixture::fixture_gemm(&p, &good, Fault::None, 0).unwrap().len(), 24);
}

#[test]
fn shared_library_exports_exactly_the_api() {
    use std::ffi::{CStr, CString};
    use std::os::unix::ffi::OsStrExt;

    let path = fixture::shared_library_path().expect("libfixture_blas.so is built on Linux");
    assert!(path.is_file(), "{}", path.display());
    let cpath = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: loading our own C library, which has no constructors.
    let handle = unsafe { libc::dlopen(cpath.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!handle.is_null(), "dlopen: {:?}", unsafe { CStr::from_ptr(libc::dlerror()) });
    let sym = |name: &str| {
        let name = CString::new(name).unwrap();
        // SAFETY: handle is live; dlsym only looks the name up.
        unsafe { libc::dlsym(handle, name.as_ptr()) }
    };
    for name in [
        "fixture_abi_version",
        "fixture_status_string",
        "fixture_gemm_required_bytes",
        "fixture_gemm",
        "fixture_decode",
        "fixture_encode",
    ] {
        assert!(!sym(name).is_null(), "{name} is not exported");
    }
    for internal in ["minifloat_decode", "decode_value", "plan_build", "mix64"] {
        assert!(sym(internal).is_null(), "{internal} leaks out of the shared library");
    }
    // SAFETY: the symbols have these signatures (fixture_blas_core.h).
    unsafe {
        let version: extern "C" fn() -> u32 = std::mem::transmute(sym("fixture_abi_version"));
        assert_eq!(version(), fixture::ABI_VERSION);
        let decode: extern "C" fn(i32, u32, *mut f64) -> i32 = std::mem::transmute(sym("fixture_decode"));
        let mut v = 0.0;
        assert_eq!(decode(Format::E4m3fn as i32, 0x7E, &mut v), 0);
        assert_eq!(v, 448.0);
        libc::dlclose(handle);
    }
}
