//! Safe wrapper over the C fixture BLAS (`tests/fixtures/fixture_blas_core.h`): the stand-in
//! "production" GEMM that CPU-only runs (demo, CI) check against the host oracle, with planted
//! faults that reproduce the bug classes of DESIGN.md.
//!
//! The C library cannot see buffer lengths, so every call goes through here: the problem is
//! validated, mapped field by field onto the C descriptor (what the C side cannot do is an
//! error, never undefined behaviour), and each buffer is checked against both the Rust problem
//! model's size and the C library's own `fixture_gemm_required_bytes` before C touches it.
//!
//! Semantics follow `GemmProblem` with one deliberate difference: like a GPU library, the
//! fixture sums products in FP32 (exactly, in 64-bit integers, for int x int operands with at
//! most per-tensor scales), so it is not bit-identical to an f64 oracle. `compute`,
//! `fast_accum` and `amax_d` are recorded by the problem and ignored here. As in the oracle, a
//! non-zero beta needs `problem.c`, and with beta == 0 C is not read.

use quantshadow_runtime::formats::Format;
use quantshadow_runtime::problem::{
    Activation, BiasAxis, GemmProblem, HostInputs, MatrixLayout, Order, ProblemError, ScaleGranularity,
    ScaleSpec, ScaleStorage, Transpose,
};
use std::ffi::CStr;
use std::fmt;
use std::path::Path;
use std::str::FromStr;

/// The raw C interface: `#[repr(C)]` mirrors of the header, checked by size below and by
/// `_Static_assert`s on the C side.
mod sys {
    #[repr(C)]
    #[derive(Debug, Clone, Copy, Default)]
    pub struct Matrix {
        pub format: i32,
        pub order: i32,
        pub ld: i64,
        pub batch_stride: i64,
    }

    #[repr(C)]
    #[derive(Debug, Clone, Copy, Default)]
    pub struct Scale {
        pub ld: i64,
        pub batch_stride: i64,
        pub kind: i32,
        pub format: i32,
        pub storage: i32,
        pub block_outer: i32,
        pub block_inner: i32,
        pub reserved: i32,
    }

    #[repr(C)]
    #[derive(Debug, Clone, Copy, Default)]
    pub struct GemmDesc {
        pub m: i64,
        pub n: i64,
        pub k: i64,
        pub batch: i64,
        pub a: Matrix,
        pub b: Matrix,
        pub c: Matrix,
        pub d: Matrix,
        pub a_scale: Scale,
        pub b_scale: Scale,
        pub trans_a: i32,
        pub trans_b: i32,
        pub use_c: i32,
        pub bias_axis: i32,
        pub bias_format: i32,
        pub activation: i32,
    }

    #[repr(C)]
    #[derive(Debug, Clone, Copy)]
    pub struct GemmArgs {
        pub a: *const u8,
        pub b: *const u8,
        pub c: *const u8,
        pub d: *mut u8,
        pub a_scale: *const u8,
        pub b_scale: *const u8,
        pub bias: *const u8,
        pub alpha: f32,
        pub beta: f32,
        pub a_tensor_scale: f32,
        pub b_tensor_scale: f32,
        pub d_scale: f32,
        pub fault: i32,
        pub seed: u64,
    }

    const _: () = assert!(std::mem::size_of::<Matrix>() == 24);
    const _: () = assert!(std::mem::size_of::<Scale>() == 40);
    const _: () = assert!(std::mem::size_of::<GemmDesc>() == 232);
    #[cfg(target_pointer_width = "64")]
    const _: () = assert!(std::mem::size_of::<GemmArgs>() == 88);

    pub const ABI_VERSION: u32 = 1;

    pub const FORMAT_F32: i32 = 0;
    pub const FORMAT_F16: i32 = 1;
    pub const FORMAT_BF16: i32 = 2;
    pub const FORMAT_E4M3FN: i32 = 3;
    pub const FORMAT_E4M3FNUZ: i32 = 4;
    pub const FORMAT_E5M2: i32 = 5;
    pub const FORMAT_E5M2FNUZ: i32 = 6;
    pub const FORMAT_E2M1: i32 = 7;
    pub const FORMAT_INT8: i32 = 8;
    pub const FORMAT_INT4: i32 = 9;
    pub const FORMAT_UE8M0: i32 = 10;
    pub const FORMAT_UE4M3: i32 = 11;
    pub const FORMAT_I32: i32 = 12;

