//! Shared pieces of the vendor decoders: site keys, scalars, lazily resolved helper functions,
//! the handle queries of the classic BLAS APIs, and the one column-major -> row-major mapping
//! every classic entry point goes through ([`decode_classic`]).
//!
//! # The transpose identity (classic BLAS and cuBLASLt/hipBLASLt alike)
//!
//! A vendor call computes, in its column-major view, `C (m x n) = op_v(A) (m x k) op_v(B)
//! (k x n)`. The problem model is row-major: `D (M x N) = op(A') (M x K) op(B') (K x N)`. Take
//! `D = C^T`, so `M = n`, `N = m`, `K = k`, and `D = op_v(B)^T op_v(A)^T`: problem A' is vendor
//! B and problem B' is vendor A (the weight of a PyTorch `linear`, vendor A, is problem B).
//!
//! Every stored vendor matrix is re-read as its own transpose: a stored `r x c` matrix of order
//! `O` and leading dimension `ld` is, byte for byte, a stored `c x r` matrix of order
//! `O.flipped()` with the same `ld`. The transposes are kept as the vendor gave them:
//! `trans_a' = trans_b`, `trans_b' = trans_a`.
//!
//! Proof on one index (column-major vendor matrices, vendor TRANSA = T, as in PyTorch's
//! `cublasGemmEx(T, N, out_features, tokens, in_features, W, ldw, x, ldx, ..., y, ldy)`):
//! vendor A is stored `k x m` column-major, so `A_s(r, c)` lives at `c * lda + r`, and
//! `op_v(A) = A_s^T`. Problem B' is stored row-major with the same `lda` and `trans_b' = T`,
//! so its stored dims are `N x K = m x k` and `op(B')(kk, j) = B'_s(j, kk)`, which lives at
//! `j * lda + kk` (row-major). The identity requires `op(B')(kk, j) = op_v(A)^T(kk, j) =
//! op_v(A)(j, kk) = A_s(kk, j)`, which lives at `j * lda + kk` (column-major): the same
//! element. Likewise `D(i, j) = C(j, i)` lives at `i * ldc + j` in both readings (D row-major
//! with `ld = ldc`), and problem A' (vendor B, `trans_b = N`, stored `k x n` column-major) is
//! read row-major as `n x k` with `trans_a' = N`: `op(A')(i, kk)` at `i * ldb + kk` =
//! `B_s(kk, i) = op_v(B)^T(i, kk)`. The tests (`runtime/tests/intercept_decode.rs`) check the
//! mapping numerically: vendor-layout data, a naive column-major GEMM written there, and the
//! host oracle on the decoded problem must agree.

use super::{InterceptedGemm, PointerArrays, RealSlot, Skip};
use crate::formats::Format;
use crate::problem::{
    Bias, BiasAxis, ComputeType, Epilogue, GemmBuffers, GemmProblem, MatrixLayout, Order, ProblemError,
    Scalar, ScaleSpec, Transpose,
};
use crate::vendor::{
    AttrHandling, AttrValue, Entry, EpilogueMapping, LayoutAttr, LibVersion, MatmulDescAttr, PointerMode,
    ScaleMapping,
};
use std::ffi::{c_void, CStr};

// =============================================================================================
// Site keys
// =============================================================================================

/// Builds a `quick_key`: FNV-1a over the entry name, then a SplitMix64 finaliser per value.
/// Deterministic across calls and processes (no random state).
#[derive(Debug, Clone, Copy)]
pub struct KeyHasher(u64);

impl KeyHasher {
    pub fn new(entry: &str) -> KeyHasher {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in entry.bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        KeyHasher(h)
    }

    pub fn mix(self, v: u64) -> KeyHasher {
        let mut z = (self.0 ^ v).wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        KeyHasher(z ^ (z >> 31))
    }

    pub fn finish(self) -> u64 {
        self.0
    }
}

// =============================================================================================
// Scalars
// =============================================================================================

/// The C type of alpha and beta (the compute type of classic calls, the scale type of Lt ones).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScalarKind {
    F16,
    Bf16,
    F32,
    F64,
    I32,
}

impl ScalarKind {
    /// cuBLAS/hipBLAS/rocBLAS rule: alpha and beta have the type of the compute type.
    pub fn for_compute(compute: ComputeType) -> ScalarKind {
        match compute {
            ComputeType::F16 => ScalarKind::F16,
            ComputeType::F32
            | ComputeType::F32FastF16
            | ComputeType::F32FastBf16
            | ComputeType::F32FastTf32 => ScalarKind::F32,
            ComputeType::F64 => ScalarKind::F64,
            ComputeType::I32 => ScalarKind::I32,
        }
    }

    /// A scale type given as a `cudaDataType_t` / `hipDataType` (same numbers for these).
    pub fn from_data_type(value: i32) -> Option<ScalarKind> {
        use crate::vendor::data_type::{CUDA_R_16BF, CUDA_R_16F, CUDA_R_32F, CUDA_R_32I, CUDA_R_64F};
        match value {
            CUDA_R_32F => Some(ScalarKind::F32),
            CUDA_R_16F => Some(ScalarKind::F16),
            CUDA_R_16BF => Some(ScalarKind::Bf16),
            CUDA_R_64F => Some(ScalarKind::F64),
            CUDA_R_32I => Some(ScalarKind::I32),
            _ => None,
        }
    }

    /// The format a device-memory scalar of this kind is read in (`None`: f64 has no format).
    pub fn device_format(self) -> Option<Format> {
        match self {
            ScalarKind::F16 => Some(Format::F16),
            ScalarKind::Bf16 => Some(Format::Bf16),
            ScalarKind::F32 => Some(Format::F32),
            ScalarKind::I32 => Some(Format::I32),
            ScalarKind::F64 => None,
        }
    }

    /// Reads a host scalar of this kind.
    ///
    /// # Safety
    /// `ptr` is the caller's alpha/beta in host pointer mode: the vendor library itself reads
    /// the same bytes for this call.
    pub unsafe fn read_host(self, ptr: *const c_void) -> f64 {
        // SAFETY: see the function contract; read_unaligned makes no alignment assumption.
        unsafe {
            match self {
                ScalarKind::F16 => half::f16::from_bits((ptr as *const u16).read_unaligned()).to_f64(),
                ScalarKind::Bf16 => half::bf16::from_bits((ptr as *const u16).read_unaligned()).to_f64(),
                ScalarKind::F32 => (ptr as *const f32).read_unaligned() as f64,
                ScalarKind::F64 => (ptr as *const f64).read_unaligned(),
                ScalarKind::I32 => (ptr as *const i32).read_unaligned() as f64,
            }
        }
    }
}

