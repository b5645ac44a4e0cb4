//! The fixture vendor library (tests/fixtures/fixture_vendor.c), dlopen'd from Rust and called
//! through its real cuBLASLt / cuBLAS / hipBLASLt symbols:
//! - its enum numbering equals the runtime's vendor tables (every enumerator of its header);
//! - every entry point agrees with the f64 oracle (`runtime::oracle`, fed the call described
//!   directly in column-major terms, independently of the C side's transpose identity) on
//!   random data, odd sizes, M (tokens) in {1, 7, 57, 129}: within one ulp of D's format plus
//!   FP32 accumulation error; the host check backend passes the same calls;
//! - attribute get/set follow the vendors' size rules;
//! - `fixture_host` runs every scenario with stable checksums (threads and children see the
//!   same per-call results), and a planted fault (FIXTURE_VENDOR_FAULT) changes exactly the
//!   call it names.

use quantshadow_runtime::engine::backend::{Backend, CheckRequest, Diagnose, Polled, SketchSettings};
use quantshadow_runtime::engine::host::HostBackend;
use quantshadow_runtime::formats::Format;
use quantshadow_runtime::intercept::InterceptedGemm;
use quantshadow_runtime::oracle::{decode_output, reference_gemm, OracleOptions};
use quantshadow_runtime::problem::{
    Activation, Bias, BiasAxis, GemmBuffers, GemmProblem, HostInputs, MatrixLayout, Order, Scalar,
    ScaleGranularity, ScaleSpec, Transpose,
};
use quantshadow_runtime::record::CheckMode;
use quantshadow_runtime::rng::SplitMix64;
use quantshadow_runtime::thresholds::Thresholds;
use quantshadow_runtime::vendor::{side_tables, Side};
use std::collections::BTreeMap;
use std::ffi::{c_void, CString};
use std::process::{Command, Output};
use std::ptr::null_mut;
use std::sync::OnceLock;

const VENDOR: &str = env!("QUANTSHADOW_FIXTURE_VENDOR");
const HOST: &str = env!("QUANTSHADOW_FIXTURE_HOST");
const TOKENS: [u64; 4] = [1, 7, 57, 129];

// ---------------------------------------------------------------------------------------------
// The library and its symbols
// ---------------------------------------------------------------------------------------------

struct Lib(*mut c_void);
// SAFETY: a dlopen handle is process-global and usable from any thread.
unsafe impl Send for Lib {}
unsafe impl Sync for Lib {}

fn lib() -> &'static Lib {
    static LIB: OnceLock<Lib> = OnceLock::new();
    LIB.get_or_init(|| {
        let path = CString::new(VENDOR).unwrap();
        // SAFETY: loading a library built by build.rs.
        let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!h.is_null(), "dlopen {VENDOR}");
        Lib(h)
    })
}

/// The symbol `name` as a function pointer of type `F`.
fn sym<F: Copy>(name: &str) -> F {
    let c = CString::new(name).unwrap();
    // SAFETY: the handle is valid; the caller names the symbol's real type.
    let p = unsafe { libc::dlsym(lib().0, c.as_ptr()) };
    assert!(!p.is_null(), "{name} missing");
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) }
}

type P = *mut c_void;
type Cp = *const c_void;
type Create = unsafe extern "C" fn(*mut P) -> i32;
type DescCreate = unsafe extern "C" fn(*mut P, i32, i32) -> i32;
type SetAttr = unsafe extern "C" fn(P, i32, Cp, usize) -> i32;
type GetAttr = unsafe extern "C" fn(P, i32, P, usize, *mut usize) -> i32;
type LayoutCreate = unsafe extern "C" fn(*mut P, i32, u64, u64, i64) -> i32;
type Matmul = unsafe extern "C" fn(P, P, Cp, Cp, P, Cp, P, Cp, Cp, P, P, P, Cp, P, usize, P) -> i32;
type GemmEx = unsafe extern "C" fn(
    P,
    i32,
    i32,
    i32,
    i32,
    i32,
    Cp,
    Cp,
    i32,
    i32,
    Cp,
    i32,
    i32,
    Cp,
    P,
    i32,
    i32,
    i32,
    i32,
) -> i32;
type Sgemm = unsafe extern "C" fn(
    P,
    i32,
    i32,
    i32,
    i32,
    i32,
    *const f32,
    *const f32,
    i32,
    *const f32,
    i32,
    *const f32,
    *mut f32,
    i32,
) -> i32;
type StridedEx = unsafe extern "C" fn(
    P,
    i32,
    i32,
    i32,
    i32,
    i32,
    Cp,
    Cp,
    i32,
    i32,
    i64,
    Cp,
    i32,
    i32,
    i64,
    Cp,
    P,
    i32,
    i32,
    i64,
    i32,
    i32,
    i32,
) -> i32;

fn handle(create: &str) -> P {
    let mut h = null_mut();
    assert_eq!(unsafe { sym::<Create>(create)(&mut h) }, 0);
    h
}