    pub const ORDER_ROW: i32 = 0;
    pub const ORDER_COL: i32 = 1;
    pub const OP_N: i32 = 0;
    pub const OP_T: i32 = 1;

    pub const SCALE_NONE: i32 = 0;
    pub const SCALE_TENSOR: i32 = 1;
    pub const SCALE_PER_OUTER: i32 = 2;
    pub const SCALE_PER_INNER: i32 = 3;
    pub const SCALE_BLOCK: i32 = 4;
    pub const SCALE_MX32: i32 = 5;
    pub const SCALE_NVFP4: i32 = 6;
    pub const SCALE_OUTER_MAJOR: i32 = 0;
    pub const SCALE_INNER_MAJOR: i32 = 1;
    pub const SCALE_SWIZZLED_128X4: i32 = 2;

    pub const BIAS_NONE: i32 = 0;
    pub const BIAS_ROWS: i32 = 1;
    pub const BIAS_COLS: i32 = 2;
    pub const ACT_NONE: i32 = 0;
    pub const ACT_RELU: i32 = 1;
    pub const ACT_GELU_TANH: i32 = 2;

    pub const FAULT_NONE: i32 = 0;
    pub const FAULT_GARBAGE: i32 = 1;
    pub const FAULT_SCALE_TRANSPOSE: i32 = 2;
    pub const FAULT_SCALE_IGNORE: i32 = 3;
    pub const FAULT_FN_AS_FNUZ: i32 = 4;
    pub const FAULT_NO_TRANSPOSE: i32 = 5;
    pub const FAULT_TILE_ROWS: i32 = 6;
    pub const FAULT_ZERO: i32 = 7;
    pub const FAULT_NAN: i32 = 8;

    pub const OK: i32 = 0;

    pub const BUFFER_A: i32 = 0;
    pub const BUFFER_B: i32 = 1;
    pub const BUFFER_C: i32 = 2;
    pub const BUFFER_D: i32 = 3;
    pub const BUFFER_A_SCALE: i32 = 4;
    pub const BUFFER_B_SCALE: i32 = 5;
    pub const BUFFER_BIAS: i32 = 6;

    // Linked statically by build.rs (cc emits the link directives).
    extern "C" {
        pub fn fixture_abi_version() -> u32;
        pub fn fixture_status_string(status: i32) -> *const std::ffi::c_char;
        pub fn fixture_gemm_required_bytes(desc: *const GemmDesc, buffer: i32, bytes: *mut u64) -> i32;
        pub fn fixture_gemm(desc: *const GemmDesc, args: *const GemmArgs) -> i32;
        pub fn fixture_decode(format: i32, code: u32, value: *mut f64) -> i32;
        pub fn fixture_encode(format: i32, value: f64, code: *mut u32) -> i32;
    }
}

/// A planted fault of the fixture library (see the C header for the exact behaviour).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fault {
    /// An honest library.
    None,
    /// Output replaced by seeded noise of the same RMS: cosine ~0, norm ratio ~1.
    Garbage,
    /// A's block / 2-D scale grid read with the other storage order (swizzled read as plain).
    ScaleTranspose,
    /// A's scale buffer treated as all ones.
    ScaleIgnore,
    /// A's e4m3fn (e5m2) bytes decoded as e4m3fnuz (e5m2fnuz): D exactly 0.5x, cosine 1
    /// (0x80, fn's -0, reads as 0 rather than the fnuz NaN, to keep the bug magnitude-only).
    FnAsFnuz,
    /// B's transpose flag ignored (needs K <= N when trans_b = T).
    NoTranspose,
    /// For M >= 56, rows 15, 31, 47, ... carry the previous row's values.
    TileRows,
    /// D all zeros.
    Zero,
    /// One NaN in D at a seeded position.
    Nan,
}