/// Alpha or beta as a problem scalar: read now in host mode, a device reference otherwise.
pub(crate) fn scalar_arg(
    vendor: &'static str,
    what: &'static str,
    ptr: *const c_void,
    kind: ScalarKind,
    device: bool,
) -> Result<Scalar, Skip> {
    if ptr.is_null() {
        return Err(Skip::new(format!("{vendor}: {what} is a null pointer")));
    }
    if device {
        let format = kind
            .device_format()
            .ok_or_else(|| Skip::new(format!("{vendor}: f64 {what} in device memory not supported")))?;
        Ok(Scalar::Device { ptr: ptr as u64, format })
    } else {
        // SAFETY: host pointer mode, non-null: the library reads this value for this call.
        Ok(Scalar::Host(unsafe { kind.read_host(ptr) }))
    }
}

/// Whether C is read: not when beta is a host zero.
pub fn reads_c(beta: &Scalar) -> bool {
    !matches!(beta, Scalar::Host(v) if *v == 0.0)
}

/// A stable skip reason for a problem that fails validation (no sizes in the text).
pub fn validation_skip(vendor: &'static str, e: &ProblemError) -> Skip {
    let what = match e {
        ProblemError::UnresolvedScalar { .. } => "unresolved scalar",
        ProblemError::LeadingDimension { .. } => "leading dimension too small",
        ProblemError::EmptyDimension { .. } => "empty dimension",
        ProblemError::NotElementFormat { .. } => "scale-only format as a matrix",
        ProblemError::Scale { .. } => "scale description invalid",
        ProblemError::TooLarge { .. } => "extents overflow",
        ProblemError::PackedAlignment { .. } => "packed 4-bit operand misaligned",
    };
    Skip::new(format!("{vendor}: problem invalid ({what})"))
}

/// A non-negative count or stride from a signed vendor argument.
pub fn non_negative(vendor: &'static str, what: &'static str, v: i64) -> Result<u64, Skip> {
    u64::try_from(v).map_err(|_| Skip::new(format!("{vendor}: negative {what}")))
}

// =============================================================================================
// Lazily resolved helper functions (getters of the vendor libraries)
// =============================================================================================

/// `status f(handle, T* out)` through a resolved getter, T of `out_bytes` (4 or 8) bytes;
/// `None` when the getter is missing or fails. The C shape of cuBLAS's, hipBLAS's and
/// rocBLAS's stream and pointer-mode getters.
pub(crate) fn handle_get(f: &RealSlot, handle: *mut c_void, out_bytes: usize) -> Option<i64> {
    let p = f.get()?;
    let mut v: i64 = 0;
    debug_assert!(out_bytes <= 8);
    // SAFETY: `p` is the vendor getter `status f(handle, T* out)` with T of `out_bytes` bytes
    // (little-endian: the low bytes of `v` receive it); `handle` is the caller's live handle.
    let status = unsafe {
        let f: unsafe extern "C" fn(*mut c_void, *mut c_void) -> i32 = std::mem::transmute(p);
        f(handle, &mut v as *mut i64 as *mut c_void)
    };
    if status != 0 {
        return None;
    }
    Some(match out_bytes {
        4 => v as i32 as i64,
        _ => v,
    })
}

/// A classic BLAS library's handle getters (stream, pointer mode, and on cuBLAS the math
/// mode), resolved on first use: the real [`HandleQueries`] of cuBLAS, hipBLAS and rocBLAS.
pub struct VendorHandle {
    vendor: &'static str,
    stream: RealSlot,
    pointer_mode: RealSlot,
    math_mode: Option<RealSlot>,
}

/// Handles whose workspace each thread remembers; the oldest is forgotten beyond (its calls
/// then say no workspace: a pending snapshot copy may run beside them, as without the hook).
pub const WORKSPACES_PER_THREAD: usize = 16;

/// (vendor, handle, start, end) of the workspaces given on this thread; vendor 0: free slot.
struct WorkspaceTable {
    slots: [(usize, usize, u64, u64); WORKSPACES_PER_THREAD],
    next: usize,
}

thread_local! {
    // Per thread, without a lock: PyTorch gives a handle its workspace on the calling thread
    // right before each BLAS call (`cublasSetStream_v2`, then `cublasSetWorkspace_v2`), so
    // this runs once per GEMM, sampled or not. A call made on another thread than the one that
    // set the workspace says none. `cublasSetStream_v2` also resets the workspace to the
    // library's own; a range remembered past that only keeps a copy from running beside.
    static WORKSPACES: std::cell::RefCell<WorkspaceTable> = const {
        std::cell::RefCell::new(WorkspaceTable { slots: [(0, 0, 0, 0); WORKSPACES_PER_THREAD], next: 0 })
    };
}

impl VendorHandle {
    pub const fn new(
        vendor: &'static str,
        stream: &'static CStr,
        pointer_mode: &'static CStr,
        math_mode: Option<&'static CStr>,
    ) -> VendorHandle {
        VendorHandle {
            vendor,
            stream: RealSlot::new(stream),
            pointer_mode: RealSlot::new(pointer_mode),
            math_mode: match math_mode {
                Some(name) => Some(RealSlot::new(name)),
                None => None,
            },
        }
    }

    /// This vendor's key in the per-thread workspace table.
    fn tag(&self) -> usize {
        self as *const VendorHandle as usize
    }

