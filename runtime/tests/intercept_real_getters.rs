//! The real query path of the decoders (symbol resolution through `RealSlot`, the C
//! signatures of the getters, the attribute sizes passed) against a stand-in cuBLAS/cuBLASLt
//! written here in C, compiled to a shared library at test time and loaded RTLD_LOCAL (as
//! Python loads the real ones). The stand-in getters refuse a size that is not the attribute's
//! size from `cublasLt.h`, as the real ones do (CUBLAS_STATUS_INVALID_VALUE), so a wrong value
//! width in the tables fails here.
//!
//! Skipped (with a message) when no C compiler is available.

use quantshadow_runtime::formats::Format;
use quantshadow_runtime::intercept::{hipblaslt as qs_hipblaslt, hook, GemmArgs};
use quantshadow_runtime::problem::{BiasAxis, Scalar, ScaleGranularity, Transpose};
use std::ffi::{c_void, CString};
use std::process::Command;

const FAKE_C: &str = r#"
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Attribute sizes from the cublasLt.h comments (0: not settable here). */
static const size_t DESC_SIZE[40] = {
    [0] = 4, [1] = 4, [2] = 4, [3] = 4, [4] = 4, [5] = 4, [6] = 4, [7] = 4, [8] = 8, [10] = 8,
    [11] = 8, [12] = 8, [13] = 8, [14] = 8, [15] = 4, [17] = 8, [18] = 8, [19] = 8, [20] = 8,
    [21] = 8, [22] = 4, [23] = 8, [24] = 8, [25] = 1, [26] = 4, [31] = 4, [32] = 4, [33] = 4,
    [34] = 4, [35] = 4, [36] = 8, [37] = 4, [38] = 8,
};
static const size_t LAYOUT_SIZE[9] = { 4, 4, 8, 8, 8, 4, 8, 8, 4 };

static int64_t desc_val[40];
static int64_t layout_val[4][9];

void fake_set_desc(int attr, int64_t v) { desc_val[attr] = v; }
void fake_set_layout(int which, int attr, int64_t v) { layout_val[which][attr] = v; }

int cublasLtMatmulDescGetAttribute(void *desc, int attr, void *buf, size_t size, size_t *written) {
    if (desc == NULL || attr < 0 || attr >= 40 || DESC_SIZE[attr] == 0) return 7;
    if (size != DESC_SIZE[attr] || buf == NULL) return 7;
    memcpy(buf, &desc_val[attr], size);
    if (written) *written = size;
    return 0;
}

int cublasLtMatrixLayoutGetAttribute(void *layout, int attr, void *buf, size_t size, size_t *written) {
    intptr_t which = (intptr_t)layout - 0x11;
    if (which < 0 || which > 3 || attr < 0 || attr >= 9) return 7;
    if (size != LAYOUT_SIZE[attr] || buf == NULL) return 7;
    memcpy(buf, &layout_val[which][attr], size);
    if (written) *written = size;
    return 0;
}

size_t cublasLtGetVersion(void) { return 130100; }

int cublasGetStream_v2(void *handle, void **stream) { (void)handle; *stream = (void *)0x5157; return 0; }
int cublasGetPointerMode_v2(void *handle, int *mode) { (void)handle; *mode = 0; return 0; }
int cublasGetMathMode(void *handle, int *mode) { (void)handle; *mode = 0; return 0; }

/* hipBLASLt 1.1 (ROCm 7.1): sizes from the hipblaslt.h comments. */
static const size_t HIP_DESC_SIZE[110] = {
    [0] = 4, [1] = 4, [2] = 4, [3] = 8, [4] = 4, [5] = 8, [6] = 8, [7] = 8, [8] = 8, [9] = 8,
    [10] = 8, [11] = 8, [12] = 8, [13] = 4, [14] = 8, [22] = 4, [31] = 4, [32] = 4,
    [100] = 4, [101] = 4, [102] = 4, [103] = 4,
};
static const size_t HIP_LAYOUT_SIZE[7] = { 4, 8, 4, 4, 8, 8, 8 };
static int64_t hip_desc_val[110];
static int64_t hip_layout_val[4][7];
static int hip_desc_storage;

void fake_hip_set_desc(int attr, int64_t v) { hip_desc_val[attr] = v; }
void fake_hip_set_layout(int which, int attr, int64_t v) { hip_layout_val[which][attr] = v; }

int hipblasLtGetVersion(void *handle, int *version) {
    if (handle == NULL || version == NULL) return 3;
    *version = 100100; /* 1.1.0: major * 100000 + minor * 100 + patch */
    return 0;
}

int hipblasLtMatmulDescCreate(void **desc, int compute, int scale_type) {
    (void)compute; (void)scale_type;
    *desc = &hip_desc_storage;
    return 0;
}

int hipblasLtMatmulDescDestroy(void *desc) { return desc == &hip_desc_storage ? 0 : 3; }