impl Fault {
    pub const ALL: [Fault; 9] = [
        Fault::None,
        Fault::Garbage,
        Fault::ScaleTranspose,
        Fault::ScaleIgnore,
        Fault::FnAsFnuz,
        Fault::NoTranspose,
        Fault::TileRows,
        Fault::Zero,
        Fault::Nan,
    ];

    /// Name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Fault::None => "none",
            Fault::Garbage => "garbage",
            Fault::ScaleTranspose => "scale-transpose",
            Fault::ScaleIgnore => "scale-ignore",
            Fault::FnAsFnuz => "fn-as-fnuz",
            Fault::NoTranspose => "no-transpose",
            Fault::TileRows => "tile-rows",
            Fault::Zero => "zero",
            Fault::Nan => "nan",
        }
    }

    /// One line on what the fault does to D.
    pub fn description(self) -> &'static str {
        match self {
            Fault::None => "honest library",
            Fault::Garbage => "output is seeded noise with the honest RMS (cosine ~0)",
            Fault::ScaleTranspose => "A's 2-D scale grid read in the other storage order (swizzle ignored)",
            Fault::ScaleIgnore => "A's scales treated as 1",
            Fault::FnAsFnuz => "A's e4m3fn/e5m2 bytes decoded as fnuz: D is exactly 0.5x",
            Fault::NoTranspose => "B's transpose flag ignored",
            Fault::TileRows => "rows i % 16 == 15 copy row i - 1 when M >= 56",
            Fault::Zero => "output all zeros",
            Fault::Nan => "one NaN at a seeded position",
        }
    }

    fn to_c(self) -> i32 {
        match self {
            Fault::None => sys::FAULT_NONE,
            Fault::Garbage => sys::FAULT_GARBAGE,
            Fault::ScaleTranspose => sys::FAULT_SCALE_TRANSPOSE,
            Fault::ScaleIgnore => sys::FAULT_SCALE_IGNORE,
            Fault::FnAsFnuz => sys::FAULT_FN_AS_FNUZ,
            Fault::NoTranspose => sys::FAULT_NO_TRANSPOSE,
            Fault::TileRows => sys::FAULT_TILE_ROWS,
            Fault::Zero => sys::FAULT_ZERO,
            Fault::Nan => sys::FAULT_NAN,
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A fault name that is not one of `Fault::ALL`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownFault(pub String);

impl fmt::Display for UnknownFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown fault `{}` (expected one of:", self.0)?;
        for fault in Fault::ALL {
            write!(f, " {}", fault.name())?;
        }
        f.write_str(")")
    }
}

impl std::error::Error for UnknownFault {}

impl FromStr for Fault {
    type Err = UnknownFault;

    fn from_str(s: &str) -> Result<Fault, UnknownFault> {
        let lower = s.trim().to_ascii_lowercase();
        Fault::ALL.into_iter().find(|f| f.name() == lower).ok_or_else(|| UnknownFault(s.to_string()))
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FixtureError {
    #[error("invalid problem: {0}")]
    Problem(#[from] ProblemError),
    #[error("not supported by the fixture library: {0}")]
    Unsupported(String),
    #[error("{buffer}: the problem reads it but no buffer was given")]
    MissingBuffer { buffer: &'static str },
    #[error("{buffer}: a buffer was given but the problem does not use it")]
    UnexpectedBuffer { buffer: &'static str },
    #[error("{buffer}: {have} bytes, the problem needs {need}")]
    BufferTooSmall { buffer: &'static str, have: usize, need: u64 },
    #[error("{what} does not fit the fixture's 64-bit sizes")]
    Overflow { what: &'static str },
    #[error("{buffer}: the C library needs {c} bytes but the problem model says {model}")]
    SizeMismatch { buffer: &'static str, c: u64, model: u64 },
    #[error("fixture library: {call} returned {status} ({message})")]
    Library { call: &'static str, status: i32, message: String },
}

/// Byte sizes of every buffer of a call (0 = not used).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BufferSizes {
    pub a: u64,
    pub b: u64,
    pub c: u64,
    pub d: u64,
    pub a_scale: u64,
    pub b_scale: u64,
    pub bias: u64,
}

impl BufferSizes {
    fn named(&self) -> [(&'static str, u64); 7] {
        [
            ("a", self.a),
            ("b", self.b),
            ("c", self.c),
            ("d", self.d),
            ("a_scale", self.a_scale),
            ("b_scale", self.b_scale),
            ("bias", self.bias),
        ]
    }
}

/// ABI version of the linked C library (`FIXTURE_ABI_VERSION`).
pub fn abi_version() -> u32 {
    // SAFETY: no arguments, returns a constant.
    unsafe { sys::fixture_abi_version() }
}

/// ABI version this wrapper was written against.
pub const ABI_VERSION: u32 = sys::ABI_VERSION;

/// Path of `libfixture_blas.so` (the same core as a stand-alone shared library), when built.
pub fn shared_library_path() -> Option<&'static Path> {
    let path = env!("QUANTSHADOW_FIXTURE_BLAS");
    (!path.is_empty()).then(|| Path::new(path))
}

/// Value of one code of `format`, decoded by the C library (an implementation independent of
/// `Format::decode_code`).
pub fn decode(format: Format, code: u32) -> Result<f64, FixtureError> {
    let mut value = 0.0f64;
    // SAFETY: `value` is a valid, writable f64 for the duration of the call.
    let status = unsafe { sys::fixture_decode(c_format(format), code, &mut value) };
    check("fixture_decode", status)?;
    Ok(value)
}

/// The code the C library stores in D for `value` (RNE; fp8/fp4/int saturate).
pub fn encode(format: Format, value: f64) -> Result<u32, FixtureError> {
    let mut code = 0u32;
    // SAFETY: `code` is a valid, writable u32 for the duration of the call.
    let status = unsafe { sys::fixture_encode(c_format(format), value, &mut code) };
    check("fixture_encode", status)?;
    Ok(code)
}

/// Buffer sizes as the C library computes them for `problem`.
pub fn required_bytes(problem: &GemmProblem) -> Result<BufferSizes, FixtureError> {
    problem.validate()?;
    c_required_bytes(&describe(problem)?)
}

/// Buffer sizes as the Rust problem model computes them (the two must agree).
pub fn model_required_bytes(problem: &GemmProblem) -> Result<BufferSizes, FixtureError> {
    problem.validate()?;
    // The C side validates with overflow checks first, so the model's unchecked arithmetic
    // below cannot overflow.
    c_required_bytes(&describe(problem)?)?;
    let batch = problem.batch;
    let (ar, ac) = problem.a_stored_dims();
    let (br, bc) = problem.b_stored_dims();
    let matrix = |layout: &MatrixLayout, rows: u64, cols: u64, what: &'static str| {
        bytes_for(layout.format, layout.required_elements(rows, cols, batch), what)
    };
    let scale = |spec: &Option<ScaleSpec>, outer: u64, what: &'static str| match spec {
        None => Ok(0),
        Some(s) => bytes_for(s.format, s.required_entries(outer, problem.k, batch), what),
    };
    Ok(BufferSizes {
        a: matrix(&problem.a, ar, ac, "a")?,
        b: matrix(&problem.b, br, bc, "b")?,
        c: match &problem.c {
            None => 0,
            Some(c) => matrix(c, problem.m, problem.n, "c")?,
        },
        d: matrix(&problem.d, problem.m, problem.n, "d")?,
        a_scale: scale(&problem.a_scale, problem.m, "a_scale")?,
        b_scale: scale(&problem.b_scale, problem.n, "b_scale")?,
        bias: match problem.epilogue.bias {
            None => 0,
            Some(bias) => {
                let len = match bias.axis {
                    BiasAxis::Rows => problem.m,
                    BiasAxis::Cols => problem.n,
                };
                bytes_for(bias.format, len, "bias")?
            }
        },
    })
}

/// Runs the fixture GEMM on host buffers and returns D, laid out as `problem.d` describes
/// (`d.format.bytes_for(d.required_elements(m, n, batch))` bytes; padding is zero).
///
/// `fault` plants one of the documented bugs; `seed` makes the random ones reproducible.
pub fn fixture_gemm(
    problem: &GemmProblem,
    inputs: &HostInputs,
    fault: Fault,
    seed: u64,
) -> Result<Vec<u8>, FixtureError> {
    problem.validate()?;
    let desc = describe(problem)?;
    let scalars = problem.resolve_scalars(&inputs.device_scalars)?;
    // Same rule as the oracle: a non-zero beta needs a C to scale.
    if scalars.beta != 0.0 && problem.c.is_none() {
        return Err(FixtureError::Unsupported(format!("beta = {} but the problem has no C", scalars.beta)));
    }

    // Both size models must agree; a disagreement is a bug on one side, never papered over.
    let c_sizes = c_required_bytes(&desc)?;
    let model_sizes = model_required_bytes(problem)?;
    for ((buffer, c), (_, model)) in c_sizes.named().into_iter().zip(model_sizes.named()) {
        if c != model {
            return Err(FixtureError::SizeMismatch { buffer, c, model });
        }
    }

    let a = input("a", Some(inputs.a.as_slice()), c_sizes.a)?;
    let b = input("b", Some(inputs.b.as_slice()), c_sizes.b)?;
    let c = input("c", inputs.c.as_deref(), c_sizes.c)?;
    let a_scale = input("a_scale", inputs.a_scale.as_deref(), c_sizes.a_scale)?;
    let b_scale = input("b_scale", inputs.b_scale.as_deref(), c_sizes.b_scale)?;
    let bias = input("bias", inputs.bias.as_deref(), c_sizes.bias)?;
    let d_len = usize::try_from(c_sizes.d).map_err(|_| FixtureError::Overflow { what: "d" })?;
    let mut d = vec![0u8; d_len];

    let args = sys::GemmArgs {
        a: ptr(a),
        b: ptr(b),
        c: ptr(c),
        d: d.as_mut_ptr(),
        a_scale: ptr(a_scale),
        b_scale: ptr(b_scale),
        bias: ptr(bias),
        alpha: scalar_f32(scalars.alpha, "alpha")?,
        beta: scalar_f32(scalars.beta, "beta")?,
        a_tensor_scale: scalar_f32(scalars.a_tensor_scale, "a_tensor_scale")?,
        b_tensor_scale: scalar_f32(scalars.b_tensor_scale, "b_tensor_scale")?,
        d_scale: scalar_f32(scalars.d_scale, "d_scale")?,
        fault: fault.to_c(),
        seed,
    };
    // SAFETY: every buffer the descriptor uses is at least the size the C library itself
    // reports for it (checked above), D is a fresh allocation that overlaps no input, and
    // the descriptor and args outlive the call.
    let status = unsafe { sys::fixture_gemm(&desc, &args) };
    check("fixture_gemm", status)?;
    Ok(d)
}

/// The input slice when the problem uses the buffer (`need > 0`) and it is large enough.
fn input<'a>(
    buffer: &'static str,
    given: Option<&'a [u8]>,
    need: u64,
) -> Result<Option<&'a [u8]>, FixtureError> {
    match (given, need) {
        (None, 0) => Ok(None),
        (Some(_), 0) => Err(FixtureError::UnexpectedBuffer { buffer }),
        (None, _) => Err(FixtureError::MissingBuffer { buffer }),
        (Some(bytes), need) => {
            if (bytes.len() as u64) < need {
                return Err(FixtureError::BufferTooSmall { buffer, have: bytes.len(), need });
            }
            Ok(Some(bytes))
        }
    }
}

/// NULL for an absent buffer: the C library rejects NULL where it needs data.
fn ptr(bytes: Option<&[u8]>) -> *const u8 {
    bytes.map_or(std::ptr::null(), <[u8]>::as_ptr)
}

fn check(call: &'static str, status: i32) -> Result<(), FixtureError> {
    if status == sys::OK {
        return Ok(());
    }
    // SAFETY: fixture_status_string returns a static NUL-terminated string for any status.
    let message =
        unsafe { CStr::from_ptr(sys::fixture_status_string(status)) }.to_string_lossy().into_owned();
    Err(FixtureError::Library { call, status, message })
}

fn c_required_bytes(desc: &sys::GemmDesc) -> Result<BufferSizes, FixtureError> {
    let one = |buffer: i32| {
        let mut bytes = 0u64;
        // SAFETY: `desc` and `bytes` are valid for the duration of the call.
        let status = unsafe { sys::fixture_gemm_required_bytes(desc, buffer, &mut bytes) };
        check("fixture_gemm_required_bytes", status).map(|()| bytes)
    };
    Ok(BufferSizes {
        a: one(sys::BUFFER_A)?,
        b: one(sys::BUFFER_B)?,
        c: one(sys::BUFFER_C)?,
        d: one(sys::BUFFER_D)?,
        a_scale: one(sys::BUFFER_A_SCALE)?,
        b_scale: one(sys::BUFFER_B_SCALE)?,
        bias: one(sys::BUFFER_BIAS)?,
    })
}

/// Bytes for `count` elements, refusing counts whose bit count would overflow.
fn bytes_for(format: Format, count: u64, what: &'static str) -> Result<u64, FixtureError> {
    let count = usize::try_from(count)
        .ok()
        .filter(|c| *c <= usize::MAX / 32)
        .ok_or(FixtureError::Overflow { what })?;
    Ok(format.bytes_for(count) as u64)
}

/// Explicit mapping: neither side's numbering may drift silently.
fn c_format(format: Format) -> i32 {
    match format {
        Format::F32 => sys::FORMAT_F32,
        Format::F16 => sys::FORMAT_F16,
        Format::Bf16 => sys::FORMAT_BF16,
        Format::E4m3fn => sys::FORMAT_E4M3FN,
        Format::E4m3fnuz => sys::FORMAT_E4M3FNUZ,
        Format::E5m2 => sys::FORMAT_E5M2,
        Format::E5m2fnuz => sys::FORMAT_E5M2FNUZ,
        Format::E2m1 => sys::FORMAT_E2M1,
        Format::Int8 => sys::FORMAT_INT8,
        Format::Int4 => sys::FORMAT_INT4,
        Format::Ue8m0 => sys::FORMAT_UE8M0,
        Format::Ue4m3 => sys::FORMAT_UE4M3,
        Format::I32 => sys::FORMAT_I32,
    }
}

fn to_i64(v: u64, what: &'static str) -> Result<i64, FixtureError> {
    i64::try_from(v).map_err(|_| FixtureError::Overflow { what })
}

fn matrix(layout: &MatrixLayout, what: &'static str) -> Result<sys::Matrix, FixtureError> {
    Ok(sys::Matrix {
        format: c_format(layout.format),
        order: match layout.order {
            Order::RowMajor => sys::ORDER_ROW,
            Order::ColMajor => sys::ORDER_COL,
        },
        ld: to_i64(layout.ld, what)?,
        batch_stride: to_i64(layout.batch_stride, what)?,
    })
}

fn scale(spec: Option<&ScaleSpec>, what: &'static str) -> Result<sys::Scale, FixtureError> {
    let Some(spec) = spec else { return Ok(sys::Scale { kind: sys::SCALE_NONE, ..sys::Scale::default() }) };
    let block = |v: u32| {
        i32::try_from(v).map_err(|_| FixtureError::Unsupported(format!("{what}: block size {v} exceeds i32")))
    };
    let (kind, block_outer, block_inner) = match spec.granularity {
        ScaleGranularity::Tensor => (sys::SCALE_TENSOR, 0, 0),
        ScaleGranularity::PerOuter => (sys::SCALE_PER_OUTER, 0, 0),
        ScaleGranularity::PerInner => (sys::SCALE_PER_INNER, 0, 0),
        ScaleGranularity::Block { outer, inner } => (sys::SCALE_BLOCK, block(outer)?, block(inner)?),
        ScaleGranularity::Mx32 => (sys::SCALE_MX32, 0, 0),
        ScaleGranularity::Nvfp4 => (sys::SCALE_NVFP4, 0, 0),
    };
    Ok(sys::Scale {
        ld: to_i64(spec.ld, what)?,
        batch_stride: to_i64(spec.batch_stride, what)?,
        kind,
        format: c_format(spec.format),
        storage: match spec.storage {
            ScaleStorage::OuterMajor => sys::SCALE_OUTER_MAJOR,
            ScaleStorage::InnerMajor => sys::SCALE_INNER_MAJOR,
            ScaleStorage::Swizzled128x4 => sys::SCALE_SWIZZLED_128X4,
        },
        block_outer,
        block_inner,
        reserved: 0,
    })
}

/// The C descriptor of a (validated) problem.
fn describe(problem: &GemmProblem) -> Result<sys::GemmDesc, FixtureError> {
    let op = |t: Transpose| match t {
        Transpose::N => sys::OP_N,
        Transpose::T => sys::OP_T,
    };
    for (operand, format) in [("a", problem.a.format), ("b", problem.b.format)] {
        if format == Format::I32 {
            return Err(FixtureError::Unsupported(format!("{operand}: i32 is an output format")));
        }
    }
    if let Some(bias) = problem.epilogue.bias {
        if !matches!(bias.format, Format::F32 | Format::F16 | Format::Bf16) {
            return Err(FixtureError::Unsupported(format!("bias format {}", bias.format)));
        }
    }
    let (bias_axis, bias_format) = match problem.epilogue.bias {
        None => (sys::BIAS_NONE, sys::FORMAT_F32),
        Some(bias) => (
            match bias.axis {
                BiasAxis::Rows => sys::BIAS_ROWS,
                BiasAxis::Cols => sys::BIAS_COLS,
            },
            c_format(bias.format),
        ),
    };
    Ok(sys::GemmDesc {
        m: to_i64(problem.m, "m")?,
        n: to_i64(problem.n, "n")?,
        k: to_i64(problem.k, "k")?,
        batch: to_i64(problem.batch, "batch")?,
        a: matrix(&problem.a, "a")?,
        b: matrix(&problem.b, "b")?,
        c: match &problem.c {
            None => sys::Matrix::default(),
            Some(c) => matrix(c, "c")?,
        },
        d: matrix(&problem.d, "d")?,
        a_scale: scale(problem.a_scale.as_ref(), "a_scale")?,
        b_scale: scale(problem.b_scale.as_ref(), "b_scale")?,
        trans_a: op(problem.trans_a),
        trans_b: op(problem.trans_b),
        use_c: problem.c.is_some() as i32,
        bias_axis,
        bias_format,
        activation: match problem.epilogue.activation {
            Activation::None => sys::ACT_NONE,
            Activation::Relu => sys::ACT_RELU,
            Activation::GeluTanh => sys::ACT_GELU_TANH,
        },
    })
}

/// The C library takes FP32 scalars (as cuBLASLt's 32F scale type); refuse values that would
/// silently become infinite.
fn scalar_f32(v: f64, what: &'static str) -> Result<f32, FixtureError> {
    let f = v as f32;
    if v.is_finite() && !f.is_finite() {
        return Err(FixtureError::Unsupported(format!("{what} = {v} is not representable as f32")));
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_names_round_trip() {
        for fault in Fault::ALL {
            assert_eq!(fault.to_string().parse::<Fault>(), Ok(fault));
        }
        assert_eq!("Tile-Rows".parse::<Fault>(), Ok(Fault::TileRows));
        let err = "transpose".parse::<Fault>().unwrap_err().to_string();
        assert!(err.contains("scale-transpose") && err.contains("`transpose`"), "{err}");
    }

    #[test]
    fn linked_library_matches_this_wrapper() {
        assert_eq!(abi_version(), ABI_VERSION);
    }

    #[test]
    fn scalars_that_overflow_f32_are_refused() {
        assert!(scalar_f32(1e300, "alpha").is_err());
        assert_eq!(scalar_f32(0.5, "alpha"), Ok(0.5));
        assert!(scalar_f32(f64::NAN, "alpha").unwrap().is_nan());
    }
}