    /// The host gave `handle` a workspace of `bytes` at `ptr` on this thread (null or empty:
    /// the library's own again, which the shim does not know).
    pub fn set_workspace(&self, handle: *mut c_void, ptr: *mut c_void, bytes: usize) {
        let (tag, h) = (self.tag(), handle as usize);
        let _ = WORKSPACES.try_with(|t| {
            let Ok(mut t) = t.try_borrow_mut() else { return };
            let known = t.slots.iter().position(|&(v, k, _, _)| v == tag && k == h);
            let start = ptr as u64;
            let entry = if ptr.is_null() || bytes == 0 {
                (0, 0, 0, 0)
            } else {
                (tag, h, start, start.saturating_add(bytes as u64))
            };
            match known {
                Some(i) => t.slots[i] = entry,
                None if entry.0 != 0 => {
                    let i = t.next;
                    t.slots[i] = entry;
                    t.next = (i + 1) % WORKSPACES_PER_THREAD;
                }
                None => {}
            }
        });
    }

    /// The body of the vendor's set-workspace hook: forwards, then remembers what succeeded.
    /// Never starts the engine.
    pub fn set_workspace_hook(
        &self,
        handle: *mut c_void,
        ptr: *mut c_void,
        bytes: usize,
        real: &super::RealCall,
    ) -> i32 {
        let status = real.call();
        if status == 0 {
            self.set_workspace(handle, ptr, bytes);
        }
        status
    }

    /// The workspace given to `handle` on this thread, as [start, end), if known.
    pub fn workspace(&self, handle: *mut c_void) -> Option<(u64, u64)> {
        let (tag, h) = (self.tag(), handle as usize);
        WORKSPACES
            .try_with(|t| {
                let t = t.try_borrow().ok()?;
                t.slots.iter().find(|&&(v, k, _, _)| v == tag && k == h).map(|&(_, _, s, e)| (s, e))
            })
            .ok()
            .flatten()
    }

    fn failed(&self, getter: &RealSlot) -> Skip {
        Skip::new(format!("{}: {} failed", self.vendor, getter.name()))
    }
}

impl HandleQueries for VendorHandle {
    fn stream(&self, handle: *mut c_void) -> Result<u64, Skip> {
        handle_get(&self.stream, handle, 8).map(|v| v as u64).ok_or_else(|| self.failed(&self.stream))
    }
    fn pointer_mode(&self, handle: *mut c_void) -> Result<i32, Skip> {
        handle_get(&self.pointer_mode, handle, 4)
            .map(|v| v as i32)
            .ok_or_else(|| self.failed(&self.pointer_mode))
    }
    fn math_mode(&self, handle: *mut c_void) -> Option<i32> {
        handle_get(self.math_mode.as_ref()?, handle, 4).map(|v| v as i32)
    }
}

// =============================================================================================
// Classic BLAS (cuBLAS, hipBLAS, rocBLAS)
// =============================================================================================

/// What the classic decoders ask of a BLAS handle. The real implementation is
/// [`VendorHandle`] over the vendor's getters; tests use fakes.
pub trait HandleQueries {
    /// The raw stream the handle enqueues on.
    fn stream(&self, handle: *mut c_void) -> Result<u64, Skip>;
    /// The raw pointer mode (0 host, 1 device in all three libraries).
    fn pointer_mode(&self, handle: *mut c_void) -> Result<i32, Skip>;
    /// The raw `cublasMath_t` (cuBLAS only; `None` elsewhere).
    fn math_mode(&self, _handle: *mut c_void) -> Option<i32> {
        None
    }
}

/// One stored vendor operand of a classic call (column-major, as BLAS stores it).
#[derive(Debug, Clone, Copy)]
pub struct ClassicOperand {
    /// The matrix (0 for pointer-array calls).
    pub ptr: u64,
    pub format: Format,
    pub ld: i64,
    /// Elements between batch items (0 for non-batched and pointer-array calls).
    pub stride: i64,
}

/// A classic GEMM call with vendor enums already mapped, in the vendor's column-major terms.
#[derive(Debug, Clone, Copy)]
pub struct ClassicCall {
    /// Skip-reason prefix ("cublas", "hipblas", "rocblas").
    pub vendor: &'static str,
    pub trans_a: Transpose,
    pub trans_b: Transpose,
    pub m: i64,
    pub n: i64,
    pub k: i64,
    pub batch: i64,
    pub a: ClassicOperand,
    pub b: ClassicOperand,
    /// C (read when beta may be non-zero). cuBLAS/hipBLAS: the same matrix as D.
    pub c: ClassicOperand,
    pub d: ClassicOperand,
    pub alpha: *const c_void,
    pub beta: *const c_void,
    pub scalar: ScalarKind,
    pub compute: ComputeType,
    /// Array-of-pointers batch: per-item pointers of A, B and C(=D) (device arrays, never read).
    pub pointer_arrays: Option<(u64, u64, u64)>,
    /// C and D are the same matrix (classic cuBLAS/hipBLAS; rocBLAS when `c == d`).
    pub c_is_d: bool,
}

/// The pointer mode of a classic handle as "device?".
pub fn classic_device_mode(vendor: &'static str, raw: i32) -> Result<bool, Skip> {
    match raw {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(Skip::new(format!("{vendor}: unknown pointer mode"))),
    }
}

