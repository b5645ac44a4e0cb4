//! Decoders of every interposed GEMM entry, driven with fake handle / descriptor queries.
//!
//! The numerical tests build vendor-layout data on the host (column-major, or ROW-order
//! cuBLASLt layouts), compute the vendor's GEMM with a naive loop written here in the vendor's
//! own column-major terms, decode the call, run the host oracle on the decoded problem (its
//! buffers looked up by the addresses the decoder reported) and require the same numbers:
//! `oracle D(i, j) == naive C(j, i)`. That proves the transpose identity, the A<->B swap (of
//! operands, buffers and scales) and the leading-dimension / batch-stride mapping.
//!
//! Values are small dyadic numbers exactly representable in every format used (fp8 included),
//! so all sums are exact in f64 and results compare for equality.

use quantshadow_runtime::formats::Format;
use quantshadow_runtime::intercept::common::{HandleQueries, LtQueries};
use quantshadow_runtime::intercept::{hipblaslt as qs_hipblaslt, hook, GemmArgs, InterceptedGemm, Skip};
use quantshadow_runtime::oracle::{reference_gemm, OracleOptions};
use quantshadow_runtime::problem::{
    Activation, BiasAxis, ComputeType, DeviceScalarValues, HostInputs, Order, Scalar, ScaleGranularity,
    ScaleStorage, Transpose,
};
use quantshadow_runtime::rng::SplitMix64;
use quantshadow_runtime::vendor::{self, AttrValue, LayoutAttr, LibVersion, MatmulDescAttr};
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;

// =============================================================================================
// Fakes
// =============================================================================================

struct FakeHandle {
    stream: u64,
    pointer_mode: i32,
    math_mode: Option<i32>,
}

impl FakeHandle {
    fn host() -> FakeHandle {
        FakeHandle { stream: 0x5157, pointer_mode: 0, math_mode: Some(0) }
    }
}