// ---------------------------------------------------------------------------------------------
// Numbering
// ---------------------------------------------------------------------------------------------

#[test]
fn header_numbering_matches_the_runtime_vendor_tables() {
    let mut known: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    for side in [Side::Cuda, Side::Hip] {
        for (_, table) in side_tables(side) {
            for c in table {
                known.entry(c.name).or_default().push(c.value);
            }
        }
    }
    let header = std::fs::read_to_string("tests/fixtures/fixture_vendor.h").unwrap();
    let mut checked = 0;
    // Enumerators: "NAME = value" between separators, one per line or several on one line.
    for piece in header.split(['\n', ',', '{', '}']) {
        let Some((name, value)) = piece.trim().split_once(" = ") else { continue };
        let name = name.trim();
        if !name.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_' || c == 'x') {
            continue;
        }
        let value: i64 = value.trim().parse().unwrap_or_else(|_| panic!("{piece}"));
        let values = known.get(name).unwrap_or_else(|| panic!("{name} is in no runtime vendor table"));
        assert!(values.contains(&value), "{name} = {value} in the header, {values:?} in the runtime tables");
        checked += 1;
    }
    assert!(checked > 100, "only {checked} enumerators read");
}

// ---------------------------------------------------------------------------------------------
// Calls against the oracle
// ---------------------------------------------------------------------------------------------

/// A stored matrix (vendor terms) with random contents.
struct Mat {
    layout: MatrixLayout,
    bytes: Vec<u8>,
}

impl Mat {
    fn new(format: Format, order: Order, rows: u64, cols: u64, pad: u64, batch: u64, seed: u64) -> Mat {
        let mut layout = MatrixLayout::packed(format, order, rows, cols);
        layout.ld += pad;
        layout.batch_stride = if batch > 1 { layout.required_elements(rows, cols, 1) + 5 } else { 0 };
        let n = layout.required_elements(rows, cols, batch) as usize;
        Mat { layout, bytes: random(format, n, seed, -1.0, 1.0) }
    }

    fn ptr(&self) -> Cp {
        self.bytes.as_ptr() as Cp
    }

    fn ld(&self) -> i32 {
        self.layout.ld as i32
    }
}