/// Decodes a classic call through the transpose identity (module doc). Pointer-array batches
/// leave `buffers.a/b/c/d` at 0 and report the (device-resident, never dereferenced) arrays in
/// `pointer_arrays`, A and B swapped like the operands; their batch strides are 0.
pub fn decode_classic(
    entry: &'static str,
    call: &ClassicCall,
    handle: *mut c_void,
    q: &dyn HandleQueries,
) -> Result<InterceptedGemm, Skip> {
    let v = call.vendor;
    if call.m < 0 || call.n < 0 || call.k < 0 || call.batch < 0 {
        return Err(Skip::new(format!("{v}: negative size")));
    }
    if call.m == 0 || call.n == 0 || call.k == 0 || call.batch == 0 {
        return Err(Skip::new(format!("{v}: empty problem")));
    }
    let device = classic_device_mode(v, q.pointer_mode(handle)?)?;
    let stream = q.stream(handle)?;
    let alpha = scalar_arg(v, "alpha", call.alpha, call.scalar, device)?;
    let beta = scalar_arg(v, "beta", call.beta, call.scalar, device)?;
    let arrays = call.pointer_arrays.is_some();
    let layout = |op: &ClassicOperand, what: &'static str| -> Result<MatrixLayout, Skip> {
        Ok(MatrixLayout {
            format: op.format,
            // Column-major vendor storage re-read as the row-major transpose (module doc).
            order: Order::RowMajor,
            ld: non_negative(v, "leading dimension", op.ld)?,
            batch_stride: if arrays || call.batch == 1 { 0 } else { non_negative(v, what, op.stride)? },
        })
    };
    let c = reads_c(&beta).then(|| layout(&call.c, "batch stride")).transpose()?;
    if c.is_some() && !arrays && call.c.ptr == 0 {
        return Err(Skip::new(format!("{v}: C is a null pointer")));
    }
    if arrays && c.is_some() && !call.c_is_d {
        return Err(Skip::new(format!("{v}: pointer-array batch with C != D not supported")));
    }
    let problem = GemmProblem {
        m: call.n as u64,
        n: call.m as u64,
        k: call.k as u64,
        batch: call.batch as u64,
        trans_a: call.trans_b,
        trans_b: call.trans_a,
        a: layout(&call.b, "batch stride")?,
        b: layout(&call.a, "batch stride")?,
        c,
        d: layout(&call.d, "batch stride")?,
        a_scale: None,
        b_scale: None,
        a_tensor_scale: None,
        b_tensor_scale: None,
        d_scale: None,
        amax_d: false,
        alpha,
        beta,
        epilogue: Epilogue::NONE,
        compute: call.compute,
        fast_accum: false,
    };
    problem.validate().map_err(|e| validation_skip(v, &e))?;
    let (buffers, pointer_arrays) = match call.pointer_arrays {
        Some((a, b, c)) => (GemmBuffers::default(), Some(PointerArrays { a: b, b: a, d: c })),
        None => (
            GemmBuffers {
                a: call.b.ptr,
                b: call.a.ptr,
                c: if problem.c.is_some() { call.c.ptr } else { 0 },
                d: call.d.ptr,
                ..GemmBuffers::default()
            },
            None,
        ),
    };
    Ok(InterceptedGemm { entry, problem, buffers, stream, pointer_arrays })
}

/// One operand of a classic call as passed (vendor type code not yet mapped).
#[derive(Debug, Clone, Copy, Default)]
pub struct RawOperand {
    pub ptr: u64,
    pub ty: i32,
    pub ld: i64,
    pub stride: i64,
}

/// Which family of classic entry point a call came through (decides how the type and compute
/// codes read).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// `cublasGemmEx` family: `cudaDataType_t` types, `cublasComputeType_t` compute.
    CublasEx,
    /// `cublasSgemm*`: f32 everything, compute by the handle's math mode.
    CublasSgemm,
    /// `cublasHgemm*`: f16 everything, f16 compute.
    CublasHgemm,
    /// `hipblasGemmEx` family; `v2`: one of the `_v2` symbols.
    HipblasEx { v2: bool },
    /// `rocblas_gemm_ex` family: `rocblas_datatype` types and compute.
    RocblasEx,
    /// `rocblas_gemm_ex3`: `rocblas_datatype` types, `rocblas_computetype` compute.
    RocblasEx3,
}

/// A classic call's arguments, uniform across entry points, before any vendor code is mapped.
#[derive(Debug, Clone, Copy)]
pub struct RawClassic {
    pub variant: Variant,
    pub handle: *mut c_void,
    pub trans_a: i32,
    pub trans_b: i32,
    pub m: i64,
    pub n: i64,
    pub k: i64,
    pub batch: i64,
    pub a: RawOperand,
    pub b: RawOperand,
    pub c: RawOperand,
    pub d: RawOperand,
    pub alpha: *const c_void,
    pub beta: *const c_void,
    pub compute: i32,
    /// rocBLAS flags (0 elsewhere).
    pub flags: u32,
    /// Array-of-pointers batch: `a.ptr`, `b.ptr`, `c.ptr` are the device pointer arrays.
    pub arrays: bool,
}

impl RawClassic {
    /// `quick_key` of a classic call: entry, the weight operand (vendor A), shape, types and
    /// transposes. No handle query, nothing dereferenced.
    pub fn key(&self, entry: &str) -> u64 {
        let pair = |x: i32, y: i32| ((x as u32 as u64) << 32) | y as u32 as u64;
        KeyHasher::new(entry)
            .mix(self.a.ptr)
            .mix(self.m as u64)
            // Not n: the vendor's n is the token count (problem M), which is not part of a
            // site's identity (prefill and decode calls of one layer are one site).
            .mix(self.k as u64)
            .mix(self.batch as u64)
            .mix(pair(self.trans_a, self.trans_b))
            .mix(pair(self.a.ty, self.b.ty))
            .mix(pair(self.d.ty, self.compute))
            .finish()
    }

    /// The call with formats, transposes, compute and scalar type resolved by the vendor's
    /// `resolve`; everything else carried over.
    pub fn with(
        &self,
        vendor: &'static str,
        trans: (Transpose, Transpose),
        formats: [Format; 4],
        compute: ComputeType,
        scalar: ScalarKind,
    ) -> ClassicCall {
        let op = |r: &RawOperand, format: Format| ClassicOperand {
            ptr: if self.arrays { 0 } else { r.ptr },
            format,
            ld: r.ld,
            stride: r.stride,
        };
        ClassicCall {
            vendor,
            trans_a: trans.0,
            trans_b: trans.1,
            m: self.m,
            n: self.n,
            k: self.k,
            batch: self.batch,
            a: op(&self.a, formats[0]),
            b: op(&self.b, formats[1]),
            c: op(&self.c, formats[2]),
            d: op(&self.d, formats[3]),
            alpha: self.alpha,
            beta: self.beta,
            scalar,
            compute,
            pointer_arrays: self.arrays.then_some((self.a.ptr, self.b.ptr, self.c.ptr)),
            c_is_d: self.c.ptr == self.d.ptr && self.c.ld == self.d.ld && self.c.stride == self.d.stride,
        }
    }
}