impl HandleQueries for FakeHandle {
    fn stream(&self, _h: *mut c_void) -> Result<u64, Skip> {
        Ok(self.stream)
    }
    fn pointer_mode(&self, _h: *mut c_void) -> Result<i32, Skip> {
        Ok(self.pointer_mode)
    }
    fn math_mode(&self, _h: *mut c_void) -> Option<i32> {
        self.math_mode
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Lt {
    Cuda,
    Hip,
}

/// Descriptor and layout attributes by (object, id); unset ones read as zero bytes, as a real
/// library's defaults are set explicitly by the builders below.
struct FakeLt {
    lt: Lt,
    version: LibVersion,
    attrs: RefCell<HashMap<(u64, i32), Vec<u8>>>,
    reads: RefCell<usize>,
    /// (object, id) whose getter fails.
    fail: RefCell<Option<(u64, i32)>>,
}

impl FakeLt {
    fn new(lt: Lt, version: LibVersion) -> FakeLt {
        FakeLt {
            lt,
            version,
            attrs: RefCell::new(HashMap::new()),
            reads: RefCell::new(0),
            fail: RefCell::new(None),
        }
    }

    fn put(&self, obj: u64, id: i32, ty: AttrValue, v: i64) {
        let bytes = v.to_le_bytes()[..ty.bytes()].to_vec();
        self.attrs.borrow_mut().insert((obj, id), bytes);
    }

    fn desc(&self, desc: u64, attr: MatmulDescAttr, v: i64) {
        let (id, ty) = match self.lt {
            Lt::Cuda => (
                vendor::cublaslt::desc_attribute_id(self.version, attr),
                vendor::cublaslt::desc_attribute_value(attr),
            ),
            Lt::Hip => (
                vendor::hipblaslt::desc_attribute_id(self.version, attr),
                vendor::hipblaslt::desc_attribute_value(attr),
            ),
        };
        self.put(desc, id.expect("attribute exists in this version"), ty.unwrap(), v);
    }

    fn layout_attr(&self, obj: u64, attr: LayoutAttr, v: i64) {
        let (id, ty) = match self.lt {
            Lt::Cuda => (
                vendor::cublaslt::layout_attribute_id(self.version, attr),
                vendor::cublaslt::layout_attribute_value(attr),
            ),
            Lt::Hip => (
                vendor::hipblaslt::layout_attribute_id(self.version, attr),
                vendor::hipblaslt::layout_attribute_value(attr),
            ),
        };
        self.put(obj, id.unwrap(), ty.unwrap(), v);
    }

    /// A fresh matmul descriptor with the library's defaults (cuBLASLt: compute/scale given).
    fn new_desc(&self, desc: u64, compute: i32, scale: i32) {
        let (n, fill) = match self.lt {
            Lt::Cuda => (0, Some(vendor::cublas::CUBLAS_FILL_MODE_FULL as i64)),
            Lt::Hip => (vendor::hipblas::HIPBLAS_OP_N as i64, None),
        };
        if self.lt == Lt::Cuda {
            self.desc(desc, MatmulDescAttr::ComputeType, compute as i64);
            self.desc(desc, MatmulDescAttr::ScaleType, scale as i64);
        }
        self.desc(desc, MatmulDescAttr::TransA, n);
        self.desc(desc, MatmulDescAttr::TransB, n);
        if let Some(fill) = fill {
            self.desc(desc, MatmulDescAttr::FillMode, fill);
        }
        self.desc(desc, MatmulDescAttr::Epilogue, 1);
        let unset = match self.lt {
            Lt::Cuda => vendor::cublaslt::CUBLASLT_BIAS_DATA_TYPE_UNSET,
            Lt::Hip => vendor::hipblaslt::HIPBLASLT_DATATYPE_INVALID,
        };
        self.desc(desc, MatmulDescAttr::BiasDataType, unset as i64);
    }

    fn layout(&self, obj: u64, m: &Mat) {
        let (ty, order) = match self.lt {
            Lt::Cuda => (vendor::data_type::cuda_data_type_for_format(m.format).unwrap(), m.row_major as i64),
            Lt::Hip => (vendor::data_type::hip_data_type_for_format(m.format).unwrap(), m.row_major as i64),
        };
        self.layout_attr(obj, LayoutAttr::Type, ty as i64);
        self.layout_attr(obj, LayoutAttr::Order, order);
        self.layout_attr(obj, LayoutAttr::Rows, m.rows as i64);
        self.layout_attr(obj, LayoutAttr::Cols, m.cols as i64);
        self.layout_attr(obj, LayoutAttr::Ld, m.ld as i64);
        self.layout_attr(obj, LayoutAttr::BatchCount, m.batch as i64);
        self.layout_attr(obj, LayoutAttr::StridedBatchOffset, m.stride as i64);
    }

    fn get(&self, obj: *mut c_void, id: i32, buf: &mut [u8]) -> Result<(), Skip> {
        *self.reads.borrow_mut() += 1;
        if *self.fail.borrow() == Some((obj as u64, id)) {
            return Err(Skip::new("fake: getter failed"));
        }
        buf.fill(0);
        if let Some(v) = self.attrs.borrow().get(&(obj as u64, id)) {
            assert_eq!(v.len(), buf.len(), "attribute {id} read with another size than written");
            buf.copy_from_slice(v);
        }
        Ok(())
    }
}

impl LtQueries for FakeLt {
    fn version(&self, _h: *mut c_void) -> Result<LibVersion, Skip> {
        Ok(self.version)
    }
    fn desc_attr(&self, desc: *mut c_void, id: i32, buf: &mut [u8]) -> Result<(), Skip> {
        self.get(desc, id, buf)
    }
    fn layout_attr(&self, layout: *mut c_void, id: i32, buf: &mut [u8]) -> Result<(), Skip> {
        self.get(layout, id, buf)
    }
}

// =============================================================================================
// Vendor-layout host matrices and the naive vendor GEMM
// =============================================================================================

/// A stored vendor matrix: `rows x cols` per batch item, column-major unless `row_major`.
struct Mat {
    ptr: u64,
    format: Format,
    row_major: bool,
    rows: u64,
    cols: u64,
    ld: u64,
    batch: u64,
    stride: u64,
    bytes: Vec<u8>,
}

impl Mat {
    #[allow(clippy::too_many_arguments)]
    fn new(
        rng: &mut SplitMix64,
        ptr: u64,
        format: Format,
        row_major: bool,
        rows: u64,
        cols: u64,
        ld: u64,
        batch: u64,
        stride: u64,
    ) -> Mat {
        let per = if row_major { (rows - 1) * ld + cols } else { (cols - 1) * ld + rows };
        let total = (batch - 1) * stride + per;
        let mut m = Mat {
            ptr,
            format,
            row_major,
            rows,
            cols,
            ld,
            batch,
            stride,
            bytes: vec![0; format.bytes_for(total as usize)],
        };
        for b in 0..batch {
            for r in 0..rows {
                for c in 0..cols {
                    let v = (rng.next_u64() % 9) as f64 * 0.5 - 2.0;
                    let i = m.index(b, r, c);
                    format.store_code(&mut m.bytes, i, format.encode(v));
                }
            }
        }
        m
    }

    fn index(&self, b: u64, r: u64, c: u64) -> usize {
        let off = if self.row_major { r * self.ld + c } else { c * self.ld + r };
        (b * self.stride + off) as usize
    }

    fn get(&self, b: u64, r: u64, c: u64) -> f64 {
        self.format.load(&self.bytes, self.index(b, r, c))
    }
}

/// The vendor's own definition, in its column-major terms: C(i, j) (m x n) = alpha * sum_l
/// op(A)(i, l) sa op(B)(l, j) sb + beta C(i, j) + bias[i]. Returns `[batch][i][j]`.
#[allow(clippy::too_many_arguments)]
fn naive(
    ta: Transpose,
    tb: Transpose,
    (m, n, k, batch): (u64, u64, u64, u64),
    a: &Mat,
    b: &Mat,
    c: Option<&Mat>,
    (alpha, beta): (f64, f64),
    sa: &dyn Fn(u64, u64) -> f64,
    sb: &dyn Fn(u64, u64) -> f64,
    bias: Option<&[f64]>,
) -> Vec<f64> {
    let mut out = Vec::new();
    for bt in 0..batch {
        for i in 0..m {
            for j in 0..n {
                let mut acc = 0.0;
                for l in 0..k {
                    let av = if ta == Transpose::N { a.get(bt, i, l) } else { a.get(bt, l, i) };
                    let bv = if tb == Transpose::N { b.get(bt, l, j) } else { b.get(bt, j, l) };
                    acc += av * sa(i, l) * bv * sb(l, j);
                }
                let mut t = alpha * acc;
                if let Some(c) = c {
                    t += beta * c.get(bt, i, j);
                }
                if let Some(bias) = bias {
                    t += bias[i as usize];
                }
                out.push(t);
            }
        }
    }
    out
}

/// Runs the oracle on a decoded call with the host buffers found by address, and checks
/// `D(i, j) == C(j, i)` against the naive vendor result.
fn check_against_naive(
    g: &InterceptedGemm,
    mats: &[&Mat],
    extra: &[(u64, Vec<u8>)],
    scalars: DeviceScalarValues,
    want: &[f64],
) {
    let find = |addr: u64| -> Option<Vec<u8>> {
        if addr == 0 {
            return None;
        }
        mats.iter()
            .find(|m| m.ptr == addr)
            .map(|m| m.bytes.clone())
            .or_else(|| extra.iter().find(|(a, _)| *a == addr).map(|(_, b)| b.clone()))
    };
    let inputs = HostInputs {
        a: find(g.buffers.a).expect("A buffer"),
        b: find(g.buffers.b).expect("B buffer"),
        c: find(g.buffers.c),
        a_scale: find(g.buffers.a_scale),
        b_scale: find(g.buffers.b_scale),
        bias: find(g.buffers.bias),
        device_scalars: scalars,
    };
    let p = &g.problem;
    let out = reference_gemm(p, &inputs, &OracleOptions { round_output: false, rows: None }).unwrap();
    let (mm, nn) = (p.m, p.n); // problem M = vendor n, problem N = vendor m
    for bt in 0..p.batch {
        for i in 0..mm {
            for j in 0..nn {
                let got = out.values[(bt * mm * nn + i * nn + j) as usize];
                let exp = want[(bt * nn * mm + j * mm + i) as usize];
                assert_eq!(got, exp, "batch {bt} D({i},{j}) vs vendor C({j},{i})");
            }
        }
    }
}

fn ptr(v: u64) -> *const c_void {
    v as *const c_void
}

fn mptr(v: u64) -> *mut c_void {
    v as *mut c_void
}

fn one(_: u64, _: u64) -> f64 {
    1.0
}

const HANDLE: u64 = 0x4a4d;

// =============================================================================================
// cuBLAS classic
// =============================================================================================

/// `F.linear` in bf16 as PyTorch calls it: cublasGemmEx(T, N, out, tokens, in, W, ldw, x, ldx).
#[test]
fn cublas_gemm_ex_linear_bf16() {
    let mut rng = SplitMix64::new(1);
    let (out_f, tokens, in_f) = (6u64, 5u64, 8u64);
    // W is stored (in x out) column-major = PyTorch's row-major [out, in], padded ld 10.
    let w = Mat::new(&mut rng, 0x1000, Format::Bf16, false, in_f, out_f, 10, 1, 0);
    let x = Mat::new(&mut rng, 0x2000, Format::Bf16, false, in_f, tokens, in_f, 1, 0);
    let y = Mat::new(&mut rng, 0x3000, Format::Bf16, false, out_f, tokens, out_f, 1, 0);
    let alpha = 1.0f32;
    let beta = 0.0f32;
    let args = hook::cublasGemmEx::Args {
        handle: mptr(HANDLE),
        trans_a: 1,
        trans_b: 0,
        m: out_f as i32,
        n: tokens as i32,
        k: in_f as i32,
        alpha: &alpha as *const f32 as *const c_void,
        a: ptr(w.ptr),
        a_type: 14,
        lda: 10,
        b: ptr(x.ptr),
        b_type: 14,
        ldb: in_f as i32,
        beta: &beta as *const f32 as *const c_void,
        c: mptr(y.ptr),
        c_type: 14,
        ldc: out_f as i32,
        compute: 68,
        algo: -1,
    };
    let g = args.decode_with(&FakeHandle::host()).unwrap();
    let p = &g.problem;
    assert_eq!(g.entry, "cublasGemmEx");
    assert_eq!((p.m, p.n, p.k, p.batch), (tokens, out_f, in_f, 1));
    assert_eq!((p.trans_a, p.trans_b), (Transpose::N, Transpose::T));
    assert_eq!((p.b.order, p.b.ld, p.b.format), (Order::RowMajor, 10, Format::Bf16));
    assert_eq!(g.buffers.b, w.ptr, "the weight (vendor A) is problem B");
    assert_eq!(g.buffers.a, x.ptr);
    assert_eq!(g.buffers.d, y.ptr);
    assert!(p.c.is_none() && g.buffers.c == 0, "host beta 0: C not read");
    assert_eq!(p.alpha, Scalar::Host(1.0));
    assert_eq!(p.compute, ComputeType::F32);
    assert_eq!(g.stream, 0x5157);
    let want = naive(
        Transpose::T,
        Transpose::N,
        (out_f, tokens, in_f, 1),
        &w,
        &x,
        None,
        (1.0, 0.0),
        &one,
        &one,
        None,
    );
    check_against_naive(&g, &[&w, &x, &y], &[], DeviceScalarValues::default(), &want);
}

#[test]
fn cublas_gemm_ex_64_matches_32_bit_form() {
    let alpha = 1.0f32;
    let beta = 0.0f32;
    let a32 = hook::cublasGemmEx::Args {
        handle: mptr(HANDLE),
        trans_a: 1,
        trans_b: 0,
        m: 64,
        n: 32,
        k: 128,
        alpha: &alpha as *const f32 as *const c_void,
        a: ptr(0x1000),
        a_type: 2,
        lda: 128,
        b: ptr(0x2000),
        b_type: 2,
        ldb: 128,
        beta: &beta as *const f32 as *const c_void,
        c: mptr(0x3000),
        c_type: 2,
        ldc: 64,
        compute: 64,
        algo: -1,
    };
    let a64 = hook::cublasGemmEx_64::Args {
        handle: a32.handle,
        trans_a: 1,
        trans_b: 0,
        m: 64,
        n: 32,
        k: 128,
        alpha: a32.alpha,
        a: a32.a,
        a_type: 2,
        lda: 128,
        b: a32.b,
        b_type: 2,
        ldb: 128,
        beta: a32.beta,
        c: a32.c,
        c_type: 2,
        ldc: 64,
        compute: 64,
        algo: -1,
    };
    // f16 compute: alpha/beta are halves. 1.0f32's low half is 0 -> read as f16 0.0; use the
    // true f16 bit pattern instead.
    let one_h = half::f16::from_f32(1.0).to_bits();
    let zero_h = 0u16;
    let a32 = hook::cublasGemmEx::Args {
        alpha: &one_h as *const u16 as *const c_void,
        beta: &zero_h as *const u16 as *const c_void,
        ..a32
    };
    let a64 = hook::cublasGemmEx_64::Args { alpha: a32.alpha, beta: a32.beta, ..a64 };
    let g32 = a32.decode_with(&FakeHandle::host()).unwrap();
    let g64 = a64.decode_with(&FakeHandle::host()).unwrap();
    assert_eq!(g32.problem, g64.problem);
    assert_eq!(g32.problem.compute, ComputeType::F16);
    assert_eq!(g32.problem.alpha, Scalar::Host(1.0));
}

/// fp32 `a @ b` (cublasSgemm_v2) with a host beta: C is read; the math mode sets the compute.
#[test]
fn cublas_sgemm_with_beta_and_math_modes() {
    let mut rng = SplitMix64::new(2);
    let (m, n, k) = (7u64, 4u64, 5u64);
    let a = Mat::new(&mut rng, 0x1000, Format::F32, false, m, k, 9, 1, 0);
    let b = Mat::new(&mut rng, 0x2000, Format::F32, false, k, n, k, 1, 0);
    let c = Mat::new(&mut rng, 0x3000, Format::F32, false, m, n, 8, 1, 0);
    let (alpha, beta) = (0.5f32, 2.0f32);
    let args = hook::cublasSgemm_v2::Args {
        handle: mptr(HANDLE),
        trans_a: 0,
        trans_b: 0,
        m: m as i32,
        n: n as i32,
        k: k as i32,
        alpha: &alpha,
        a: a.ptr as *const f32,
        lda: 9,
        b: b.ptr as *const f32,
        ldb: k as i32,
        beta: &beta,
        c: c.ptr as *mut f32,
        ldc: 8,
    };
    let g = args.decode_with(&FakeHandle::host()).unwrap();
    assert_eq!(g.problem.compute, ComputeType::F32);
    assert_eq!(g.buffers.c, c.ptr);
    assert_eq!(g.problem.c.unwrap().ld, 8);
    let want =
        naive(Transpose::N, Transpose::N, (m, n, k, 1), &a, &b, Some(&c), (0.5, 2.0), &one, &one, None);
    check_against_naive(&g, &[&a, &b, &c], &[], DeviceScalarValues::default(), &want);

    let tf32 =
        FakeHandle { math_mode: Some(vendor::cublas::CUBLAS_TF32_TENSOR_OP_MATH), ..FakeHandle::host() };
    assert_eq!(args.decode_with(&tf32).unwrap().problem.compute, ComputeType::F32FastTf32);
    let emulated = FakeHandle {
        math_mode: Some(vendor::cublas::CUBLAS_FP32_EMULATED_BF16X9_MATH),
        ..FakeHandle::host()
    };
    assert_eq!(args.decode_with(&emulated).unwrap_err(), Skip::new("cublas: math mode not supported"));
}

/// `torch.bmm` in bf16: cublasGemmStridedBatchedEx, with a broadcast (stride 0) operand too.
#[test]
fn cublas_strided_batched_bmm_and_broadcast() {
    let mut rng = SplitMix64::new(3);
    let (m, n, k, batch) = (5u64, 3u64, 4u64, 3u64);
    for stride_a in [m * k + 2, 0] {
        let a = Mat::new(&mut rng, 0x1000, Format::Bf16, false, k, m, k, batch, stride_a);
        let b = Mat::new(&mut rng, 0x2000, Format::Bf16, false, k, n, k, batch, k * n);
        let c = Mat::new(&mut rng, 0x3000, Format::Bf16, false, m, n, m, batch, m * n);
        let (alpha, beta) = (1.0f32, 0.0f32);
        let args = hook::cublasGemmStridedBatchedEx::Args {
            handle: mptr(HANDLE),
            trans_a: 1,
            trans_b: 0,
            m: m as i32,
            n: n as i32,
            k: k as i32,
            alpha: &alpha as *const f32 as *const c_void,
            a: ptr(a.ptr),
            a_type: 14,
            lda: k as i32,
            stride_a: stride_a as i64,
            b: ptr(b.ptr),
            b_type: 14,
            ldb: k as i32,
            stride_b: (k * n) as i64,
            beta: &beta as *const f32 as *const c_void,
            c: mptr(c.ptr),
            c_type: 14,
            ldc: m as i32,
            stride_c: (m * n) as i64,
            batch: batch as i32,
            compute: 68,
            algo: -1,
        };
        let g = args.decode_with(&FakeHandle::host()).unwrap();
        assert_eq!(g.problem.batch, batch);
        assert_eq!(g.problem.b.batch_stride, stride_a, "vendor A's stride is problem B's");
        assert_eq!(g.problem.a.batch_stride, k * n);
        let want =
            naive(Transpose::T, Transpose::N, (m, n, k, batch), &a, &b, None, (1.0, 0.0), &one, &one, None);
        check_against_naive(&g, &[&a, &b, &c], &[], DeviceScalarValues::default(), &want);
    }
}

#[test]
fn cublas_batched_pointer_arrays_are_recorded_not_read() {
    let (alpha, beta) = (1.0f32, 0.0f32);
    let args = hook::cublasGemmBatchedEx::Args {
        handle: mptr(HANDLE),
        trans_a: 1,
        trans_b: 0,
        m: 16,
        n: 8,
        k: 32,
        alpha: &alpha as *const f32 as *const c_void,
        a_array: 0xA000 as *const *const c_void,
        a_type: 14,
        lda: 32,
        b_array: 0xB000 as *const *const c_void,
        b_type: 14,
        ldb: 32,
        beta: &beta as *const f32 as *const c_void,
        c_array: 0xC000 as *const *mut c_void,
        c_type: 14,
        ldc: 16,
        batch: 4,
        compute: 68,
        algo: -1,
    };
    let g = args.decode_with(&FakeHandle::host()).unwrap();
    let arrays = g.pointer_arrays.unwrap();
    assert_eq!((arrays.a, arrays.b, arrays.d), (0xB000, 0xA000, 0xC000));
    assert_eq!((g.buffers.a, g.buffers.b, g.buffers.d), (0, 0, 0));
    assert_eq!(g.problem.batch, 4);
    assert_eq!(g.problem.a.batch_stride, 0);
}

#[test]
fn cublas_hgemm_strided_and_device_pointer_mode() {
    let args = hook::cublasHgemmStridedBatched::Args {
        handle: mptr(HANDLE),
        trans_a: 0,
        trans_b: 1,
        m: 8,
        n: 8,
        k: 8,
        alpha: 0xD000 as *const u16,
        a: 0x1000 as *const u16,
        lda: 8,
        stride_a: 64,
        b: 0x2000 as *const u16,
        ldb: 8,
        stride_b: 64,
        beta: 0xD002 as *const u16,
        c: 0x3000 as *mut u16,
        ldc: 8,
        stride_c: 64,
        batch: 2,
    };
    let device = FakeHandle { pointer_mode: 1, ..FakeHandle::host() };
    let g = args.decode_with(&device).unwrap();
    assert_eq!(g.problem.alpha, Scalar::Device { ptr: 0xD000, format: Format::F16 });
    assert_eq!(g.problem.beta, Scalar::Device { ptr: 0xD002, format: Format::F16 });
    assert!(g.problem.c.is_some(), "device beta may be non-zero: C is read");
    assert_eq!(g.problem.compute, ComputeType::F16);
    assert_eq!((g.problem.trans_a, g.problem.trans_b), (Transpose::T, Transpose::N));
}

#[test]
fn cublas_skips() {
    let (alpha, beta) = (1.0f32, 0.0f32);
    let base = hook::cublasGemmEx::Args {
        handle: mptr(HANDLE),
        trans_a: 1,
        trans_b: 0,
        m: 16,
        n: 8,
        k: 32,
        alpha: &alpha as *const f32 as *const c_void,
        a: ptr(0x1000),
        a_type: 14,
        lda: 32,
        b: ptr(0x2000),
        b_type: 14,
        ldb: 32,
        beta: &beta as *const f32 as *const c_void,
        c: mptr(0x3000),
        c_type: 14,
        ldc: 16,
        compute: 68,
        algo: -1,
    };
    let h = FakeHandle::host();
    let skip = |a: hook::cublasGemmEx::Args| a.decode_with(&h).unwrap_err().0;
    assert_eq!(
        skip(hook::cublasGemmEx::Args { compute: 78, ..base }),
        "cublas: compute type CUBLAS_COMPUTE_32F_EMULATED_16BFX9 not supported"
    );
    assert_eq!(
        skip(hook::cublasGemmEx::Args { a_type: 1, ..base }),
        "cublas: data type CUDA_R_64F not supported"
    );
    assert_eq!(
        skip(hook::cublasGemmEx::Args { lda: 8, ..base }),
        "cublas: problem invalid (leading dimension too small)"
    );
    assert_eq!(skip(hook::cublasGemmEx::Args { m: 0, ..base }), "cublas: empty problem");
    assert_eq!(
        skip(hook::cublasGemmEx::Args { trans_a: 3, ..base }),
        "cublas: unsupported cublasOperation_t"
    );
    let vector = FakeHandle { pointer_mode: 7, ..FakeHandle::host() };
    assert_eq!(base.decode_with(&vector).unwrap_err().0, "cublas: unknown pointer mode");
}

#[test]
fn classic_quick_keys_are_per_site() {
    let (alpha, beta) = (1.0f32, 0.0f32);
    let base = hook::cublasGemmEx::Args {
        handle: mptr(HANDLE),
        trans_a: 1,
        trans_b: 0,
        m: 16,
        n: 8,
        k: 32,
        alpha: &alpha as *const f32 as *const c_void,
        a: ptr(0x1000),
        a_type: 14,
        lda: 32,
        b: ptr(0x2000),
        b_type: 14,
        ldb: 32,
        beta: &beta as *const f32 as *const c_void,
        c: mptr(0x3000),
        c_type: 14,
        ldc: 16,
        compute: 68,
        algo: -1,
    };
    let again = hook::cublasGemmEx::Args { b: ptr(0x9000), c: mptr(0x9900), ..base };
    assert_eq!(base.quick_key(), again.quick_key(), "new activations, same layer");
    assert_ne!(base.quick_key(), hook::cublasGemmEx::Args { a: ptr(0x1100), ..base }.quick_key());
    // The vendor's n is the token count: prefill and decode calls of a layer are one site.
    assert_eq!(base.quick_key(), hook::cublasGemmEx::Args { n: 9, ..base }.quick_key());
    assert_ne!(base.quick_key(), hook::cublasGemmEx::Args { m: 17, ..base }.quick_key());
    assert_ne!(base.quick_key(), hook::cublasGemmEx::Args { k: 33, ..base }.quick_key());
}

// =============================================================================================
// cuBLASLt
// =============================================================================================

const V13_1: LibVersion = LibVersion::new(13, 1, 0);
const DESC: u64 = 0xDE5C;
const LA: u64 = 0x1A;
const LB: u64 = 0x1B;
const LC: u64 = 0x1C;
const LD: u64 = 0x1D;

#[allow(clippy::too_many_arguments)]
fn lt_args(
    a: &Mat,
    b: &Mat,
    c: &Mat,
    d: &Mat,
    alpha: *const c_void,
    beta: *const c_void,
) -> hook::cublasLtMatmul::Args {
    hook::cublasLtMatmul::Args {
        handle: mptr(HANDLE),
        desc: mptr(DESC),
        alpha,
        a: ptr(a.ptr),
        a_desc: mptr(LA),
        b: ptr(b.ptr),
        b_desc: mptr(LB),
        beta,
        c: ptr(c.ptr),
        c_desc: mptr(LC),
        d: mptr(d.ptr),
        d_desc: mptr(LD),
        algo: std::ptr::null(),
        workspace: std::ptr::null_mut(),
        workspace_bytes: 0,
        stream: mptr(0x57),
    }
}

fn lt_layouts(f: &FakeLt, a: &Mat, b: &Mat, c: &Mat, d: &Mat) {
    f.layout(LA, a);
    f.layout(LB, b);
    f.layout(LC, c);
    f.layout(LD, d);
}

/// `F.linear` with bias: cublasLtMatmul, TRANSA = T, EPILOGUE_BIAS, bias per output feature.
#[test]
fn cublaslt_linear_with_bias() {
    let mut rng = SplitMix64::new(4);
    let (out_f, tokens, in_f) = (6u64, 3u64, 8u64);
    let w = Mat::new(&mut rng, 0x1000, Format::Bf16, false, in_f, out_f, in_f, 1, 0);
    let x = Mat::new(&mut rng, 0x2000, Format::Bf16, false, in_f, tokens, in_f, 1, 0);
    let y = Mat::new(&mut rng, 0x3000, Format::Bf16, false, out_f, tokens, out_f, 1, 0);
    let bias_vals: Vec<f64> = (0..out_f).map(|i| i as f64 * 0.25 - 0.5).collect();
    let mut bias = vec![0u8; 2 * out_f as usize];
    for (i, v) in bias_vals.iter().enumerate() {
        Format::Bf16.store_code(&mut bias, i, Format::Bf16.encode(*v));
    }
    let f = FakeLt::new(Lt::Cuda, V13_1);
    f.new_desc(DESC, 68, 0);
    f.desc(DESC, MatmulDescAttr::TransA, 1);
    f.desc(DESC, MatmulDescAttr::Epilogue, vendor::cublaslt::CUBLASLT_EPILOGUE_BIAS as i64);
    f.desc(DESC, MatmulDescAttr::BiasPointer, 0xB1A5);
    lt_layouts(&f, &w, &x, &y, &y);
    let (alpha, beta) = (1.0f32, 0.0f32);
    let args = lt_args(&w, &x, &y, &y, &alpha as *const f32 as _, &beta as *const f32 as _);
    let g = args.decode_with(&f).unwrap();
    let p = &g.problem;
    let bias_desc = p.epilogue.bias.unwrap();
    assert_eq!((bias_desc.axis, bias_desc.format), (BiasAxis::Cols, Format::Bf16));
    assert_eq!(g.buffers.bias, 0xB1A5);
    assert_eq!(g.stream, 0x57);
    assert_eq!((p.m, p.n, p.k), (tokens, out_f, in_f));
    let want = naive(
        Transpose::T,
        Transpose::N,
        (out_f, tokens, in_f, 1),
        &w,
        &x,
        None,
        (1.0, 0.0),
        &one,
        &one,
        Some(&bias_vals),
    );
    check_against_naive(&g, &[&w, &x, &y], &[(0xB1A5, bias)], DeviceScalarValues::default(), &want);

    // The quick key reads two layout attributes, no descriptor attribute.
    *f.reads.borrow_mut() = 0;
    let k1 = args.quick_key_with(&f);
    assert_eq!(*f.reads.borrow(), 2);
    assert_eq!(k1, args.quick_key_with(&f));
}

fn scaled_mm_setup(rng: &mut SplitMix64, version: LibVersion) -> (FakeLt, Mat, Mat, Mat, (u64, u64, u64)) {
    // torch._scaled_mm(x [tokens, in], w.t()) reaches cuBLASLt as A = w (TRANSA = T), B = x.
    let (m, n, k) = (4u64, 3u64, 16u64);
    let a = Mat::new(rng, 0x1000, Format::E4m3fn, false, k, m, k, 1, 0);
    let b = Mat::new(rng, 0x2000, Format::E4m3fn, false, k, n, k, 1, 0);
    let d = Mat::new(rng, 0x3000, Format::Bf16, false, m, n, m, 1, 0);
    let f = FakeLt::new(Lt::Cuda, version);
    f.new_desc(DESC, 68, 0);
    f.desc(DESC, MatmulDescAttr::TransA, 1);
    f.desc(DESC, MatmulDescAttr::FastAccum, 1);
    lt_layouts(&f, &a, &b, &d, &d);
    (f, a, b, d, (m, n, k))
}

fn f32_bytes(v: &[f64]) -> Vec<u8> {
    v.iter().flat_map(|x| (*x as f32).to_le_bytes()).collect()
}

/// `torch._scaled_mm` FP8 tensor-wise: A/B scale pointers in SCALAR_32F mode (type 28,
/// compute 68, TRANSA = T); vendor A's scale becomes problem B's tensor scale.
#[test]
fn cublaslt_scaled_mm_tensorwise() {
    let mut rng = SplitMix64::new(5);
    let (f, a, b, d, (m, n, k)) = scaled_mm_setup(&mut rng, V13_1);
    f.desc(DESC, MatmulDescAttr::AScalePointer, 0x5CA0);
    f.desc(DESC, MatmulDescAttr::BScalePointer, 0x5CB0);
    let (alpha, beta) = (1.0f32, 0.0f32);
    let g =
        lt_args(&a, &b, &d, &d, &alpha as *const f32 as _, &beta as *const f32 as _).decode_with(&f).unwrap();
    let p = &g.problem;
    assert_eq!(p.b_tensor_scale, Some(Scalar::Device { ptr: 0x5CA0, format: Format::F32 }));
    assert_eq!(p.a_tensor_scale, Some(Scalar::Device { ptr: 0x5CB0, format: Format::F32 }));
    assert!(p.fast_accum);
    assert_eq!((p.a.format, p.b.format, p.d.format), (Format::E4m3fn, Format::E4m3fn, Format::Bf16));
    let scalars =
        DeviceScalarValues { a_tensor_scale: Some(0.5), b_tensor_scale: Some(4.0), ..Default::default() };
    // Vendor A scale 4.0, vendor B scale 0.5.
    let want = naive(
        Transpose::T,
        Transpose::N,
        (m, n, k, 1),
        &a,
        &b,
        None,
        (1.0, 0.0),
        &|_, _| 4.0,
        &|_, _| 0.5,
        None,
    );
    check_against_naive(&g, &[&a, &b, &d], &[], scalars, &want);
}

/// `torch._scaled_mm` row-wise: OUTER_VEC_32F for A (per output feature) and B (per token).
#[test]
fn cublaslt_scaled_mm_rowwise() {
    let mut rng = SplitMix64::new(6);
    let (f, a, b, d, (m, n, k)) = scaled_mm_setup(&mut rng, V13_1);
    let outer = vendor::cublaslt::CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F as i64;
    f.desc(DESC, MatmulDescAttr::AScalePointer, 0x5CA0);
    f.desc(DESC, MatmulDescAttr::BScalePointer, 0x5CB0);
    f.desc(DESC, MatmulDescAttr::AScaleMode, outer);
    f.desc(DESC, MatmulDescAttr::BScaleMode, outer);
    let (alpha, beta) = (1.0f32, 0.0f32);
    let g =
        lt_args(&a, &b, &d, &d, &alpha as *const f32 as _, &beta as *const f32 as _).decode_with(&f).unwrap();
    let p = &g.problem;
    assert_eq!(p.b_scale.unwrap().granularity, ScaleGranularity::PerOuter);
    assert_eq!(p.a_scale.unwrap().granularity, ScaleGranularity::PerOuter);
    assert_eq!((g.buffers.b_scale, g.buffers.a_scale), (0x5CA0, 0x5CB0));
    let sa: Vec<f64> = (0..m).map(|i| 0.5 * (i + 1) as f64).collect();
    let sb: Vec<f64> = (0..n).map(|j| 0.25 * (j + 2) as f64).collect();
    let want = naive(
        Transpose::T,
        Transpose::N,
        (m, n, k, 1),
        &a,
        &b,
        None,
        (1.0, 0.0),
        &|i, _| sa[i as usize],
        &|_, j| sb[j as usize],
        None,
    );
    check_against_naive(
        &g,
        &[&a, &b, &d],
        &[(0x5CA0, f32_bytes(&sa)), (0x5CB0, f32_bytes(&sb))],
        DeviceScalarValues::default(),
        &want,
    );
}

/// NVFP4 / MX scale modes map to the swizzled block layouts, on the swapped operands.
#[test]
fn cublaslt_block_scale_modes() {
    let f = FakeLt::new(Lt::Cuda, V13_1);
    let (m, n, k) = (128u64, 64u64, 256u64);
    let mut rng = SplitMix64::new(7);
    let a = Mat::new(&mut rng, 0x1000, Format::E2m1, false, k, m, k, 1, 0);
    let b = Mat::new(&mut rng, 0x2000, Format::E2m1, false, k, n, k, 1, 0);
    let d = Mat::new(&mut rng, 0x3000, Format::Bf16, false, m, n, m, 1, 0);
    f.new_desc(DESC, 68, 0);
    f.desc(DESC, MatmulDescAttr::TransA, 1);
    f.desc(DESC, MatmulDescAttr::AScalePointer, 0x5CA0);
    f.desc(DESC, MatmulDescAttr::BScalePointer, 0x5CB0);
    let vec16 = vendor::cublaslt::CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3 as i64;
    f.desc(DESC, MatmulDescAttr::AScaleMode, vec16);
    f.desc(DESC, MatmulDescAttr::BScaleMode, vec16);
    lt_layouts(&f, &a, &b, &d, &d);
    let (alpha, beta) = (1.0f32, 0.0f32);
    let g =
        lt_args(&a, &b, &d, &d, &alpha as *const f32 as _, &beta as *const f32 as _).decode_with(&f).unwrap();
    let s = g.problem.b_scale.unwrap();
    assert_eq!(
        (s.granularity, s.format, s.storage),
        (ScaleGranularity::Nvfp4, Format::Ue4m3, ScaleStorage::Swizzled128x4)
    );
    assert_eq!(g.buffers.b_scale, 0x5CA0);
}

/// cuBLASLt ROW-order layouts (no transposes): the orders flip, the numbers still agree.
#[test]
fn cublaslt_row_order_layouts() {
    let mut rng = SplitMix64::new(8);
    let (m, n, k) = (5u64, 7u64, 6u64);
    let a = Mat::new(&mut rng, 0x1000, Format::F16, true, m, k, k + 1, 1, 0);
    let b = Mat::new(&mut rng, 0x2000, Format::F16, true, k, n, n, 1, 0);
    let c = Mat::new(&mut rng, 0x3000, Format::F32, true, m, n, n + 3, 1, 0);
    let d = Mat::new(&mut rng, 0x4000, Format::F32, false, m, n, m, 1, 0);
    let f = FakeLt::new(Lt::Cuda, V13_1);
    f.new_desc(DESC, 68, 0);
    lt_layouts(&f, &a, &b, &c, &d);
    let (alpha, beta) = (2.0f32, -1.0f32);
    let g =
        lt_args(&a, &b, &c, &d, &alpha as *const f32 as _, &beta as *const f32 as _).decode_with(&f).unwrap();
    assert_eq!(g.problem.a.order, Order::ColMajor);
    assert_eq!(g.problem.d.order, Order::RowMajor);
    assert_eq!(g.buffers.c, c.ptr);
    assert_eq!(g.buffers.d, d.ptr);
    let want =
        naive(Transpose::N, Transpose::N, (m, n, k, 1), &a, &b, Some(&c), (2.0, -1.0), &one, &one, None);
    check_against_naive(&g, &[&a, &b, &c, &d], &[], DeviceScalarValues::default(), &want);
}

/// Batched cuBLASLt with strided batch offsets and device pointer mode.
#[test]
fn cublaslt_batched_device_scalars() {
    let mut rng = SplitMix64::new(9);
    let (m, n, k, batch) = (3u64, 4u64, 5u64, 2u64);
    let a = Mat::new(&mut rng, 0x1000, Format::Bf16, false, m, k, m, batch, m * k);
    let b = Mat::new(&mut rng, 0x2000, Format::Bf16, false, k, n, k, batch, k * n + 1);
    let d = Mat::new(&mut rng, 0x3000, Format::Bf16, false, m, n, m, batch, m * n);
    let f = FakeLt::new(Lt::Cuda, V13_1);
    f.new_desc(DESC, 68, 0);
    f.desc(DESC, MatmulDescAttr::PointerMode, 1);
    lt_layouts(&f, &a, &b, &d, &d);
    let g = lt_args(&a, &b, &d, &d, ptr(0xA1), ptr(0xBE)).decode_with(&f).unwrap();
    assert_eq!(g.problem.alpha, Scalar::Device { ptr: 0xA1, format: Format::F32 });
    assert!(g.problem.c.is_some());
    assert_eq!(g.problem.batch, batch);
    let scalars = DeviceScalarValues { alpha: Some(1.5), beta: Some(0.5), ..Default::default() };
    let want =
        naive(Transpose::N, Transpose::N, (m, n, k, batch), &a, &b, Some(&d), (1.5, 0.5), &one, &one, None);
    check_against_naive(&g, &[&a, &b, &d], &[], scalars, &want);
}

#[test]
fn cublaslt_skips() {
    let mut rng = SplitMix64::new(10);
    let (alpha, beta) = (1.0f32, 0.0f32);
    let run = |tweak: &dyn Fn(&FakeLt)| -> String {
        let (f, a, b, d, _) = scaled_mm_setup(&mut SplitMix64::new(11), V13_1);
        tweak(&f);
        lt_args(&a, &b, &d, &d, &alpha as *const f32 as _, &beta as *const f32 as _)
            .decode_with(&f)
            .unwrap_err()
            .0
    };
    let _ = &mut rng;
    assert_eq!(
        run(&|f| f.desc(DESC, MatmulDescAttr::Epilogue, vendor::cublaslt::CUBLASLT_EPILOGUE_DGELU as i64)),
        "cublasLt: epilogue CUBLASLT_EPILOGUE_DGELU not supported"
    );
    assert_eq!(
        run(&|f| f.desc(DESC, MatmulDescAttr::PointerMode, 2)),
        "cublasLt: pointer mode DeviceVector not supported"
    );
    assert_eq!(
        run(&|f| f.desc(DESC, MatmulDescAttr::CScalePointer, 0x77)),
        "cublasLt: CUBLASLT_MATMUL_DESC_C_SCALE_POINTER not supported"
    );
    assert_eq!(
        run(&|f| f.desc(DESC, MatmulDescAttr::FillMode, 0)),
        "cublasLt: CUBLASLT_MATMUL_DESC_FILL_MODE not supported"
    );
    assert_eq!(run(&|f| f.layout_attr(LB, LayoutAttr::Rows, 17)), "cublasLt: matrix layouts inconsistent");
    assert_eq!(
        run(&|f| f.layout_attr(LA, LayoutAttr::Order, 2)),
        "cublasLt: tiled or unknown matrix order not supported"
    );
    assert_eq!(run(&|f| f.layout_attr(LA, LayoutAttr::BatchCount, 2)), "cublasLt: batch counts differ");
    assert_eq!(
        run(&|f| f.desc(DESC, MatmulDescAttr::ComputeType, 78)),
        "cublasLt: compute type CUBLAS_COMPUTE_32F_EMULATED_16BFX9 not supported"
    );
    assert_eq!(
        run(&|f| f.desc(DESC, MatmulDescAttr::AScaleMode, 1)),
        "cublasLt: A scale mode set without a scale pointer"
    );
    assert_eq!(
        run(&|f| {
            f.desc(DESC, MatmulDescAttr::Epilogue, vendor::cublaslt::CUBLASLT_EPILOGUE_BIAS as i64);
            f.desc(DESC, MatmulDescAttr::BiasPointer, 0xB1);
        }),
        "cublasLt: default bias type with 8/4-bit inputs not modeled"
    );
    assert_eq!(
        run(&|f| f.desc(DESC, MatmulDescAttr::ScaleType, 5)),
        "cublasLt: scale type CUDA_C_64F not supported"
    );
    // A batch-of-pointers layout with C != D.
    let (f, a, b, d, _) = scaled_mm_setup(&mut SplitMix64::new(12), V13_1);
    let c2 = Mat::new(&mut SplitMix64::new(13), 0x7000, Format::Bf16, false, 4, 3, 4, 1, 0);
    for l in [LA, LB, LC, LD] {
        f.layout_attr(l, LayoutAttr::BatchMode, 1);
    }
    let err = lt_args(&a, &b, &c2, &d, &alpha as *const f32 as _, &2.0f32 as *const f32 as _)
        .decode_with(&f)
        .unwrap_err();
    assert_eq!(err.0, "cublasLt: pointer-array batch with C != D not supported");
    let ok =
        lt_args(&a, &b, &d, &d, &alpha as *const f32 as _, &beta as *const f32 as _).decode_with(&f).unwrap();
    let arrays = ok.pointer_arrays.unwrap();
    assert_eq!((arrays.a, arrays.b, arrays.d), (b.ptr, a.ptr, d.ptr));
    // An old library version.
    let old = FakeLt::new(Lt::Cuda, LibVersion::new(12, 8, 0));
    old.new_desc(DESC, 68, 0);
    old.desc(DESC, MatmulDescAttr::TransA, 1);
    old.desc(DESC, MatmulDescAttr::AScalePointer, 0x5CA0);
    old.desc(DESC, MatmulDescAttr::AScaleMode, 3);
    lt_layouts(&old, &a, &b, &d, &d);
    let err = lt_args(&a, &b, &d, &d, &alpha as *const f32 as _, &beta as *const f32 as _)
        .decode_with(&old)
        .unwrap_err();
    assert_eq!(err.0, "cublasLt: A scale mode CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F not supported");
}

/// C's type matters only when C is read (`_scaled_mm` gives C the bias dtype, beta 0).
#[test]
fn cublaslt_unread_c_type_is_ignored() {
    let (f, a, b, d, _) = scaled_mm_setup(&mut SplitMix64::new(24), V13_1);
    f.layout_attr(LC, LayoutAttr::Type, vendor::data_type::CUDA_R_64F as i64);
    let (alpha, zero, half) = (1.0f32, 0.0f32, 0.5f32);
    let ok = lt_args(&a, &b, &d, &d, &alpha as *const f32 as _, &zero as *const f32 as _).decode_with(&f);
    assert!(ok.unwrap().problem.c.is_none());
    let err = lt_args(&a, &b, &d, &d, &alpha as *const f32 as _, &half as *const f32 as _).decode_with(&f);
    assert_eq!(err.unwrap_err().0, "cublasLt: data type CUDA_R_64F not supported");
}

/// A getter that fails is a skip naming the attribute (so a real-library run shows which one).
#[test]
fn cublaslt_failing_getter_names_the_attribute() {
    let (f, a, b, d, _) = scaled_mm_setup(&mut SplitMix64::new(20), V13_1);
    let id = vendor::cublaslt::CUBLASLT_MATMUL_DESC_EMULATION_DESCRIPTOR;
    *f.fail.borrow_mut() = Some((DESC, id));
    let (alpha, beta) = (1.0f32, 0.0f32);
    let args = lt_args(&a, &b, &d, &d, &alpha as *const f32 as _, &beta as *const f32 as _);
    assert_eq!(
        args.decode_with(&f).unwrap_err().0,
        "fake: getter failed for CUBLASLT_MATMUL_DESC_EMULATION_DESCRIPTOR"
    );
    *f.fail.borrow_mut() = Some((LA, vendor::cublaslt::CUBLASLT_MATRIX_LAYOUT_LD));
    assert_eq!(args.decode_with(&f).unwrap_err().0, "fake: getter failed for CUBLASLT_MATRIX_LAYOUT_LD");
    // The quick key survives a failing getter (it falls back to zeros).
    *f.fail.borrow_mut() = Some((LA, vendor::cublaslt::CUBLASLT_MATRIX_LAYOUT_ROWS));
    assert_eq!(args.quick_key_with(&f), args.quick_key_with(&f));
}

/// FP8 output: D scale and amax pointers are recorded; GELU_AUX_BIAS keeps D's activation.
#[test]
fn cublaslt_d_scale_amax_and_gelu_bias() {
    let (f, a, b, d, _) = scaled_mm_setup(&mut SplitMix64::new(21), V13_1);
    f.desc(DESC, MatmulDescAttr::DScalePointer, 0xD5);
    f.desc(DESC, MatmulDescAttr::AmaxDPointer, 0xA3);
    f.desc(DESC, MatmulDescAttr::Epilogue, vendor::cublaslt::CUBLASLT_EPILOGUE_GELU_AUX_BIAS as i64);
    f.desc(DESC, MatmulDescAttr::BiasPointer, 0xB1);
    f.desc(DESC, MatmulDescAttr::BiasDataType, vendor::data_type::CUDA_R_16BF as i64);
    f.desc(DESC, MatmulDescAttr::EpilogueAuxPointer, 0xA0A0);
    let (alpha, beta) = (1.0f32, 0.0f32);
    let g =
        lt_args(&a, &b, &d, &d, &alpha as *const f32 as _, &beta as *const f32 as _).decode_with(&f).unwrap();
    let p = &g.problem;
    assert_eq!(p.d_scale, Some(Scalar::Device { ptr: 0xD5, format: Format::F32 }));
    assert!(p.amax_d);
    assert_eq!(g.buffers.amax_d, 0xA3);
    assert_eq!(p.epilogue.activation, Activation::GeluTanh);
    assert_eq!(p.epilogue.bias.unwrap().format, Format::Bf16);
    assert_eq!(g.buffers.bias, 0xB1);
}

/// DeepSeek-style FP8 blocks through cuBLASLt 12.9+: the weight (vendor A) in 128x128 blocks,
/// the activation (vendor B) in 1x128 blocks. The scale buffers are written here from the
/// layouts PyTorch's `_scaled_mm` checks: A's `[ceil(m/128), ceil(k/128)]` with row stride
/// `roundup(ceil(k/128), 4)`, B's `[n, ceil(k/128)]` with strides `(1, roundup(n, 4))`.
#[test]
fn cublaslt_deepseek_block_scales() {
    let mut rng = SplitMix64::new(22);
    let (m, n, k) = (130u64, 3u64, 256u64);
    let a = Mat::new(&mut rng, 0x1000, Format::E4m3fn, false, k, m, k, 1, 0);
    let b = Mat::new(&mut rng, 0x2000, Format::E4m3fn, false, k, n, k, 1, 0);
    let d = Mat::new(&mut rng, 0x3000, Format::Bf16, false, m, n, m, 1, 0);
    let f = FakeLt::new(Lt::Cuda, V13_1);
    f.new_desc(DESC, 68, 0);
    f.desc(DESC, MatmulDescAttr::TransA, 1);
    f.desc(DESC, MatmulDescAttr::AScalePointer, 0x5CA0);
    f.desc(DESC, MatmulDescAttr::BScalePointer, 0x5CB0);
    f.desc(
        DESC,
        MatmulDescAttr::AScaleMode,
        vendor::cublaslt::CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F as i64,
    );
    f.desc(
        DESC,
        MatmulDescAttr::BScaleMode,
        vendor::cublaslt::CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F as i64,
    );
    lt_layouts(&f, &a, &b, &d, &d);
    let (alpha, beta) = (1.0f32, 0.0f32);
    let g =
        lt_args(&a, &b, &d, &d, &alpha as *const f32 as _, &beta as *const f32 as _).decode_with(&f).unwrap();
    assert_eq!(g.problem.b_scale.unwrap().granularity, ScaleGranularity::Block { outer: 128, inner: 128 });
    assert_eq!(g.problem.a_scale.unwrap().granularity, ScaleGranularity::Block { outer: 1, inner: 128 });
    let kb = k.div_ceil(128);
    let a_blocks = |ob: u64, ib: u64| [0.5, 2.0, 4.0, 0.25][((ob * 3 + ib) % 4) as usize];
    let b_blocks = |j: u64, ib: u64| [1.0, 0.5, 2.0][((j + ib) % 3) as usize];
    let a_ld = kb.next_multiple_of(4);
    let mut sa = vec![f64::NAN; (m.div_ceil(128) * a_ld) as usize];
    for ob in 0..m.div_ceil(128) {
        for ib in 0..kb {
            sa[(ob * a_ld + ib) as usize] = a_blocks(ob, ib);
        }
    }
    let b_ld = n.next_multiple_of(4);
    let mut sb = vec![f64::NAN; (kb * b_ld) as usize];
    for j in 0..n {
        for ib in 0..kb {
            sb[(ib * b_ld + j) as usize] = b_blocks(j, ib);
        }
    }
    let want = naive(
        Transpose::T,
        Transpose::N,
        (m, n, k, 1),
        &a,
        &b,
        None,
        (1.0, 0.0),
        &|i, l| a_blocks(i / 128, l / 128),
        &|l, j| b_blocks(j, l / 128),
        None,
    );
    check_against_naive(
        &g,
        &[&a, &b, &d],
        &[(0x5CA0, f32_bytes(&sa)), (0x5CB0, f32_bytes(&sb))],
        DeviceScalarValues::default(),
        &want,
    );
}

// =============================================================================================
// hipBLASLt
// =============================================================================================

fn hip_args(
    desc: u64,
    a: &Mat,
    b: &Mat,
    d: &Mat,
    alpha: *const c_void,
    beta: *const c_void,
) -> hook::hipblasLtMatmul::Args {
    let l = lt_args(a, b, d, d, alpha, beta);
    hook::hipblasLtMatmul::Args {
        handle: l.handle,
        desc: mptr(desc),
        alpha: l.alpha,
        a: l.a,
        a_desc: l.a_desc,
        b: l.b,
        b_desc: l.b_desc,
        beta: l.beta,
        c: l.c,
        c_desc: l.c_desc,
        d: l.d,
        d_desc: l.d_desc,
        algo: l.algo,
        workspace: l.workspace,
        workspace_bytes: 0,
        stream: l.stream,
    }
}

/// `torch._scaled_mm` on MI300 (ROCm 6.4, hipBLASLt 0.12): E4M3 FNUZ (1000), TRANSA = T,
/// tensor scales; and the same with the 0.12 per-row `*_SCALE_POINTER_VEC_EXT` vectors.
#[test]
fn hipblaslt_fp8_fnuz() {
    let v = LibVersion::new(0, 12, 0);
    let mut rng = SplitMix64::new(14);
    let (m, n, k) = (4u64, 5u64, 32u64);
    let a = Mat::new(&mut rng, 0x1000, Format::E4m3fnuz, false, k, m, k, 1, 0);
    let b = Mat::new(&mut rng, 0x2000, Format::E4m3fnuz, false, k, n, k, 1, 0);
    let d = Mat::new(&mut rng, 0x3000, Format::Bf16, false, m, n, m, 1, 0);
    let desc = 0xD1;
    let f = FakeLt::new(Lt::Hip, v);
    f.new_desc(desc, 0, 0);
    f.desc(desc, MatmulDescAttr::TransA, vendor::hipblas::HIPBLAS_OP_T as i64);
    f.desc(desc, MatmulDescAttr::AScalePointer, 0x5CA0);
    f.desc(desc, MatmulDescAttr::BScalePointer, 0x5CB0);
    for (l, mat) in [(LA, &a), (LB, &b), (LC, &d), (LD, &d)] {
        f.layout(l, mat);
    }
    let (alpha, beta) = (1.0f32, 0.0f32);
    let args = hip_args(desc, &a, &b, &d, &alpha as *const f32 as _, &beta as *const f32 as _);
    assert_eq!(
        args.decode_with(&f).unwrap_err().0,
        "hipblasLt: descriptor not seen at creation (compute and scale type unknown)"
    );
    qs_hipblaslt::record_desc(mptr(desc), vendor::hipblas::HIPBLAS_COMPUTE_32F, vendor::data_type::HIP_R_32F);
    let g = args.decode_with(&f).unwrap();
    assert_eq!(g.entry, "hipblasLtMatmul");
    assert_eq!((g.problem.a.format, g.problem.b.format), (Format::E4m3fnuz, Format::E4m3fnuz));
    assert_eq!(g.problem.b_tensor_scale, Some(Scalar::Device { ptr: 0x5CA0, format: Format::F32 }));
    let scalars =
        DeviceScalarValues { a_tensor_scale: Some(2.0), b_tensor_scale: Some(0.25), ..Default::default() };
    let want = naive(
        Transpose::T,
        Transpose::N,
        (m, n, k, 1),
        &a,
        &b,
        None,
        (1.0, 0.0),
        &|_, _| 0.25,
        &|_, _| 2.0,
        None,
    );
    check_against_naive(&g, &[&a, &b, &d], &[], scalars, &want);

    // Row-wise through the 0.12 vector attributes (102/103).
    let desc2 = 0xD2;
    f.new_desc(desc2, 0, 0);
    f.desc(desc2, MatmulDescAttr::TransA, vendor::hipblas::HIPBLAS_OP_T as i64);
    f.desc(desc2, MatmulDescAttr::AScalePointerVec, 0x5CA0);
    f.desc(desc2, MatmulDescAttr::BScalePointerVec, 0x5CB0);
    qs_hipblaslt::record_desc(
        mptr(desc2),
        vendor::hipblas::HIPBLAS_COMPUTE_32F,
        vendor::data_type::HIP_R_32F,
    );
    let g = hip_args(desc2, &a, &b, &d, &alpha as *const f32 as _, &beta as *const f32 as _)
        .decode_with(&f)
        .unwrap();
    let sa: Vec<f64> = (0..m).map(|i| (i + 1) as f64).collect();
    let sb: Vec<f64> = (0..n).map(|j| 0.5 * (j + 1) as f64).collect();
    assert_eq!(g.problem.b_scale.unwrap().granularity, ScaleGranularity::PerOuter);
    let want = naive(
        Transpose::T,
        Transpose::N,
        (m, n, k, 1),
        &a,
        &b,
        None,
        (1.0, 0.0),
        &|i, _| sa[i as usize],
        &|_, j| sb[j as usize],
        None,
    );
    check_against_naive(
        &g,
        &[&a, &b, &d],
        &[(0x5CA0, f32_bytes(&sa)), (0x5CB0, f32_bytes(&sb))],
        DeviceScalarValues::default(),
        &want,
    );

    // On hipBLASLt 1.1 (ROCm 7.1) 102 is a clamp bound, not a scale vector: the same
    // descriptor read by that version has no vector scale (and CLAMP epilogues are skipped).
    let f71 = FakeLt::new(Lt::Hip, LibVersion::new(1, 1, 0));
    f71.new_desc(desc2, 0, 0);
    f71.desc(desc2, MatmulDescAttr::TransA, vendor::hipblas::HIPBLAS_OP_T as i64);
    f71.desc(desc2, MatmulDescAttr::Epilogue, vendor::hipblaslt::HIPBLASLT_EPILOGUE_CLAMP_EXT as i64);
    for (l, mat) in [(LA, &a), (LB, &b), (LC, &d), (LD, &d)] {
        f71.layout(l, mat);
    }
    let err =
        hip_args(desc2, &a, &b, &d, &alpha as *const f32 as _, &beta as *const f32 as _).decode_with(&f71);
    assert_eq!(err.unwrap_err().0, "hipblasLt: epilogue HIPBLASLT_EPILOGUE_CLAMP_EXT not supported");

    qs_hipblaslt::forget_desc(mptr(desc));
    qs_hipblaslt::forget_desc(mptr(desc2));
    assert!(qs_hipblaslt::desc_types(mptr(desc)).is_none());
}

/// `F.linear` with bias on ROCm: the bias type left unset (HIPBLASLT_DATATYPE_INVALID = 255)
/// is D's type; the bias runs along the output features.
#[test]
fn hipblaslt_linear_with_bias() {
    let v = LibVersion::new(1, 1, 0);
    let mut rng = SplitMix64::new(23);
    let (out_f, tokens, in_f) = (5u64, 4u64, 6u64);
    let w = Mat::new(&mut rng, 0x1000, Format::Bf16, false, in_f, out_f, in_f, 1, 0);
    let x = Mat::new(&mut rng, 0x2000, Format::Bf16, false, in_f, tokens, in_f, 1, 0);
    let y = Mat::new(&mut rng, 0x3000, Format::Bf16, false, out_f, tokens, out_f, 1, 0);
    let bias_vals: Vec<f64> = (0..out_f).map(|i| 1.0 - i as f64 * 0.5).collect();
    let mut bias = vec![0u8; 2 * out_f as usize];
    for (i, b) in bias_vals.iter().enumerate() {
        Format::Bf16.store_code(&mut bias, i, Format::Bf16.encode(*b));
    }
    let desc = 0xD3;
    let f = FakeLt::new(Lt::Hip, v);
    f.new_desc(desc, 0, 0);
    f.desc(desc, MatmulDescAttr::TransA, vendor::hipblas::HIPBLAS_OP_T as i64);
    f.desc(desc, MatmulDescAttr::Epilogue, vendor::hipblaslt::HIPBLASLT_EPILOGUE_BIAS as i64);
    f.desc(desc, MatmulDescAttr::BiasPointer, 0xB1A5);
    for (l, mat) in [(LA, &w), (LB, &x), (LC, &y), (LD, &y)] {
        f.layout(l, mat);
    }
    qs_hipblaslt::record_desc(mptr(desc), vendor::hipblas::HIPBLAS_COMPUTE_32F, vendor::data_type::HIP_R_32F);
    let (alpha, beta) = (1.0f32, 0.0f32);
    let g = hip_args(desc, &w, &x, &y, &alpha as *const f32 as _, &beta as *const f32 as _)
        .decode_with(&f)
        .unwrap();
    qs_hipblaslt::forget_desc(mptr(desc));
    let b = g.problem.epilogue.bias.unwrap();
    assert_eq!((b.axis, b.format), (BiasAxis::Cols, Format::Bf16));
    let want = naive(
        Transpose::T,
        Transpose::N,
        (out_f, tokens, in_f, 1),
        &w,
        &x,
        None,
        (1.0, 0.0),
        &one,
        &one,
        Some(&bias_vals),
    );
    check_against_naive(&g, &[&w, &x, &y], &[(0xB1A5, bias)], DeviceScalarValues::default(), &want);
}

#[test]
fn hipblaslt_desc_map_is_bounded() {
    let map = qs_hipblaslt::DescTypes::new(4);
    for i in 1..=6u64 {
        map.record(mptr(i), 2, 0);
    }
    assert_eq!(map.overflow(), 2);
    assert_eq!(map.get(mptr(4)), Some((2, 0)));
    assert_eq!(map.get(mptr(5)), None);
    map.record(mptr(4), 7, 14); // re-creation at a reused address updates in place
    assert_eq!(map.get(mptr(4)), Some((7, 14)));
    map.forget(mptr(1));
    map.record(mptr(5), 2, 0);
    assert_eq!(map.get(mptr(5)), Some((2, 0)));
    assert_eq!(map.overflow(), 2);
}

// =============================================================================================
// hipBLAS / rocBLAS
// =============================================================================================

#[test]
fn hipblas_legacy_and_v2_abis_agree() {
    let mut rng = SplitMix64::new(15);
    let (m, n, k) = (6u64, 4u64, 8u64);
    let a = Mat::new(&mut rng, 0x1000, Format::Bf16, false, k, m, k, 1, 0);
    let b = Mat::new(&mut rng, 0x2000, Format::Bf16, false, k, n, k, 1, 0);
    let c = Mat::new(&mut rng, 0x3000, Format::Bf16, false, m, n, m, 1, 0);
    let (alpha, beta) = (1.0f32, 0.0f32);
    let legacy = hook::hipblasGemmEx::Args {
        handle: mptr(HANDLE),
        trans_a: 112,
        trans_b: 111,
        m: m as i32,
        n: n as i32,
        k: k as i32,
        alpha: &alpha as *const f32 as _,
        a: ptr(a.ptr),
        a_type: vendor::hipblas::HIPBLAS_R_16B,
        lda: k as i32,
        b: ptr(b.ptr),
        b_type: vendor::hipblas::HIPBLAS_R_16B,
        ldb: k as i32,
        beta: &beta as *const f32 as _,
        c: mptr(c.ptr),
        c_type: vendor::hipblas::HIPBLAS_R_16B,
        ldc: m as i32,
        compute: vendor::hipblas::HIPBLAS_R_32F,
        algo: 0,
    };
    let v2 = hook::hipblasGemmEx_v2::Args {
        handle: legacy.handle,
        trans_a: 112,
        trans_b: 111,
        m: legacy.m,
        n: legacy.n,
        k: legacy.k,
        alpha: legacy.alpha,
        a: legacy.a,
        a_type: vendor::data_type::HIP_R_16BF,
        lda: legacy.lda,
        b: legacy.b,
        b_type: vendor::data_type::HIP_R_16BF,
        ldb: legacy.ldb,
        beta: legacy.beta,
        c: legacy.c,
        c_type: vendor::data_type::HIP_R_16BF,
        ldc: legacy.ldc,
        compute: vendor::hipblas::HIPBLAS_COMPUTE_32F,
        algo: 0,
    };
    // hipBLAS >= 3 takes the v2 types through the plain symbol too.
    let plain_new = hook::hipblasGemmEx::Args {
        a_type: v2.a_type,
        b_type: v2.b_type,
        c_type: v2.c_type,
        compute: v2.compute,
        ..legacy
    };
    let h = FakeHandle::host();
    let g1 = legacy.decode_with(&h).unwrap();
    let g2 = v2.decode_with(&h).unwrap();
    let g3 = plain_new.decode_with(&h).unwrap();
    assert_eq!(g1.problem, g2.problem);
    assert_eq!(g1.problem, g3.problem);
    let want = naive(Transpose::T, Transpose::N, (m, n, k, 1), &a, &b, None, (1.0, 0.0), &one, &one, None);
    check_against_naive(&g1, &[&a, &b, &c], &[], DeviceScalarValues::default(), &want);
    // Legacy types on the _v2 symbol read as hipDataType: 168 is none of them.
    let bad = hook::hipblasGemmEx_v2::Args { a_type: vendor::hipblas::HIPBLAS_R_16B, ..v2 };
    assert_eq!(bad.decode_with(&h).unwrap_err().0, "hipblas: data type <unknown hipDataType> not supported");
}

#[test]
fn hipblas_strided_batched_v2() {
    let mut rng = SplitMix64::new(16);
    let (m, n, k, batch) = (3u64, 5u64, 4u64, 2u64);
    let a = Mat::new(&mut rng, 0x1000, Format::F16, false, m, k, m, batch, m * k);
    let b = Mat::new(&mut rng, 0x2000, Format::F16, false, n, k, n, batch, 0);
    let c = Mat::new(&mut rng, 0x3000, Format::F16, false, m, n, m, batch, m * n);
    let (alpha, beta) = (1.0f32, 1.0f32);
    let args = hook::hipblasGemmStridedBatchedEx_v2::Args {
        handle: mptr(HANDLE),
        trans_a: 111,
        trans_b: 112,
        m: m as i32,
        n: n as i32,
        k: k as i32,
        alpha: &alpha as *const f32 as _,
        a: ptr(a.ptr),
        a_type: vendor::data_type::HIP_R_16F,
        lda: m as i32,
        stride_a: (m * k) as i64,
        b: ptr(b.ptr),
        b_type: vendor::data_type::HIP_R_16F,
        ldb: n as i32,
        stride_b: 0,
        beta: &beta as *const f32 as _,
        c: mptr(c.ptr),
        c_type: vendor::data_type::HIP_R_16F,
        ldc: m as i32,
        stride_c: (m * n) as i64,
        batch: batch as i32,
        compute: vendor::hipblas::HIPBLAS_COMPUTE_32F,
        algo: 0,
    };
    let g = args.decode_with(&FakeHandle::host()).unwrap();
    assert_eq!(g.problem.a.batch_stride, 0, "broadcast vendor B");
    let want =
        naive(Transpose::N, Transpose::T, (m, n, k, batch), &a, &b, Some(&c), (1.0, 1.0), &one, &one, None);
    check_against_naive(&g, &[&a, &b, &c], &[], DeviceScalarValues::default(), &want);
}

/// rocblas_gemm_ex with C != D (and different leading dimensions): D = alpha AB + beta C.
#[test]
fn rocblas_gemm_ex_separate_c_and_d() {
    use vendor::rocblas::*;
    let mut rng = SplitMix64::new(17);
    let (m, n, k) = (5u64, 6u64, 7u64);
    let a = Mat::new(&mut rng, 0x1000, Format::F16, false, k, m, k + 1, 1, 0);
    let b = Mat::new(&mut rng, 0x2000, Format::F16, false, k, n, k, 1, 0);
    let c = Mat::new(&mut rng, 0x3000, Format::F16, false, m, n, m + 2, 1, 0);
    let d = Mat::new(&mut rng, 0x4000, Format::F16, false, m, n, m, 1, 0);
    let (alpha, beta) = (1.0f32, 0.5f32);
    let args = hook::rocblas_gemm_ex::Args {
        handle: mptr(HANDLE),
        trans_a: rocblas_operation_transpose,
        trans_b: rocblas_operation_none,
        m: m as i32,
        n: n as i32,
        k: k as i32,
        alpha: &alpha as *const f32 as _,
        a: ptr(a.ptr),
        a_type: rocblas_datatype_f16_r,
        lda: (k + 1) as i32,
        b: ptr(b.ptr),
        b_type: rocblas_datatype_f16_r,
        ldb: k as i32,
        beta: &beta as *const f32 as _,
        c: ptr(c.ptr),
        c_type: rocblas_datatype_f16_r,
        ldc: (m + 2) as i32,
        d: mptr(d.ptr),
        d_type: rocblas_datatype_f16_r,
        ldd: m as i32,
        compute: rocblas_datatype_f32_r,
        algo: 0,
        solution_index: 0,
        flags: 0,
    };
    let g = args.decode_with(&FakeHandle::host()).unwrap();
    assert_eq!((g.buffers.c, g.buffers.d), (c.ptr, d.ptr));
    assert_eq!((g.problem.c.unwrap().ld, g.problem.d.ld), (m + 2, m));
    let want =
        naive(Transpose::T, Transpose::N, (m, n, k, 1), &a, &b, Some(&c), (1.0, 0.5), &one, &one, None);
    check_against_naive(&g, &[&a, &b, &c, &d], &[], DeviceScalarValues::default(), &want);

    let alt = hook::rocblas_gemm_ex::Args { flags: rocblas_gemm_flags_fp16_alt_impl, ..args };
    assert_eq!(
        alt.decode_with(&FakeHandle::host()).unwrap_err().0,
        "rocblas: rocblas_gemm_flags_fp16_alt_impl not modeled"
    );

    // ex3 with FP8 (fnuz) inputs and the matching compute type; a converting one is skipped.
    let a8 = Mat::new(&mut rng, 0x5000, Format::E4m3fnuz, false, k, m, k, 1, 0);
    let b8 = Mat::new(&mut rng, 0x6000, Format::E5m2fnuz, false, k, n, k, 1, 0);
    let ex3 = hook::rocblas_gemm_ex3::Args {
        handle: args.handle,
        trans_a: args.trans_a,
        trans_b: args.trans_b,
        m: args.m,
        n: args.n,
        k: args.k,
        alpha: args.alpha,
        a: ptr(a8.ptr),
        a_type: rocblas_datatype_f8_r,
        lda: k as i32,
        b: ptr(b8.ptr),
        b_type: rocblas_datatype_bf8_r,
        ldb: k as i32,
        beta: args.beta,
        c: args.c,
        c_type: args.c_type,
        ldc: args.ldc,
        d: args.d,
        d_type: args.d_type,
        ldd: args.ldd,
        compute: rocblas_compute_type_f8_bf8_f32,
        algo: 0,
        solution_index: 0,
        flags: 0,
    };
    let g = ex3.decode_with(&FakeHandle::host()).unwrap();
    assert_eq!((g.problem.b.format, g.problem.a.format), (Format::E4m3fnuz, Format::E5m2fnuz));
    let want =
        naive(Transpose::T, Transpose::N, (m, n, k, 1), &a8, &b8, Some(&c), (1.0, 0.5), &one, &one, None);
    check_against_naive(&g, &[&a8, &b8, &c, &d], &[], DeviceScalarValues::default(), &want);
    let conv = hook::rocblas_gemm_ex3::Args { compute: rocblas_compute_type_f8_f8_f32, ..ex3 };
    assert_eq!(
        conv.decode_with(&FakeHandle::host()).unwrap_err().0,
        "rocblas: rocblas_compute_type_f8_f8_f32 converting A/B before the multiply not modeled"
    );
}

#[test]
fn rocblas_strided_batched_in_place() {
    use vendor::rocblas::*;
    let (alpha, beta) = (1.0f32, 0.0f32);
    let args = hook::rocblas_gemm_strided_batched_ex::Args {
        handle: mptr(HANDLE),
        trans_a: rocblas_operation_none,
        trans_b: rocblas_operation_none,
        m: 8,
        n: 8,
        k: 8,
        alpha: &alpha as *const f32 as _,
        a: ptr(0x1000),
        a_type: rocblas_datatype_bf16_r,
        lda: 8,
        stride_a: 64,
        b: ptr(0x2000),
        b_type: rocblas_datatype_bf16_r,
        ldb: 8,
        stride_b: 64,
        beta: &beta as *const f32 as _,
        c: ptr(0x3000),
        c_type: rocblas_datatype_bf16_r,
        ldc: 8,
        stride_c: 64,
        d: mptr(0x3000),
        d_type: rocblas_datatype_bf16_r,
        ldd: 8,
        stride_d: 64,
        batch: 3,
        compute: rocblas_datatype_f32_r,
        algo: 0,
        solution_index: 0,
        flags: 0,
    };
    let g = args.decode_with(&FakeHandle::host()).unwrap();
    assert_eq!(g.problem.batch, 3);
    assert_eq!(g.problem.d.batch_stride, 64);
    assert!(g.problem.c.is_none());
    assert_eq!(g.problem.epilogue.activation, Activation::None);
    assert!(g.problem.epilogue.bias.is_none());
}

/// `cublasSetWorkspace_v2`'s workspace is what the handle's later GEMMs may write besides D
/// (their scratch); a new one replaces it, a null one forgets it, and the registry is bounded.
#[test]
fn a_workspace_set_on_a_handle_is_its_gemms_scratch() {
    use quantshadow_runtime::intercept::common::WORKSPACES_PER_THREAD;
    use quantshadow_runtime::intercept::cublas::CUBLAS_HANDLE;
    let gemm = |handle: usize| hook::cublasGemmEx::Args {
        handle: mptr(handle as u64),
        trans_a: 1,
        trans_b: 0,
        m: 4,
        n: 4,
        k: 4,
        alpha: std::ptr::null(),
        a: ptr(0x1000),
        a_type: 14,
        lda: 4,
        b: ptr(0x2000),
        b_type: 14,
        ldb: 4,
        beta: std::ptr::null(),
        c: mptr(0x3000),
        c_type: 14,
        ldc: 4,
        compute: 68,
        algo: -1,
    };
    let (h1, h2) = (0x5157_0001usize, 0x5157_0002usize);
    assert_eq!(gemm(h1).scratch(), None);
    CUBLAS_HANDLE.set_workspace(mptr(h1 as u64), mptr(0x7000_0000), 4 << 20);
    assert_eq!(gemm(h1).scratch(), Some((0x7000_0000, 0x7000_0000 + (4 << 20))));
    assert_eq!(gemm(h2).scratch(), None, "another handle's calls have none");
    CUBLAS_HANDLE.set_workspace(mptr(h1 as u64), mptr(0x9000_0000), 1024);
    assert_eq!(gemm(h1).scratch(), Some((0x9000_0000, 0x9000_0400)), "the newest workspace");
    CUBLAS_HANDLE.set_workspace(mptr(h1 as u64), std::ptr::null_mut(), 0);
    assert_eq!(gemm(h1).scratch(), None, "back to the library's own (unknown)");
    // Bounded: the oldest handle is forgotten first.
    for i in 0..=WORKSPACES_PER_THREAD as u64 {
        CUBLAS_HANDLE.set_workspace(mptr(0x6000_0000 + i), mptr(0x1_0000_0000 + (i << 20)), 4096);
    }
    assert_eq!(gemm(0x6000_0000).scratch(), None);
    assert_eq!(gemm(0x6000_0001).scratch(), Some((0x1_0010_0000, 0x1_0010_1000)));
    // Another vendor's handle at the same address is another handle.
    let newest = 0x6000_0000 + WORKSPACES_PER_THREAD;
    let its = Some((
        0x1_0000_0000 + ((WORKSPACES_PER_THREAD as u64) << 20),
        0x1_0000_1000 + ((WORKSPACES_PER_THREAD as u64) << 20),
    ));
    quantshadow_runtime::intercept::hipblas::HIPBLAS_HANDLE.set_workspace(
        mptr(newest as u64),
        mptr(0x42_0000),
        64,
    );
    assert_eq!(gemm(newest).scratch(), its);
    // Per thread: a call on another thread knows none.
    let other = std::thread::spawn(move || gemm(newest).scratch()).join().unwrap();
    assert_eq!(other, None);
}

/// Host time of remembering a handle's workspace, as PyTorch's `cublasSetWorkspace_v2` before
/// every BLAS call makes the hook do (the hook's own guard comes on top). A benchmark, not a
/// timed test: `cargo test --release -p quantshadow-runtime --test intercept_decode
/// bench_set_workspace -- --ignored --nocapture`.
#[test]
#[ignore]
fn bench_set_workspace() {
    use quantshadow_runtime::intercept::cublas::CUBLAS_HANDLE;
    let calls = 10_000_000u64;
    let t = std::time::Instant::now();
    for i in 0..calls {
        // Four handles in turn (threads x streams), each given its workspace again.
        let h = 0x5157_1000 + (i & 3);
        CUBLAS_HANDLE.set_workspace(mptr(h), mptr(0x7000_0000 + (h << 20)), 4 << 20);
    }
    let set = t.elapsed().as_nanos() as f64 / calls as f64;
    let t = std::time::Instant::now();
    let mut found = 0u64;
    for i in 0..calls {
        found += CUBLAS_HANDLE.workspace(mptr(0x5157_1000 + (i & 3))).is_some() as u64;
    }
    let get = t.elapsed().as_nanos() as f64 / calls as f64;
    assert_eq!(found, calls);
    println!("set_workspace {set:.1} ns, workspace lookup {get:.1} ns per call");
}