int hipblasLtMatmulDescGetAttribute(void *desc, int attr, void *buf, size_t size, size_t *written) {
    if (desc != &hip_desc_storage || attr < 0 || attr >= 110 || HIP_DESC_SIZE[attr] == 0) return 3;
    if (size != HIP_DESC_SIZE[attr] || buf == NULL) return 3;
    memcpy(buf, &hip_desc_val[attr], size);
    if (written) *written = size;
    return 0;
}

int hipblasLtMatrixLayoutGetAttribute(void *layout, int attr, void *buf, size_t size, size_t *written) {
    intptr_t which = (intptr_t)layout - 0x11;
    if (which < 0 || which > 3 || attr < 0 || attr >= 7) return 3;
    if (size != HIP_LAYOUT_SIZE[attr] || buf == NULL) return 3;
    memcpy(buf, &hip_layout_val[which][attr], size);
    if (written) *written = size;
    return 0;
}
"#;

struct Fake {
    set_desc: extern "C" fn(i32, i64),
    set_layout: extern "C" fn(i32, i32, i64),
    hip_set_desc: extern "C" fn(i32, i64),
    hip_set_layout: extern "C" fn(i32, i32, i64),
}

fn load_fake() -> Option<Fake> {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("fake_cublaslt.c");
    let lib = dir.path().join("libfake_cublaslt.so");
    std::fs::write(&src, FAKE_C).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let ok = Command::new(&cc)
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&lib)
        .arg(&src)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        eprintln!("no C compiler ({cc}): skipping the real-getter tests");
        return None;
    }
    let path = CString::new(lib.to_str().unwrap()).unwrap();
    // SAFETY: loading a library built above; RTLD_LOCAL as Python extension modules do.
    unsafe {
        let h = libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        assert!(!h.is_null());
        std::mem::forget(dir); // keep the file for the process
        let sym = |name: &str| {
            let n = CString::new(name).unwrap();
            let p = libc::dlsym(h, n.as_ptr());
            assert!(!p.is_null(), "{name}");
            p
        };
        Some(Fake {
            set_desc: std::mem::transmute::<*mut c_void, extern "C" fn(i32, i64)>(sym("fake_set_desc")),
            set_layout: std::mem::transmute::<*mut c_void, extern "C" fn(i32, i32, i64)>(sym(
                "fake_set_layout",
            )),
            hip_set_desc: std::mem::transmute::<*mut c_void, extern "C" fn(i32, i64)>(sym(
                "fake_hip_set_desc",
            )),
            hip_set_layout: std::mem::transmute::<*mut c_void, extern "C" fn(i32, i32, i64)>(sym(
                "fake_hip_set_layout",
            )),
        })
    }
}