/// Declares, for classic hooks, the handler, `decode_with` (tests pass fake handle queries)
/// and the `GemmArgs` impl over the real queries. `$raw` builds a [`RawClassic`] from `$s`.
macro_rules! classic_entry {
    ($sym:ident, $handler:ident, $resolve:path, $real:expr, |$s:ident| $raw:expr) => {
        pub fn $handler(args: &super::hook::$sym::Args, real: &super::RealCall) -> i32 {
            crate::engine::on_gemm(args, real)
        }

        impl super::hook::$sym::Args {
            /// The call's arguments in the uniform classic form.
            pub fn raw(&self) -> super::common::RawClassic {
                let $s = self;
                $raw
            }

            /// [`super::GemmArgs::decode`] with the handle queries given.
            pub fn decode_with(
                &self,
                q: &dyn super::common::HandleQueries,
            ) -> Result<super::InterceptedGemm, super::Skip> {
                let raw = self.raw();
                let call = $resolve(&raw, q)?;
                super::common::decode_classic(super::hook::$sym::NAME, &call, raw.handle, q)
            }
        }

        impl super::GemmArgs for super::hook::$sym::Args {
            const ENTRY: &'static str = super::hook::$sym::NAME;
            fn quick_key(&self) -> u64 {
                self.raw().key(Self::ENTRY)
            }
            fn decode(&self) -> Result<super::InterceptedGemm, super::Skip> {
                self.decode_with(&$real)
            }
            fn stream(&self) -> Option<u64> {
                super::common::HandleQueries::stream(&$real, self.raw().handle).ok()
            }
            fn scratch(&self) -> Option<(u64, u64)> {
                $real.workspace(self.raw().handle)
            }
        }
    };
}
pub(crate) use classic_entry;

// =============================================================================================
// cuBLASLt / hipBLASLt
// =============================================================================================

/// What the Lt decoders ask of the library: its version and descriptor attributes. The real
/// implementations call `cublasLtGetVersion` / `hipblasLtGetVersion` and the
/// `*MatmulDescGetAttribute` / `*MatrixLayoutGetAttribute` getters; tests use fakes.
pub trait LtQueries {
    fn version(&self, handle: *mut c_void) -> Result<LibVersion, Skip>;
    /// Fills `buf` (exactly the attribute's size) with matmul-descriptor attribute `id`.
    fn desc_attr(&self, desc: *mut c_void, id: i32, buf: &mut [u8]) -> Result<(), Skip>;
    /// Fills `buf` with matrix-layout attribute `id`.
    fn layout_attr(&self, layout: *mut c_void, id: i32, buf: &mut [u8]) -> Result<(), Skip>;
}

/// `status get(obj, attr, void* buf, size_t size, size_t* written)` through a resolved getter
/// (the shape of all four Lt attribute getters).
pub(crate) fn lt_get_attr(f: &RealSlot, obj: *mut c_void, id: i32, buf: &mut [u8]) -> Result<(), ()> {
    let p = f.get().ok_or(())?;
    let mut written: usize = 0;
    // SAFETY: `p` is the vendor getter of that signature; `buf` is writable for its length and
    // the getter writes at most `size` bytes; `obj` is the caller's live descriptor.
    let status = unsafe {
        let f: unsafe extern "C" fn(*mut c_void, i32, *mut c_void, usize, *mut usize) -> i32 =
            std::mem::transmute(p);
        f(obj, id, buf.as_mut_ptr() as *mut c_void, buf.len(), &mut written)
    };
    if status != 0 || written > buf.len() {
        return Err(());
    }
    Ok(())
}

/// The vendor-specific half of an Lt decoder: numbering, enums and names of one library.
pub struct LtDialect {
    /// Skip-reason prefix ("cublasLt", "hipblasLt").
    pub name: &'static str,
    pub desc_table: &'static [Entry<MatmulDescAttr>],
    pub desc_id: fn(LibVersion, MatmulDescAttr) -> Option<i32>,
    pub desc_value: fn(MatmulDescAttr) -> Option<AttrValue>,
    /// The value a must-be-default attribute must have; `None`: not checked (default unknown).
    pub default_of: fn(MatmulDescAttr) -> Option<i64>,
    pub layout_table: &'static [Entry<LayoutAttr>],
    pub layout_id: fn(LibVersion, LayoutAttr) -> Option<i32>,
    pub layout_value: fn(LayoutAttr) -> Option<AttrValue>,
    pub transpose: fn(i32) -> Option<Transpose>,
    pub format: fn(i32) -> Option<Format>,
    pub format_name: fn(i32) -> &'static str,
    pub compute: fn(i32) -> Option<ComputeType>,
    pub compute_name: fn(i32) -> &'static str,
    pub order: fn(LibVersion, i32) -> Option<Order>,
    pub epilogue: fn(LibVersion, u32) -> Option<EpilogueMapping>,
    pub epilogue_name: fn(LibVersion, u32) -> &'static str,
    pub pointer_mode: fn(LibVersion, i32) -> Option<PointerMode>,
    /// Scale mode -> spec for an operand with `outer` x `k` logical extent.
    pub scale_spec: fn(LibVersion, i32, u64, u64) -> Option<ScaleSpec>,
    pub scale_mode_name: fn(LibVersion, i32) -> &'static str,
    /// What the hipBLASLt 0.10/0.12 `*_SCALE_POINTER_VEC_EXT` vectors mean.
    pub vec_scale: Option<ScaleMapping>,
    /// Values BIAS_DATA_TYPE reads as when never set.
    pub bias_type_unset: &'static [i32],
    /// The `*BatchMode_t` value of pointer-array batches.
    pub batch_mode_pointer_array: i64,
}

/// The arguments of `cublasLtMatmul` / `hipblasLtMatmul` (same C shape).
#[derive(Debug, Clone, Copy)]
pub struct LtCall {
    pub handle: *mut c_void,
    pub desc: *mut c_void,
    pub alpha: *const c_void,
    pub a: *const c_void,
    pub a_desc: *mut c_void,
    pub b: *const c_void,
    pub b_desc: *mut c_void,
    pub beta: *const c_void,
    pub c: *const c_void,
    pub c_desc: *mut c_void,
    pub d: *mut c_void,
    pub d_desc: *mut c_void,
    pub stream: *mut c_void,
}