fn random(format: Format, n: usize, seed: u64, lo: f64, hi: f64) -> Vec<u8> {
    let mut rng = SplitMix64::new(seed);
    let mut bytes = vec![0u8; format.bytes_for(n)];
    let scale = if format.class() == quantshadow_runtime::formats::FormatClass::Fp8 { 4.0 } else { 1.0 };
    for i in 0..n {
        format.store_code(&mut bytes, i, format.encode(scale * rng.uniform(lo, hi)));
    }
    bytes
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// One vendor call in oracle terms plus its buffers.
struct Case {
    name: String,
    p: GemmProblem,
    a: Mat,
    b: Mat,
    c: Option<Vec<u8>>,
    d: Vec<u8>,
    a_scale: Option<Vec<u8>>,
    b_scale: Option<Vec<u8>>,
    bias: Option<Vec<u8>>,
}

impl Case {
    /// Column-major D (m x n) = op(A) op(B), as cuBLAS describes it.
    #[allow(clippy::too_many_arguments)]
    fn new(
        name: String,
        m: u64,
        n: u64,
        k: u64,
        batch: u64,
        ta: Transpose,
        tb: Transpose,
        fa: Format,
        fb: Format,
        fd: Format,
        order: Order,
        seed: u64,
    ) -> Case {
        let (ar, ac) = if ta == Transpose::N { (m, k) } else { (k, m) };
        let (br, bc) = if tb == Transpose::N { (k, n) } else { (n, k) };
        let a = Mat::new(fa, order, ar, ac, 3, batch, seed);
        let b = Mat::new(fb, order, br, bc, 1, batch, seed + 1);
        let mut d_layout = MatrixLayout::packed(fd, order, m, n);
        d_layout.ld += 2;
        d_layout.batch_stride = if batch > 1 { d_layout.required_elements(m, n, 1) + 1 } else { 0 };
        let d = vec![0u8; fd.bytes_for(d_layout.required_elements(m, n, batch) as usize)];
        let mut p = GemmProblem::row_major(m, n, k, fa, fb, fd);
        p.batch = batch;
        p.trans_a = ta;
        p.trans_b = tb;
        p.a = a.layout;
        p.b = b.layout;
        p.d = d_layout;
        Case { name, p, a, b, c: None, d, a_scale: None, b_scale: None, bias: None }
    }

    fn d_ptr(&mut self) -> P {
        self.d.as_mut_ptr() as P
    }

    /// C = D's buffer pre-filled with random values (in place, beta != 0).
    fn in_place_c(&mut self, beta: f64) {
        let n = self.p.d.required_elements(self.p.m, self.p.n, self.p.batch) as usize;
        self.d = random(self.p.d.format, n, 77, -1.0, 1.0);
        self.c = Some(self.d.clone());
        self.p.c = Some(self.p.d);
        self.p.beta = Scalar::Host(beta);
    }

    fn inputs(&self) -> HostInputs {
        HostInputs {
            a: self.a.bytes.clone(),
            b: self.b.bytes.clone(),
            c: self.c.clone(),
            a_scale: self.a_scale.clone(),
            b_scale: self.b_scale.clone(),
            bias: self.bias.clone(),
            device_scalars: Default::default(),
        }
    }

    /// D against the f64 oracle, element by element, then through the host backend.
    fn check(&self, status: i32) {
        assert_eq!(status, 0, "{}: vendor status", self.name);
        let p = &self.p;
        let exact = reference_gemm(p, &self.inputs(), &OracleOptions { round_output: false, rows: None })
            .unwrap_or_else(|e| panic!("{}: oracle: {e}", self.name));
        let prod = decode_output(p, &self.d).unwrap().values;
        let peak = exact.values.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        for (i, (d, r)) in prod.iter().zip(&exact.values).enumerate() {
            // One ulp of D's format (rounding) plus FP32 accumulation error.
            let tol = ulp(p.d.format, r.abs()) + 1e-5 * peak;
            assert!((d - r).abs() <= tol, "{}: element {i}: {d} vs exact {r} (tol {tol})", self.name);
        }

        // The same call through the host backend (the bytes of C as before the call).
        let addr = |v: &Option<Vec<u8>>| v.as_ref().map_or(0, |v| v.as_ptr() as u64);
        let call = InterceptedGemm {
            entry: "fixture",
            problem: p.clone(),
            buffers: GemmBuffers {
                a: self.a.bytes.as_ptr() as u64,
                b: self.b.bytes.as_ptr() as u64,
                c: addr(&self.c),
                d: self.d.as_ptr() as u64,
                a_scale: addr(&self.a_scale),
                b_scale: addr(&self.b_scale),
                bias: addr(&self.bias),
                amax_d: 0,
            },
            stream: 0,
            pointer_arrays: None,
        };
        let backend = HostBackend::default();
        let thresholds = Thresholds::default();
        for mode in [CheckMode::Full, CheckMode::Sketch] {
            let req = CheckRequest {
                call: &call,
                mode,
                site_ordinal: 0,
                site_id: 1,
                call_seq: 0,
                site_epoch: 0,
                sketch: SketchSettings { seed: 3, probes: 32, rows_per_call: 256 },
                rows_per_call: 256,
                logits_topk: None,
                device_gate: None,
                diagnose: Diagnose::No,
                thresholds: &thresholds,
                rewrites_inputs: false,
                scratch: None,
            };
            backend.after_call(&req, Default::default()).unwrap();
            let mut out = Vec::new();
            backend.poll(&mut out);
            let Some(Polled::Done(o)) = out.pop() else { panic!("{}: no host result", self.name) };
            let violations = Thresholds::default().judge(p.class(), &o.metrics);
            assert!(violations.is_empty(), "{} {mode:?}: {violations:?}", self.name);
        }
    }
}

fn ulp(format: Format, x: f64) -> f64 {
    let mant = match format {
        Format::F32 => 23,
        Format::F16 => 10,
        Format::Bf16 => 7,
        _ => 3,
    };
    let min_exp = match format {
        Format::F16 => -14,
        _ => -126,
    };
    let e = if x > 0.0 { x.log2().floor() as i32 } else { min_exp };
    2f64.powi(e.max(min_exp) - mant)
}

const CUDA_R_32F: i32 = 0;
const CUDA_R_16F: i32 = 2;
const CUDA_R_16BF: i32 = 14;
const CUDA_R_8F_E4M3: i32 = 28;
const CUDA_R_8F_E5M2: i32 = 29;
const HIP_R_8F_E4M3_FNUZ: i32 = 1000;

#[test]
fn cublas_gemm_ex_sgemm_and_strided_batched_match_the_oracle() {
    let h = handle("cublasCreate_v2");
    let gemm_ex: GemmEx = sym("cublasGemmEx");
    let sgemm: Sgemm = sym("cublasSgemm_v2");
    let strided: StridedEx = sym("cublasGemmStridedBatchedEx");
    for (t, &tokens) in TOKENS.iter().enumerate() {
        let s = 100 * t as u64;
        // PyTorch linear: (T, N, out, tokens, in), bf16.
        let mut c = Case::new(
            format!("GemmEx bf16 T,N M={tokens}"),
            13,
            tokens,
            37,
            1,
            Transpose::T,
            Transpose::N,
            Format::Bf16,
            Format::Bf16,
            Format::Bf16,
            Order::ColMajor,
            s,
        );
        let (alpha, beta) = (1.0f32, 0.0f32);
        let st = unsafe {
            gemm_ex(
                h,
                1,
                0,
                13,
                tokens as i32,
                37,
                &alpha as *const f32 as Cp,
                c.a.ptr(),
                CUDA_R_16BF,
                c.a.ld(),
                c.b.ptr(),
                CUDA_R_16BF,
                c.b.ld(),
                &beta as *const f32 as Cp,
                c.d_ptr(),
                CUDA_R_16BF,
                c.p.d.ld as i32,
                68,
                -1,
            )
        };
        c.check(st);

        // f16 inputs, f32 output accumulated in place (beta != 0), N,T.
        let mut c = Case::new(
            format!("GemmEx f16->f32 N,T beta M={tokens}"),
            tokens,
            11,
            29,
            1,
            Transpose::N,
            Transpose::T,
            Format::F16,
            Format::F16,
            Format::F32,
            Order::ColMajor,
            s + 10,
        );
        c.in_place_c(0.5);
        let (alpha, beta) = (2.0f32, 0.5f32);
        c.p.alpha = Scalar::Host(2.0);
        let st = unsafe {
            gemm_ex(
                h,
                0,
                1,
                tokens as i32,
                11,
                29,
                &alpha as *const f32 as Cp,
                c.a.ptr(),
                CUDA_R_16F,
                c.a.ld(),
                c.b.ptr(),
                CUDA_R_16F,
                c.b.ld(),
                &beta as *const f32 as Cp,
                c.d_ptr(),
                CUDA_R_32F,
                c.p.d.ld as i32,
                68,
                -1,
            )
        };
        c.check(st);

        // fp32 Sgemm T,T with alpha/beta.
        let mut c = Case::new(
            format!("Sgemm T,T M={tokens}"),
            tokens,
            9,
            31,
            1,
            Transpose::T,
            Transpose::T,
            Format::F32,
            Format::F32,
            Format::F32,
            Order::ColMajor,
            s + 20,
        );
        c.in_place_c(-0.5);
        c.p.alpha = Scalar::Host(1.5);
        let (alpha, beta) = (1.5f32, -0.5f32);
        let st = unsafe {
            sgemm(
                h,
                1,
                1,
                tokens as i32,
                9,
                31,
                &alpha,
                c.a.ptr() as *const f32,
                c.a.ld(),
                c.b.ptr() as *const f32,
                c.b.ld(),
                &beta,
                c.d_ptr() as *mut f32,
                c.p.d.ld as i32,
            )
        };
        c.check(st);

        // bmm: batch 3, strided A and D with gaps, B broadcast (stride 0).
        let mut c = Case::new(
            format!("StridedBatchedEx bf16 M={tokens}"),
            tokens,
            10,
            19,
            3,
            Transpose::N,
            Transpose::N,
            Format::Bf16,
            Format::Bf16,
            Format::Bf16,
            Order::ColMajor,
            s + 30,
        );
        c.p.b.batch_stride = 0;
        let (alpha, beta) = (1.0f32, 0.0f32);
        let st = unsafe {
            strided(
                h,
                0,
                0,
                tokens as i32,
                10,
                19,
                &alpha as *const f32 as Cp,
                c.a.ptr(),
                CUDA_R_16BF,
                c.a.ld(),
                c.p.a.batch_stride as i64,
                c.b.ptr(),
                CUDA_R_16BF,
                c.b.ld(),
                0,
                &beta as *const f32 as Cp,
                c.d_ptr(),
                CUDA_R_16BF,
                c.p.d.ld as i32,
                c.p.d.batch_stride as i64,
                3,
                68,
                -1,
            )
        };
        c.check(st);
    }
    // Argument checks: lda too small, unknown compute type.
    let (alpha, beta) = (1.0f32, 0.0f32);
    let mut d = [0u8; 64];
    let st = unsafe {
        gemm_ex(
            h,
            0,
            0,
            4,
            4,
            4,
            &alpha as *const f32 as Cp,
            d.as_ptr() as Cp,
            CUDA_R_16BF,
            3,
            d.as_ptr() as Cp,
            CUDA_R_16BF,
            4,
            &beta as *const f32 as Cp,
            d.as_mut_ptr() as P,
            CUDA_R_16BF,
            4,
            68,
            -1,
        )
    };
    assert_eq!(st, 7, "lda < m is CUBLAS_STATUS_INVALID_VALUE");
    let st = unsafe {
        gemm_ex(
            h,
            0,
            0,
            4,
            4,
            4,
            &alpha as *const f32 as Cp,
            d.as_ptr() as Cp,
            CUDA_R_8F_E4M3,
            4,
            d.as_ptr() as Cp,
            CUDA_R_8F_E4M3,
            4,
            &beta as *const f32 as Cp,
            d.as_mut_ptr() as P,
            CUDA_R_16BF,
            4,
            68,
            -1,
        )
    };
    assert_eq!(st, 15, "FP8 is cuBLASLt-only: CUBLAS_STATUS_NOT_SUPPORTED");
}

/// A cuBLASLt or hipBLASLt matmul descriptor being set up.
struct Lt {
    hip: bool,
    desc: P,
}

impl Lt {
    fn new(hip: bool) -> Lt {
        let mut desc = null_mut();
        let (name, compute) =
            if hip { ("hipblasLtMatmulDescCreate", 2) } else { ("cublasLtMatmulDescCreate", 68) };
        assert_eq!(unsafe { sym::<DescCreate>(name)(&mut desc, compute, CUDA_R_32F) }, 0);
        Lt { hip, desc }
    }

    fn set<T>(&self, attr: i32, v: &T) {
        let name =
            if self.hip { "hipblasLtMatmulDescSetAttribute" } else { "cublasLtMatmulDescSetAttribute" };
        let st =
            unsafe { sym::<SetAttr>(name)(self.desc, attr, v as *const T as Cp, std::mem::size_of::<T>()) };
        assert_eq!(st, 0, "set attribute {attr}");
    }

    fn layout(&self, f: i32, l: &MatrixLayout, rows: u64, cols: u64, batch: u64) -> P {
        let prefix = if self.hip { "hipblasLt" } else { "cublasLt" };
        let mut out = null_mut();
        assert_eq!(
            unsafe {
                sym::<LayoutCreate>(&format!("{prefix}MatrixLayoutCreate"))(
                    &mut out,
                    f,
                    rows,
                    cols,
                    l.ld as i64,
                )
            },
            0
        );
        let set: SetAttr = sym(&format!("{prefix}MatrixLayoutSetAttribute"));
        // (ORDER, BATCH_COUNT, STRIDED_BATCH_OFFSET) ids: cuBLASLt 1/5/6, hipBLASLt 3/0/1.
        let (order_id, batch_id, stride_id) = if self.hip { (3, 0, 1) } else { (1, 5, 6) };
        let order: i32 = (l.order == Order::RowMajor) as i32;
        let (count, stride) = (batch as i32, l.batch_stride as i64);
        unsafe {
            assert_eq!(set(out, order_id, &order as *const i32 as Cp, 4), 0);
            assert_eq!(set(out, batch_id, &count as *const i32 as Cp, 4), 0);
            assert_eq!(set(out, stride_id, &stride as *const i64 as Cp, 8), 0);
        }
        out
    }

    fn run(&self, c: &mut Case, types: (i32, i32, i32), alpha: f32, beta: f32) -> i32 {
        let p = c.p.clone();
        let (ar, ac) = p.a_stored_dims();
        let (br, bc) = p.b_stored_dims();
        let la = self.layout(types.0, &p.a, ar, ac, p.batch);
        let lb = self.layout(types.1, &p.b, br, bc, p.batch);
        let ld = self.layout(types.2, &p.d, p.m, p.n, p.batch);
        let (h, name) = if self.hip {
            (handle("hipblasLtCreate"), "hipblasLtMatmul")
        } else {
            (handle("cublasLtCreate"), "cublasLtMatmul")
        };
        let matmul: Matmul = sym(name);
        let d = c.d_ptr();
        unsafe {
            matmul(
                h,
                self.desc,
                &alpha as *const f32 as Cp,
                c.a.ptr(),
                la,
                c.b.ptr(),
                lb,
                &beta as *const f32 as Cp,
                d,
                ld,
                d,
                ld,
                std::ptr::null(),
                null_mut(),
                0,
                null_mut(),
            )
        }
    }
}

#[test]
fn cublaslt_matmul_matches_the_oracle() {
    for (t, &tokens) in TOKENS.iter().enumerate() {
        let s = 1000 + 100 * t as u64;
        // F.linear + GELU with a bf16 bias (EPILOGUE_GELU_BIAS = 36), TRANSA = T.
        let mut c = Case::new(
            format!("Lt bf16 gelu+bias M={tokens}"),
            21,
            tokens,
            45,
            1,
            Transpose::T,
            Transpose::N,
            Format::Bf16,
            Format::Bf16,
            Format::Bf16,
            Order::ColMajor,
            s,
        );
        let bias = random(Format::Bf16, 21, s + 5, -0.5, 0.5);
        c.p.epilogue = quantshadow_runtime::problem::Epilogue {
            bias: Some(Bias { format: Format::Bf16, axis: BiasAxis::Rows }),
            activation: Activation::GeluTanh,
        };
        let lt = Lt::new(false);
        lt.set(3, &1i32);
        lt.set(7, &36u32);
        lt.set(8, &(bias.as_ptr() as Cp));
        c.bias = Some(bias);
        let st = lt.run(&mut c, (CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF), 1.0, 0.0);
        c.check(st);

        // _scaled_mm tensor-wise: e4m3 weight x e5m2 activations, SCALAR_32F A/B scales, D scale,
        // "device" pointer mode for alpha/beta, D bf16.
        let mut c = Case::new(
            format!("Lt e4m3 x e5m2 tensor M={tokens}"),
            16,
            tokens,
            48,
            1,
            Transpose::T,
            Transpose::N,
            Format::E4m3fn,
            Format::E5m2,
            Format::Bf16,
            Order::ColMajor,
            s + 10,
        );
        let scales = f32_bytes(&[0.05, 0.125, 0.5]);
        c.p.a_scale = Some(ScaleSpec::new(ScaleGranularity::Tensor, Format::F32));
        c.p.b_scale = Some(ScaleSpec::new(ScaleGranularity::Tensor, Format::F32));
        c.p.d_scale = Some(Scalar::Host(0.5));
        let lt = Lt::new(false);
        lt.set(2, &1i32); // POINTER_MODE_DEVICE
        lt.set(3, &1i32);
        let base = scales.as_ptr();
        lt.set(17, &(base as Cp));
        lt.set(18, &(base.wrapping_add(4) as Cp));
        lt.set(20, &(base.wrapping_add(8) as Cp));
        c.a_scale = Some(scales[0..4].to_vec());
        c.b_scale = Some(scales[4..8].to_vec());
        let st = lt.run(&mut c, (CUDA_R_8F_E4M3, CUDA_R_8F_E5M2, CUDA_R_16BF), 1.0, 0.0);
        c.check(st);

        // Row-wise: OUTER_VEC_32F scales (m for A, n for B), f16 out.
        let mut c = Case::new(
            format!("Lt e4m3 rowwise M={tokens}"),
            24,
            tokens,
            32,
            1,
            Transpose::T,
            Transpose::N,
            Format::E4m3fn,
            Format::E4m3fn,
            Format::F16,
            Order::ColMajor,
            s + 20,
        );
        let a_s = random(Format::F32, 24, s + 21, 0.01, 0.1);
        let b_s = random(Format::F32, tokens as usize, s + 22, 0.01, 0.1);
        c.p.a_scale = Some(ScaleSpec::new(ScaleGranularity::PerOuter, Format::F32));
        c.p.b_scale = Some(ScaleSpec::new(ScaleGranularity::PerOuter, Format::F32));
        let lt = Lt::new(false);
        lt.set(3, &1i32);
        lt.set(17, &(a_s.as_ptr() as Cp));
        lt.set(18, &(b_s.as_ptr() as Cp));
        lt.set(31, &3i32);
        lt.set(32, &3i32);
        c.a_scale = Some(a_s);
        c.b_scale = Some(b_s);
        let st = lt.run(&mut c, (CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16F), 1.0, 0.0);
        c.check(st);

        // Row-major layouts, batch 2, in place (C == D, beta = 1), f32 out.
        let mut c = Case::new(
            format!("Lt row-major batched in place M={tokens}"),
            tokens,
            7,
            23,
            2,
            Transpose::N,
            Transpose::T,
            Format::Bf16,
            Format::Bf16,
            Format::F32,
            Order::RowMajor,
            s + 30,
        );
        c.in_place_c(1.0);
        let lt = Lt::new(false);
        lt.set(4, &1i32);
        let st = lt.run(&mut c, (CUDA_R_16BF, CUDA_R_16BF, CUDA_R_32F), 1.0, 1.0);
        c.check(st);
    }
}

#[test]
fn hipblaslt_matmul_matches_the_oracle() {
    let h = handle("hipblasLtCreate");
    let mut version = 0i32;
    let get_version: unsafe extern "C" fn(P, *mut i32) -> i32 = sym("hipblasLtGetVersion");
    assert_eq!(unsafe { get_version(h, &mut version) }, 0);
    assert_eq!(
        quantshadow_runtime::vendor::hipblaslt::hipblaslt_version(version).map(|v| v.to_string()),
        Some("1.1.0".into())
    );
    for (t, &tokens) in TOKENS.iter().enumerate() {
        let s = 2000 + 100 * t as u64;
        // e4m3fnuz (1000) both sides, OUTER_VEC_32F scales, RELU_BIAS with an f32 bias, bf16 out.
        let mut c = Case::new(
            format!("hipLt fnuz rowwise relu+bias M={tokens}"),
            20,
            tokens,
            40,
            1,
            Transpose::T,
            Transpose::N,
            Format::E4m3fnuz,
            Format::E4m3fnuz,
            Format::Bf16,
            Order::ColMajor,
            s,
        );
        let a_s = random(Format::F32, 20, s + 1, 0.01, 0.1);
        let b_s = random(Format::F32, tokens as usize, s + 2, 0.01, 0.1);
        let bias = random(Format::F32, 20, s + 3, -0.5, 0.5);
        c.p.a_scale = Some(ScaleSpec::new(ScaleGranularity::PerOuter, Format::F32));
        c.p.b_scale = Some(ScaleSpec::new(ScaleGranularity::PerOuter, Format::F32));
        c.p.epilogue = quantshadow_runtime::problem::Epilogue {
            bias: Some(Bias { format: Format::F32, axis: BiasAxis::Rows }),
            activation: Activation::Relu,
        };
        let lt = Lt::new(true);
        lt.set(0, &112i32); // TRANSA = HIPBLAS_OP_T
        lt.set(1, &111i32);
        lt.set(2, &6u32); // RELU_BIAS
        lt.set(3, &(bias.as_ptr() as Cp));
        lt.set(4, &CUDA_R_32F);
        lt.set(5, &(a_s.as_ptr() as Cp));
        lt.set(6, &(b_s.as_ptr() as Cp));
        lt.set(31, &3i32);
        lt.set(32, &3i32);
        c.a_scale = Some(a_s);
        c.b_scale = Some(b_s);
        c.bias = Some(bias);
        let st = lt.run(&mut c, (HIP_R_8F_E4M3_FNUZ, HIP_R_8F_E4M3_FNUZ, CUDA_R_16BF), 1.0, 0.0);
        c.check(st);
    }
    // fnuz is a hipBLASLt type only: cuBLASLt refuses it.
    let mut c = Case::new(
        "cuLt fnuz".into(),
        4,
        4,
        4,
        1,
        Transpose::N,
        Transpose::N,
        Format::E4m3fnuz,
        Format::E4m3fnuz,
        Format::Bf16,
        Order::ColMajor,
        9,
    );
    assert_eq!(
        Lt::new(false).run(&mut c, (HIP_R_8F_E4M3_FNUZ, HIP_R_8F_E4M3_FNUZ, CUDA_R_16BF), 1.0, 0.0),
        15
    );
}

#[test]
fn attribute_sizes_follow_the_vendor_rules() {
    let lt = Lt::new(false);
    let get: GetAttr = sym("cublasLtMatmulDescGetAttribute");
    let set: SetAttr = sym("cublasLtMatmulDescSetAttribute");
    let mut written = 0usize;
    unsafe {
        // Size query: sizeInBytes 0 with sizeWritten.
        assert_eq!(get(lt.desc, 7, null_mut(), 0, &mut written), 0);
        assert_eq!(written, 4);
        assert_eq!(get(lt.desc, 8, null_mut(), 0, &mut written), 0);
        assert_eq!(written, 8);
        assert_eq!(get(lt.desc, 7, null_mut(), 0, null_mut()), 7);
        // Defaults: EPILOGUE_DEFAULT, TRANSA N, compute 68 as created.
        let mut v = 0u32;
        assert_eq!(get(lt.desc, 7, &mut v as *mut u32 as P, 4, &mut written), 0);
        assert_eq!(v, 1);
        let mut i = -1i32;
        assert_eq!(get(lt.desc, 0, &mut i as *mut i32 as P, 4, null_mut()), 0);
        assert_eq!(i, 68);
        // Wrong sizes are CUBLAS_STATUS_INVALID_VALUE, unknown attributes too.
        assert_eq!(set(lt.desc, 3, &1i64 as *const i64 as Cp, 8), 7);
        assert_eq!(get(lt.desc, 3, &mut i as *mut i32 as P, 8, null_mut()), 7);
        assert_eq!(set(lt.desc, 9, &1i32 as *const i32 as Cp, 4), 7);
        // FAST_ACCUM is one byte.
        assert_eq!(set(lt.desc, 25, &1i8 as *const i8 as Cp, 1), 0);
    }
    // Layout attributes read back what was created (cuBLASLt ROWS = 2 is a uint64_t).
    let mut l = null_mut();
    assert_eq!(unsafe { sym::<LayoutCreate>("cublasLtMatrixLayoutCreate")(&mut l, CUDA_R_16BF, 7, 5, 9) }, 0);
    let lget: GetAttr = sym("cublasLtMatrixLayoutGetAttribute");
    let (mut rows, mut ld) = (0u64, 0i64);
    unsafe {
        assert_eq!(lget(l, 2, &mut rows as *mut u64 as P, 8, null_mut()), 0);
        assert_eq!(lget(l, 4, &mut ld as *mut i64 as P, 8, null_mut()), 0);
    }
    assert_eq!((rows, ld), (7, 9));
    // hipBLASLt numbers layout attributes differently: ROWS = 4.
    let mut hl = null_mut();
    assert_eq!(
        unsafe { sym::<LayoutCreate>("hipblasLtMatrixLayoutCreate")(&mut hl, CUDA_R_16BF, 7, 5, 9) },
        0
    );
    let hget: GetAttr = sym("hipblasLtMatrixLayoutGetAttribute");
    unsafe { assert_eq!(hget(hl, 4, &mut rows as *mut u64 as P, 8, null_mut()), 0) };
    assert_eq!(rows, 7);
    let version: unsafe extern "C" fn() -> usize = sym("cublasLtGetVersion");
    assert_eq!(unsafe { version() }, 130100);
}

// ---------------------------------------------------------------------------------------------
// fixture_host
// ---------------------------------------------------------------------------------------------

fn host(scenario: &str, fault: Option<&str>) -> Output {
    let mut cmd = Command::new(HOST);
    cmd.arg(scenario).env_remove("LD_PRELOAD").env_remove("FIXTURE_VENDOR_FAULT");
    if let Some(f) = fault {
        cmd.env("FIXTURE_VENDOR_FAULT", f);
    }
    cmd.output().expect("running fixture_host")
}

fn stdout_ok(scenario: &str, fault: Option<&str>) -> String {
    let out = host(scenario, fault);
    assert!(out.status.success(), "{scenario}: {:?}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// The "call ..." lines of an output, with an optional prefix stripped.
fn calls<'a>(out: &'a str, prefix: &str) -> Vec<&'a str> {
    out.lines().filter_map(|l| l.strip_prefix(prefix)).filter(|l| l.starts_with("call ")).collect()
}

#[test]
fn fixture_host_runs_every_scenario_with_stable_checksums() {
    let model = stdout_ok("model", None);
    assert_eq!(model, stdout_ok("model", None), "deterministic");
    let model_calls = calls(&model, "");
    assert_eq!(model_calls.len(), 16);
    for entry in
        ["cublasGemmEx", "cublasLtMatmul", "cublasSgemm_v2", "cublasGemmStridedBatchedEx", "hipblasLtMatmul"]
    {
        assert!(model_calls.iter().any(|l| l.contains(entry)), "{entry} called");
    }
    assert!(model.lines().last().unwrap().starts_with("checksum "));

    // Threads: each thread's calls give the same results as the single-threaded model.
    let threads = stdout_ok("threads", None);
    assert_eq!(calls(&threads, "t0 "), model_calls);
    assert_eq!(calls(&threads, "t1 "), model_calls);

    // fork + exec: the child runs "model"; fork only: the child runs "linear" in-process.
    let fork = stdout_ok("fork", None);
    assert!(fork.contains(&model), "the exec'd child prints the model run");
    assert!(fork.contains("child exit 0"));
    let linear = stdout_ok("linear", None);
    let forkonly = stdout_ok("forkonly", None);
    assert_eq!(calls(&forkonly, "child "), calls(&linear, ""));
    assert!(forkonly.contains("child exit 0"));

    // Repeats: same weights, new activations per repetition.
    let reps = stdout_ok("linear*3,big", None);
    let lines = calls(&reps, "");
    assert_eq!(lines.len(), 12);
    assert_eq!(lines[..3], calls(&linear, "")[..], "the first repetition is the plain run");
    assert_ne!(lines[0].rsplit(' ').next(), lines[3].rsplit(' ').next());
    assert!(lines[9].contains("big 96x300x64"));

    let bad = host("nonsense", None);
    assert_eq!(bad.status.code(), Some(2));
}

#[test]
fn a_planted_fault_changes_exactly_the_call_it_names() {
    let baseline = stdout_ok("model", None);
    let base = calls(&baseline, "");
    let hash = |l: &str| l.rsplit(' ').next().unwrap().to_string();
    // (fault spec, calls expected to change). Model order: 0-2 linear, 3-5 mlp (chained),
    // 6 bias, 7 epilogue, 8 fp8_tensor, 9 fp8_row, 10 fp8_e5m2, 11 sgemm, 12 bmm,
    // 13 residual, 14 lm_head, 15 hip_fp8.
    let cases: &[(&str, &[usize])] = &[
        ("1:garbage", &[1]),
        ("6:zero", &[6]),
        ("11:nan", &[11]),
        ("12:alpha2x", &[12]),
        ("14:bad_row", &[14]),
        ("13:bad_row", &[13]),
        ("8:fn_as_fnuz", &[8]),
        ("9:scale_ignore", &[9]),
        ("15:garbage", &[15]),
        // The first mlp layer feeds the next two: the fault propagates downstream only.
        ("3:alpha2x", &[3, 4, 5]),
        // No effect on bf16 inputs (fn/fnuz is an FP8 reading) and on per-row scale vectors.
        ("0:fn_as_fnuz", &[]),
        ("9:scale_transpose", &[]),
        ("2:zero,10:zero", &[2, 10]),
    ];
    for (spec, expect) in cases {
        let out = stdout_ok("model", Some(spec));
        let lines = calls(&out, "");
        assert_eq!(lines.len(), base.len());
        let changed: Vec<usize> = (0..base.len()).filter(|&i| hash(lines[i]) != hash(base[i])).collect();
        assert_eq!(&changed, expect, "{spec}");
    }
    let all = stdout_ok("linear", Some("all:zero"));
    let zero_all = calls(&all, "");
    let lin = stdout_ok("linear", None);
    assert!(zero_all.iter().zip(calls(&lin, "")).all(|(a, b)| hash(a) != hash(b)));

    // tile_rows needs M >= 56 tokens: "big" has 300.
    let big = stdout_ok("big", None);
    let tiled = stdout_ok("big", Some("0:tile_rows"));
    assert_ne!(calls(&big, "")[0], calls(&tiled, "")[0]);
    assert_eq!(calls(&big, "")[1..], calls(&tiled, "")[1..]);

    // A malformed spec stops the process with a message instead of running honestly.
    let out = host("linear", Some("x:zero"));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("FIXTURE_VENDOR_FAULT"));
}