/// One test (the stand-in library holds process-wide state).
#[test]
fn decoders_through_real_getters() {
    let Some(fake) = load_fake() else { return };

    // ---- cuBLASLt: F.linear with bias, bf16 (A = W^T via TRANSA, layouts 0x11..0x14 = A, B, C, D).
    let (out_f, tokens, in_f) = (64i64, 8i64, 128i64);
    for (attr, v) in [(0, 68), (1, 0), (2, 0), (3, 1), (4, 0), (6, 2), (7, 4), (8, 0xB1A5), (26, -1)] {
        (fake.set_desc)(attr, v);
    }
    let layouts = [(in_f, out_f), (in_f, tokens), (out_f, tokens), (out_f, tokens)];
    for (i, (rows, cols)) in layouts.iter().enumerate() {
        let i = i as i32;
        for (attr, v) in [(0, 14), (1, 0), (2, *rows), (3, *cols), (4, *rows), (5, 1), (6, 0)] {
            (fake.set_layout)(i, attr, v);
        }
    }
    let (alpha, beta) = (1.0f32, 0.0f32);
    let args = hook::cublasLtMatmul::Args {
        handle: 0x4a4d as *mut c_void,
        desc: 0xDE5C as *mut c_void,
        alpha: &alpha as *const f32 as *const c_void,
        a: 0x1000 as *const c_void,
        a_desc: 0x11 as *mut c_void,
        b: 0x2000 as *const c_void,
        b_desc: 0x12 as *mut c_void,
        beta: &beta as *const f32 as *const c_void,
        c: 0x3000 as *const c_void,
        c_desc: 0x13 as *mut c_void,
        d: 0x3000 as *mut c_void,
        d_desc: 0x14 as *mut c_void,
        algo: std::ptr::null(),
        workspace: std::ptr::null_mut(),
        workspace_bytes: 0,
        stream: 0x57 as *mut c_void,
    };
    let g = args.decode().unwrap();
    let p = &g.problem;
    assert_eq!((p.m, p.n, p.k), (tokens as u64, out_f as u64, in_f as u64));
    assert_eq!((p.trans_a, p.trans_b), (Transpose::N, Transpose::T));
    assert_eq!(p.epilogue.bias.unwrap().axis, BiasAxis::Cols);
    assert_eq!(p.epilogue.bias.unwrap().format, Format::Bf16);
    assert_eq!((g.buffers.b, g.buffers.a, g.buffers.bias), (0x1000, 0x2000, 0xB1A5));
    assert_eq!(args.quick_key(), args.quick_key());

    // FP8 row-wise scales with fast accumulation: 1-byte FAST_ACCUM, 8-byte pointers, 4-byte
    // scale modes all pass the size check.
    for (attr, v) in [(7, 1), (17, 0x5CA0), (18, 0x5CB0), (31, 3), (32, 3), (25, 1)] {
        (fake.set_desc)(attr, v);
    }
    for i in 0..2 {
        (fake.set_layout)(i, 0, 28);
    }
    let g = args.decode().unwrap();
    assert!(g.problem.fast_accum);
    assert_eq!((g.buffers.b_scale, g.buffers.a_scale), (0x5CA0, 0x5CB0));
    assert_eq!(g.problem.b.format, Format::E4m3fn);

    // ---- cuBLAS classic through the real handle getters.
    let x = hook::cublasGemmEx::Args {
        handle: 0x4a4d as *mut c_void,
        trans_a: 1,
        trans_b: 0,
        m: 64,
        n: 8,
        k: 128,
        alpha: &alpha as *const f32 as *const c_void,
        a: 0x1000 as *const c_void,
        a_type: 14,
        lda: 128,
        b: 0x2000 as *const c_void,
        b_type: 14,
        ldb: 128,
        beta: &beta as *const f32 as *const c_void,
        c: 0x3000 as *mut c_void,
        c_type: 14,
        ldc: 64,
        compute: 68,
        algo: -1,
    };
    let g = x.decode().unwrap();
    assert_eq!(g.stream, 0x5157);
    assert_eq!(g.problem.alpha, Scalar::Host(1.0));

    // ---- hipBLASLt: the descriptor learnt through the real create hook, FP8 fnuz row-wise
    // scales (1.1: A/B_SCALE_MODE = OUTER_VEC_32F), TRANSA = T, bf16 output.
    let mut desc: *mut c_void = std::ptr::null_mut();
    // SAFETY: the hook body with a valid out-pointer; the stand-in's create is the real one.
    let status = unsafe { hook::hipblasLtMatmulDescCreate::enter(&mut desc, 2, 0) };
    assert_eq!(status, 0);
    assert_eq!(qs_hipblaslt::desc_types(desc), Some((2, 0)), "recorded at creation");
    for (attr, v) in
        [(0, 112), (1, 111), (2, 1), (4, 255), (5, 0x5CA0), (6, 0x5CB0), (13, 0), (31, 3), (32, 3)]
    {
        (fake.hip_set_desc)(attr, v);
    }
    let layouts = [(in_f, out_f, 1000), (in_f, tokens, 1000), (out_f, tokens, 14), (out_f, tokens, 14)];
    for (i, (rows, cols, ty)) in layouts.iter().enumerate() {
        for (attr, v) in [(0, 1), (1, 0), (2, *ty), (3, 0), (4, *rows), (5, *cols), (6, *rows)] {
            (fake.hip_set_layout)(i as i32, attr, v);
        }
    }
    let h = hook::hipblasLtMatmul::Args {
        handle: 0x4a4d as *mut c_void,
        desc,
        alpha: &alpha as *const f32 as *const c_void,
        a: 0x1000 as *const c_void,
        a_desc: 0x11 as *mut c_void,
        b: 0x2000 as *const c_void,
        b_desc: 0x12 as *mut c_void,
        beta: &beta as *const f32 as *const c_void,
        c: 0x3000 as *const c_void,
        c_desc: 0x13 as *mut c_void,
        d: 0x3000 as *mut c_void,
        d_desc: 0x14 as *mut c_void,
        algo: std::ptr::null(),
        workspace: std::ptr::null_mut(),
        workspace_bytes: 0,
        stream: 0x57 as *mut c_void,
    };
    let g = h.decode().unwrap();
    assert_eq!((g.problem.a.format, g.problem.b.format), (Format::E4m3fnuz, Format::E4m3fnuz));
    assert_eq!(g.problem.b_scale.unwrap().granularity, ScaleGranularity::PerOuter);
    assert_eq!((g.buffers.b_scale, g.buffers.a_scale), (0x5CA0, 0x5CB0));
    assert_eq!((g.problem.trans_a, g.problem.trans_b), (Transpose::N, Transpose::T));
    assert_ne!(h.quick_key(), 0);
    // SAFETY: as above.
    assert_eq!(unsafe { hook::hipblasLtMatmulDescDestroy::enter(desc) }, 0);
    assert_eq!(qs_hipblaslt::desc_types(desc), None, "forgotten at destruction");
    assert_eq!(
        h.decode().unwrap_err().0,
        "hipblasLt: descriptor not seen at creation (compute and scale type unknown)"
    );
}