/// `From<&Args>` for the hook's arguments (`cublasLtMatmul`, `hipblasLtMatmul`): one C shape.
macro_rules! lt_call_from {
    ($($args:ty),*) => {$(
        impl From<&$args> for LtCall {
            fn from(a: &$args) -> LtCall {
                LtCall {
                    handle: a.handle,
                    desc: a.desc,
                    alpha: a.alpha,
                    a: a.a,
                    a_desc: a.a_desc,
                    b: a.b,
                    b_desc: a.b_desc,
                    beta: a.beta,
                    c: a.c,
                    c_desc: a.c_desc,
                    d: a.d,
                    d_desc: a.d_desc,
                    stream: a.stream,
                }
            }
        }
    )*};
}
lt_call_from!(super::hook::cublasLtMatmul::Args, super::hook::hipblasLtMatmul::Args);

struct LtReader<'a> {
    d: &'a LtDialect,
    q: &'a dyn LtQueries,
    v: LibVersion,
}

fn value_of(ty: AttrValue, buf: &[u8]) -> i64 {
    let mut b8 = [0u8; 8];
    b8[..buf.len()].copy_from_slice(buf);
    match ty {
        AttrValue::I8 => buf[0] as i8 as i64,
        AttrValue::I32 => i32::from_le_bytes([b8[0], b8[1], b8[2], b8[3]]) as i64,
        AttrValue::U32 | AttrValue::F32 => u32::from_le_bytes([b8[0], b8[1], b8[2], b8[3]]) as i64,
        _ => i64::from_le_bytes(b8),
    }
}

impl LtReader<'_> {
    /// A matmul-descriptor attribute, `None` when this library version does not have it.
    fn desc(&self, desc: *mut c_void, attr: MatmulDescAttr) -> Result<Option<i64>, Skip> {
        let (Some(id), Some(ty)) = ((self.d.desc_id)(self.v, attr), (self.d.desc_value)(attr)) else {
            return Ok(None);
        };
        self.desc_by_id(desc, id, ty).map(Some)
    }

    fn desc_by_id(&self, desc: *mut c_void, id: i32, ty: AttrValue) -> Result<i64, Skip> {
        let mut buf = [0u8; 8];
        let buf = &mut buf[..ty.bytes().min(8)];
        self.q.desc_attr(desc, id, buf).map_err(|e| {
            let attr =
                crate::vendor::lookup(self.d.desc_table, self.v, id as i64).map_or("?", |e| e.abi.name);
            Skip::new(format!("{} for {attr}", e.0))
        })?;
        Ok(value_of(ty, buf))
    }

    /// An attribute every supported version has.
    fn desc_req(&self, desc: *mut c_void, attr: MatmulDescAttr) -> Result<i64, Skip> {
        self.desc(desc, attr)?
            .ok_or_else(|| Skip::new(format!("{}: descriptor attribute missing", self.d.name)))
    }

    fn layout(&self, layout: *mut c_void, attr: LayoutAttr) -> Result<Option<i64>, Skip> {
        let (Some(id), Some(ty)) = ((self.d.layout_id)(self.v, attr), (self.d.layout_value)(attr)) else {
            return Ok(None);
        };
        let mut buf = [0u8; 8];
        let buf = &mut buf[..ty.bytes().min(8)];
        self.q.layout_attr(layout, id, buf).map_err(|e| {
            let attr =
                crate::vendor::lookup(self.d.layout_table, self.v, id as i64).map_or("?", |e| e.abi.name);
            Skip::new(format!("{} for {attr}", e.0))
        })?;
        Ok(Some(value_of(ty, buf)))
    }

    fn layout_req(&self, layout: *mut c_void, attr: LayoutAttr) -> Result<i64, Skip> {
        self.layout(layout, attr)?
            .ok_or_else(|| Skip::new(format!("{}: layout attribute missing", self.d.name)))
    }
}

/// One decoded Lt matrix layout (vendor terms).
#[derive(Debug, Clone, Copy)]
struct LtLayout {
    /// `Err(type)`: a type quantshadow cannot decode (fatal only for a matrix that is read).
    format: Result<Format, i32>,
    order: Order,
    rows: u64,
    cols: u64,
    ld: u64,
    batch: u64,
    stride: u64,
    pointer_array: bool,
}

fn read_layout(r: &LtReader, layout: *mut c_void) -> Result<LtLayout, Skip> {
    let name = r.d.name;
    if layout.is_null() {
        return Err(Skip::new(format!("{name}: null matrix layout")));
    }
    let ty = r.layout_req(layout, LayoutAttr::Type)? as i32;
    let format = (r.d.format)(ty).ok_or(ty);
    let order_raw = r.layout(layout, LayoutAttr::Order)?.unwrap_or(0) as i32;
    let order = (r.d.order)(r.v, order_raw)
        .ok_or_else(|| Skip::new(format!("{name}: tiled or unknown matrix order not supported")))?;
    let rows = non_negative(name, "rows", r.layout_req(layout, LayoutAttr::Rows)?)?;
    let cols = non_negative(name, "cols", r.layout_req(layout, LayoutAttr::Cols)?)?;
    let ld = non_negative(name, "leading dimension", r.layout_req(layout, LayoutAttr::Ld)?)?;
    let batch = r.layout(layout, LayoutAttr::BatchCount)?.unwrap_or(1);
    if batch < 1 {
        return Err(Skip::new(format!("{name}: batch count below 1")));
    }
    let stride =
        non_negative(name, "batch stride", r.layout(layout, LayoutAttr::StridedBatchOffset)?.unwrap_or(0))?;
    let pointer_array = match r.layout(layout, LayoutAttr::BatchMode)?.unwrap_or(0) {
        0 => false,
        m if m == r.d.batch_mode_pointer_array => true,
        _ => return Err(Skip::new(format!("{name}: unknown batch mode"))),
    };
    if r.layout(layout, LayoutAttr::Offset)?.unwrap_or(0) != 0 {
        return Err(Skip::new(format!("{name}: layout offset not supported")));
    }
    Ok(LtLayout { format, order, rows, cols, ld, batch: batch as u64, stride, pointer_array })
}

/// One vendor operand's scales: what goes into the problem for it.
enum OperandScale {
    None,
    Tensor(Scalar),
    Spec(ScaleSpec, u64),
}

#[allow(clippy::too_many_arguments)]
fn read_scale(
    r: &LtReader,
    desc: *mut c_void,
    pointer: MatmulDescAttr,
    vec_pointer: MatmulDescAttr,
    mode: MatmulDescAttr,
    what: &'static str,
    outer: u64,
    k: u64,
) -> Result<OperandScale, Skip> {
    let name = r.d.name;
    let ptr = r.desc(desc, pointer)?.unwrap_or(0) as u64;
    let vec_ptr = r.desc(desc, vec_pointer)?.unwrap_or(0) as u64;
    let mode = r.desc(desc, mode)?;
    if vec_ptr != 0 {
        if ptr != 0 {
            return Err(Skip::new(format!("{name}: {what} scale set both as scalar and as vector")));
        }
        let (g, f, s) =
            r.d.vec_scale
                .ok_or_else(|| Skip::new(format!("{name}: internal: vector scale without mapping")))?;
        return Ok(OperandScale::Spec(ScaleSpec::new(g, f).with_storage(s), vec_ptr));
    }
    match (ptr, mode) {
        (0, None | Some(0)) => Ok(OperandScale::None),
        (0, Some(_)) => Err(Skip::new(format!("{name}: {what} scale mode set without a scale pointer"))),
        // SCALAR_32F is 0 in both libraries (and the only meaning before scale modes existed).
        (p, None | Some(0)) => Ok(OperandScale::Tensor(Scalar::Device { ptr: p, format: Format::F32 })),
        (p, Some(m)) => {
            let m = m as i32;
            let spec = (r.d.scale_spec)(r.v, m, outer, k).ok_or_else(|| {
                Skip::new(format!(
                    "{name}: {what} scale mode {} not supported",
                    (r.d.scale_mode_name)(r.v, m)
                ))
            })?;
            Ok(OperandScale::Spec(spec, p))
        }
    }
}

/// Decodes an Lt matmul (cuBLASLt or hipBLASLt by `d`) through the transpose identity of the
/// module doc: the layouts' orders are flipped, vendor A becomes problem B (its scales the
/// problem's B scales, its outer extent the problem's N), vendor B problem A. `fixed_types`
/// gives (compute type, scale type) where the descriptor has no such attributes (hipBLASLt).
pub fn decode_lt(
    entry: &'static str,
    d: &LtDialect,
    call: &LtCall,
    q: &dyn LtQueries,
    fixed_types: Option<(i32, i32)>,
) -> Result<InterceptedGemm, Skip> {
    let name = d.name;
    if call.desc.is_null() {
        return Err(Skip::new(format!("{name}: null matmul descriptor")));
    }
    let v = q.version(call.handle)?;
    let r = LtReader { d, q, v };
    let desc = call.desc;

    let (compute_raw, scale_raw) = match fixed_types {
        Some(t) => t,
        None => (
            r.desc_req(desc, MatmulDescAttr::ComputeType)? as i32,
            r.desc_req(desc, MatmulDescAttr::ScaleType)? as i32,
        ),
    };
    let compute = (d.compute)(compute_raw).ok_or_else(|| {
        Skip::new(format!("{name}: compute type {} not supported", (d.compute_name)(compute_raw)))
    })?;
    let scalar = ScalarKind::from_data_type(scale_raw).ok_or_else(|| {
        Skip::new(format!("{name}: scale type {} not supported", (d.format_name)(scale_raw)))
    })?;
    let pm_raw = r.desc(desc, MatmulDescAttr::PointerMode)?.unwrap_or(0) as i32;
    let device = match (d.pointer_mode)(v, pm_raw) {
        Some(PointerMode::Host) => false,
        Some(PointerMode::Device) => true,
        Some(other) => return Err(Skip::new(format!("{name}: pointer mode {other:?} not supported"))),
        None => return Err(Skip::new(format!("{name}: unknown pointer mode"))),
    };
    let trans = |attr| -> Result<Transpose, Skip> {
        let t = r.desc_req(desc, attr)? as i32;
        (d.transpose)(t).ok_or_else(|| Skip::new(format!("{name}: unsupported operation (transpose) value")))
    };
    let (ta, tb) = (trans(MatmulDescAttr::TransA)?, trans(MatmulDescAttr::TransB)?);

    // Attributes that change D in ways the problem cannot describe must hold their defaults.
    for e in d.desc_table.iter().filter(|e| e.abi.range.contains(v)) {
        if e.meaning.handling() != AttrHandling::MustBeDefault {
            continue;
        }
        let (Some(default), Some(ty)) = ((d.default_of)(e.meaning), (d.desc_value)(e.meaning)) else {
            continue;
        };
        if r.desc_by_id(desc, e.abi.value as i32, ty)? != default {
            return Err(Skip::new(format!("{name}: {} not supported", e.abi.name)));
        }
    }

    let la = read_layout(&r, call.a_desc)?;
    let lb = read_layout(&r, call.b_desc)?;
    let lc = read_layout(&r, call.c_desc)?;
    let ld = read_layout(&r, call.d_desc)?;
    let (m, n) = (ld.rows, ld.cols);
    let (a_m, k) = match ta {
        Transpose::N => (la.rows, la.cols),
        Transpose::T => (la.cols, la.rows),
    };
    let (b_k, b_n) = match tb {
        Transpose::N => (lb.rows, lb.cols),
        Transpose::T => (lb.cols, lb.rows),
    };
    if a_m != m || b_k != k || b_n != n || lc.rows != m || lc.cols != n {
        return Err(Skip::new(format!("{name}: matrix layouts inconsistent")));
    }
    let batch = ld.batch;
    if [la.batch, lb.batch, lc.batch].iter().any(|b| *b != batch) {
        return Err(Skip::new(format!("{name}: batch counts differ")));
    }
    let arrays = ld.pointer_array;
    if [la.pointer_array, lb.pointer_array, lc.pointer_array].iter().any(|p| *p != arrays) {
        return Err(Skip::new(format!("{name}: mixed batch modes")));
    }
    let layout = |l: &LtLayout| -> Result<MatrixLayout, Skip> {
        Ok(MatrixLayout {
            format: l.format.map_err(|ty| {
                Skip::new(format!("{name}: data type {} not supported", (d.format_name)(ty)))
            })?,
            // A stored r x c matrix of order O is a stored c x r matrix of order O.flipped().
            order: l.order.flipped(),
            ld: l.ld,
            batch_stride: if batch == 1 || arrays { 0 } else { l.stride },
        })
    };
    // C's type only matters when C is read (PyTorch's `_scaled_mm` gives C the bias type).
    let (a_layout, b_layout, d_layout) = (layout(&lb)?, layout(&la)?, layout(&ld)?);

    // Scales. Vendor A -> problem B (outer extent m = problem N), vendor B -> problem A.
    let sa = read_scale(
        &r,
        desc,
        MatmulDescAttr::AScalePointer,
        MatmulDescAttr::AScalePointerVec,
        MatmulDescAttr::AScaleMode,
        "A",
        m,
        k,
    )?;
    let sb = read_scale(
        &r,
        desc,
        MatmulDescAttr::BScalePointer,
        MatmulDescAttr::BScalePointerVec,
        MatmulDescAttr::BScaleMode,
        "B",
        n,
        k,
    )?;
    if batch > 1 && (matches!(sa, OperandScale::Spec(..)) || matches!(sb, OperandScale::Spec(..))) {
        return Err(Skip::new(format!("{name}: block or vector scales with batches not modeled")));
    }
    let d_scale_ptr = r.desc(desc, MatmulDescAttr::DScalePointer)?.unwrap_or(0) as u64;
    let amax_ptr = r.desc(desc, MatmulDescAttr::AmaxDPointer)?.unwrap_or(0) as u64;
    let fast_accum = r.desc(desc, MatmulDescAttr::FastAccum)?.unwrap_or(0) != 0;

    // Epilogue. The bias runs along vendor rows (m, the output features) = problem columns.
    let epi_raw = r.desc(desc, MatmulDescAttr::Epilogue)?.unwrap_or(1) as u32;
    let epi = (d.epilogue)(v, epi_raw).ok_or_else(|| {
        Skip::new(format!("{name}: epilogue {} not supported", (d.epilogue_name)(v, epi_raw)))
    })?;
    let mut bias_ptr = 0;
    let bias = if epi.bias {
        bias_ptr = r.desc(desc, MatmulDescAttr::BiasPointer)?.unwrap_or(0) as u64;
        if bias_ptr == 0 {
            return Err(Skip::new(format!("{name}: bias epilogue without a bias pointer")));
        }
        let ty = r.desc(desc, MatmulDescAttr::BiasDataType)?.map_or(d.bias_type_unset[0], |t| t as i32);
        let format = if d.bias_type_unset.contains(&ty) {
            // Default: the type of D, except for 8/4-bit inputs where the libraries pick
            // other types by table; those are not modeled.
            if a_layout.format.bits() <= 8 || b_layout.format.bits() <= 8 {
                return Err(Skip::new(format!("{name}: default bias type with 8/4-bit inputs not modeled")));
            }
            d_layout.format
        } else {
            (d.format)(ty).ok_or_else(|| {
                Skip::new(format!("{name}: bias type {} not supported", (d.format_name)(ty)))
            })?
        };
        Some(Bias { format, axis: BiasAxis::Cols })
    } else {
        None
    };

    let alpha = scalar_arg(name, "alpha", call.alpha, scalar, device)?;
    let beta = scalar_arg(name, "beta", call.beta, scalar, device)?;
    let c = reads_c(&beta).then(|| layout(&lc)).transpose()?;
    if c.is_some() && call.c.is_null() {
        return Err(Skip::new(format!("{name}: C is a null pointer")));
    }
    if arrays && c.is_some() && call.c as u64 != call.d as u64 {
        return Err(Skip::new(format!("{name}: pointer-array batch with C != D not supported")));
    }

    let mut buffers = GemmBuffers {
        a: call.b as u64,
        b: call.a as u64,
        c: if c.is_some() { call.c as u64 } else { 0 },
        d: call.d as u64,
        bias: bias_ptr,
        amax_d: amax_ptr,
        ..GemmBuffers::default()
    };
    let mut problem = GemmProblem {
        m: n,
        n: m,
        k,
        batch,
        trans_a: tb,
        trans_b: ta,
        a: a_layout,
        b: b_layout,
        c,
        d: d_layout,
        a_scale: None,
        b_scale: None,
        a_tensor_scale: None,
        b_tensor_scale: None,
        d_scale: (d_scale_ptr != 0).then_some(Scalar::Device { ptr: d_scale_ptr, format: Format::F32 }),
        amax_d: amax_ptr != 0,
        alpha,
        beta,
        epilogue: Epilogue { bias, activation: epi.activation },
        compute,
        fast_accum,
    };
    match sb {
        OperandScale::None => {}
        OperandScale::Tensor(s) => problem.a_tensor_scale = Some(s),
        OperandScale::Spec(spec, p) => {
            problem.a_scale = Some(spec);
            buffers.a_scale = p;
        }
    }
    match sa {
        OperandScale::None => {}
        OperandScale::Tensor(s) => problem.b_tensor_scale = Some(s),
        OperandScale::Spec(spec, p) => {
            problem.b_scale = Some(spec);
            buffers.b_scale = p;
        }
    }
    problem.validate().map_err(|e| validation_skip(name, &e))?;
    let pointer_arrays =
        arrays.then_some(PointerArrays { a: call.b as u64, b: call.a as u64, d: call.d as u64 });
    if arrays {
        buffers.a = 0;
        buffers.b = 0;
        buffers.c = 0;
        buffers.d = 0;
    }
    Ok(InterceptedGemm { entry, problem, buffers, stream: call.stream as u64, pointer_arrays })
}

/// `quick_key` of an Lt call: entry, the A pointer (the weight in PyTorch's calls) and A's
/// layout rows and cols (two attribute reads; 0 when they cannot be read).
pub fn lt_key(entry: &str, d: &LtDialect, call: &LtCall, q: &dyn LtQueries) -> u64 {
    let dims = q.version(call.handle).ok().and_then(|v| {
        let r = LtReader { d, q, v };
        if call.a_desc.is_null() {
            return None;
        }
        let rows = r.layout(call.a_desc, LayoutAttr::Rows).ok()??;
        let cols = r.layout(call.a_desc, LayoutAttr::Cols).ok()??;
        Some((rows as u64, cols as u64))
    });
    let (rows, cols) = dims.unwrap_or((0, 0));
    KeyHasher::new(entry).mix(call.a as u64).mix(rows).mix(cols).finish()
}
