use super::suggest::{looks_like_gemm, skeleton};
use super::*;
use crate::formats::Format;
use crate::problem::*;
use std::path::Path;
use std::sync::Arc;

const FIXTURES: &str = include_str!("../../../tests/fixtures/specs/fixtures.toml");
const WRONG_COUNT: &str = include_str!("../../../tests/fixtures/specs_bad/wrong_count.toml");
const TRITON: &str = include_str!("../../../specs/triton_fp8_blockscale.toml");
const CUDA: &str = include_str!("../../../specs/cuda_gemm_example.toml");
const AITER: &str = include_str!("../../../specs/examples/aiter_a8w8_asm.toml");

fn set(text: &str) -> SpecSet {
    SpecSet::parse_str(text, "test.toml").unwrap_or_else(|e| panic!("{e}"))
}

fn load_err(text: &str) -> String {
    SpecSet::parse_str(text, "test.toml").expect_err("spec should not load")
}

/// Encodes parameters the way `kernelParams` holds them.
#[derive(Clone)]
enum P {
    Ptr(u64),
    I32(i32),
    U32(u32),
    I64(i64),
    F32(f32),
}

fn bytes(p: &P) -> Vec<u8> {
    match p {
        P::Ptr(v) => v.to_ne_bytes().to_vec(),
        P::I32(v) => v.to_ne_bytes().to_vec(),
        P::U32(v) => v.to_ne_bytes().to_vec(),
        P::I64(v) => v.to_ne_bytes().to_vec(),
        P::F32(v) => v.to_ne_bytes().to_vec(),
    }
}

fn decode_indexed(s: &SpecSet, name: &str, params: &[P]) -> Result<DecodedLaunch, SpecError> {
    let owned: Vec<Vec<u8>> = params.iter().map(bytes).collect();
    let slices: Vec<&[u8]> = owned.iter().map(|v| v.as_slice()).collect();
    let id = s.find(name).unwrap_or_else(|| panic!("no spec for {name}"));
    let view = LaunchView { name, grid: [1, 1, 1], block: [128, 1, 1], args: LaunchArgs::Indexed(&slices) };
    s.decode(id, &view)
}

fn decode_packed(s: &SpecSet, name: &str, buf: &[u8]) -> Result<DecodedLaunch, SpecError> {
    let id = s.find(name).unwrap_or_else(|| panic!("no spec for {name}"));
    let view = LaunchView { name, grid: [1, 1, 1], block: [256, 1, 1], args: LaunchArgs::Packed(buf) };
    s.decode(id, &view)
}

fn put(buf: &mut [u8], off: usize, b: &[u8]) {
    buf[off..off + b.len()].copy_from_slice(b);
}

fn layout(format: Format, ld: u64) -> MatrixLayout {
    MatrixLayout { format, order: Order::RowMajor, ld, batch_stride: 0 }
}

fn bf16_params(m: i32, n: i32, k: i32) -> Vec<P> {
    vec![
        P::Ptr(0x1000),
        P::Ptr(0x2000),
        P::Ptr(0x3000),
        P::I32(m),
        P::I32(n),
        P::I32(k),
        P::I64(12),
        P::I64(10),
        P::I64(8),
        P::F32(0.5),
    ]
}

fn mismatch(r: Result<DecodedLaunch, SpecError>) -> String {
    match r {
        Err(SpecError::Mismatch(m)) => m,
        other => panic!("expected a mismatch, got {other:?}"),
    }
}

fn skip(r: Result<DecodedLaunch, SpecError>) -> String {
    match r {
        Err(SpecError::Skip(m)) => m,
        other => panic!("expected a skip, got {other:?}"),
    }
}

// ---- parsing ----

#[test]
fn fixture_specs_parse() {
    let s = set(FIXTURES);
    assert_eq!(s.len(), 3);
    assert!(s.find("qs_fixture_gemm_bf16").is_some());
    assert!(s.find("qs_fixture_fp8_blockscale").is_some());
    assert!(s.find("qs_fixture_a8w8_packed").is_some());
    assert_eq!(s.find("qs_fixture_elementwise"), None);
}

#[test]
fn unknown_field_is_an_error() {
    let text = FIXTURES.replacen("note = \"CI fixture: indexed bf16 GEMM\"", "nte = \"typo\"", 1);
    let e = load_err(&text);
    assert!(e.contains("unknown field") && e.contains("nte"), "{e}");
    let text =
        FIXTURES.replacen("ld = { param = 6, type = \"i64\" }", "ld = { param = 6, typ = \"i64\" }", 1);
    let e = load_err(&text);
    assert!(e.contains("typ"), "{e}");
}

#[test]
fn bad_type_is_an_error() {
    let e = load_err(&FIXTURES.replacen("type = \"i64\"", "type = \"i16\"", 1));
    assert!(e.contains("i16"), "{e}");
    let e = load_err(&FIXTURES.replacen("format = \"bf16\"", "format = \"bf17\"", 1));
    assert!(e.contains("unknown format \"bf17\""), "{e}");
    let e = load_err(&FIXTURES.replacen("trans = \"T\"\nld", "trans = \"X\"\nld", 1));
    assert!(e.contains("X"), "{e}");
}

#[test]
fn missing_field_is_an_error() {
    let e = load_err(&FIXTURES.replacen("m = { param = 3, type = \"i32\" }\n", "", 1));
    assert!(e.contains("missing field `m`"), "{e}");
    let e = load_err(&FIXTURES.replacen("params = 10\n", "", 1));
    assert!(e.contains("exactly one of `params`"), "{e}");
}

#[test]
fn bad_glob_is_an_error() {
    let e = load_err(&FIXTURES.replacen("name = \"qs_fixture_gemm_bf16\"", "name = \"qs_[a-z]*\"", 1));
    assert!(e.contains("not supported"), "{e}");
    let e = load_err(&FIXTURES.replacen("name = \"qs_fixture_gemm_bf16\"", "name = \"\"", 1));
    assert!(e.contains("empty name pattern"), "{e}");
}

#[test]
fn load_time_checks() {
    let cases = [
        // index beyond the declared count
        (
            "m = { param = 3, type = \"i32\" }",
            "m = { param = 10, type = \"i32\" }",
            "parameter 10 but the kernel has 10",
        ),
        // offset source in an indexed spec
        (
            "m = { param = 3, type = \"i32\" }",
            "m = { offset = 0, type = \"i32\" }",
            "`offset` in an indexed spec",
        ),
        // unknown reference
        ("m = { param = 3, type = \"i32\" }", "m = \"rows\"", "unknown name \"rows\""),
        // a cycle
        ("m = { param = 3, type = \"i32\" }", "m = \"n\"\nvars.x = \"x\"", "cycle"),
        // pointer where an integer belongs
        ("m = { param = 3, type = \"i32\" }", "m = { param = 0, type = \"ptr\" }", "needs an integer"),
        // integer where a pointer belongs
        ("ptr = { param = 0, type = \"ptr\" }", "ptr = { param = 3, type = \"i32\" }", "needs a pointer"),
        // div on a float
        (
            "alpha = { param = 9, type = \"f32\" }",
            "alpha = { param = 9, type = \"f32\", div = 2 }",
            "div applies",
        ),
        // both param and offset
        (
            "m = { param = 3, type = \"i32\" }",
            "m = { param = 3, offset = 0, type = \"i32\" }",
            "exactly one of `param`",
        ),
    ];
    for (from, to, want) in cases {
        let text = FIXTURES.replacen(from, to, 1);
        assert_ne!(text, FIXTURES, "{from}");
        let e = load_err(&text);
        assert!(e.contains(want), "{to}: {e}");
        assert!(e.contains("test.toml"), "{e}");
    }
    let e = load_err(&FIXTURES.replacen(
        "k = { offset = 112, type = \"u32\" }",
        "k = { offset = 174, type = \"u32\" }",
        1,
    ));
    assert!(e.contains("outside packed_bytes = 176"), "{e}");
    let e = load_err(&FIXTURES.replacen(
        "k = { offset = 112, type = \"u32\" }",
        "k = { param = 1, type = \"u32\" }",
        1,
    ));
    assert!(e.contains("`param` in a packed spec"), "{e}");
}

#[test]
fn every_shipped_spec_file_parses() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dirs = ["specs", "specs/examples", "tests/fixtures/specs", "tests/fixtures/specs_bad"];
    for d in dirs {
        let dir = root.join(d);
        let (s, warnings) = SpecSet::load(std::slice::from_ref(&dir));
        assert!(warnings.is_empty(), "{d}: {warnings:?}");
        assert!(!s.is_empty(), "{d}");
    }
    // Directories are not walked recursively: specs/ holds exactly its two top-level files.
    let (s, _) = SpecSet::load(&[root.join("specs")]);
    assert_eq!(s.len(), 2);
}

#[test]
fn load_reports_bad_files_and_keeps_good_ones() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a_good.toml"), CUDA).unwrap();
    std::fs::write(dir.path().join("b_bad.toml"), "[[kernel]]\nname = 3\n").unwrap();
    std::fs::write(dir.path().join("c_ignored.txt"), "not toml").unwrap();
    let missing = dir.path().join("missing.toml");
    let (s, warnings) = SpecSet::load(&[dir.path().to_path_buf(), missing]);
    assert_eq!(s.len(), 1);
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(warnings[0].contains("b_bad.toml") && warnings[0].contains("left out"), "{warnings:?}");
    assert!(warnings[1].contains("missing.toml"), "{warnings:?}");
}

// ---- matching ----

#[test]
fn find_uses_globs_and_file_order() {
    let text = format!(
        "{CUDA}\n[[kernel]]\nname = \"qs_cuda_*\"\nparams = 3\nm = 1\nn = 1\nk = 1\n\
         [kernel.a]\nptr = {{ param = 0, type = \"ptr\" }}\nformat = \"bf16\"\n\
         [kernel.b]\nptr = {{ param = 1, type = \"ptr\" }}\nformat = \"bf16\"\n\
         [kernel.d]\nptr = {{ param = 2, type = \"ptr\" }}\nformat = \"bf16\"\n"
    );
    let s = set(&text);
    assert_eq!(s.find("qs_cuda_gemm_bf16_tiled"), Some(SpecId(0)));
    assert_eq!(s.find("qs_cuda_other"), Some(SpecId(1)));
    assert_eq!(s.find("qs_cuda_gemm_bf16_tiled_v2"), Some(SpecId(1)));
    assert_eq!(s.find("something_else"), None);
    let t = set(TRITON);
    assert!(t.find("qs_w8a8_block_fp8_matmul").is_some());
    assert!(t.find("qs_w8a8_block_fp8_matmul_0d1d2d").is_some());
}

// ---- indexed decoding ----

#[test]
fn decodes_indexed_bf16_fixture() {
    let s = set(FIXTURES);
    let got = decode_indexed(&s, "qs_fixture_gemm_bf16", &bf16_params(5, 7, 9)).unwrap();
    let mut want = GemmProblem::row_major(5, 7, 9, Format::Bf16, Format::Bf16, Format::Bf16);
    want.trans_b = Transpose::T;
    want.a = layout(Format::Bf16, 12);
    want.b = layout(Format::Bf16, 10);
    want.d = layout(Format::Bf16, 8);
    want.alpha = Scalar::Host(0.5);
    assert_eq!(got.problem, want);
    assert_eq!(got.buffers, GemmBuffers { a: 0x1000, b: 0x2000, d: 0x3000, ..Default::default() });
}

fn blockscale_params(m: i32, n: i32, k: i32) -> Vec<P> {
    let g = 128;
    let kg = (k + g - 1) / g;
    vec![
        P::Ptr(0xa000),
        P::Ptr(0xb000),
        P::Ptr(0xd000),
        P::Ptr(0x5a00),
        P::Ptr(0x5b00),
        P::I32(m),
        P::I32(n),
        P::I32(k),
        P::I32(k),
        P::I32(k),
        P::I32(n),
        P::I32(kg),
        P::I32(kg),
        P::I32(g),
    ]
}

#[test]
fn decodes_indexed_fp8_blockscale_fixture() {
    let s = set(FIXTURES);
    let got = decode_indexed(&s, "qs_fixture_fp8_blockscale", &blockscale_params(57, 256, 384)).unwrap();
    let mut want = GemmProblem::row_major(57, 256, 384, Format::E4m3fn, Format::E4m3fn, Format::Bf16);
    want.trans_b = Transpose::T;
    want.a = layout(Format::E4m3fn, 384);
    want.b = layout(Format::E4m3fn, 384);
    want.d = layout(Format::Bf16, 256);
    want.a_scale = Some(ScaleSpec {
        granularity: ScaleGranularity::Block { outer: 1, inner: 128 },
        format: Format::F32,
        storage: ScaleStorage::OuterMajor,
        ld: 3,
        batch_stride: 0,
    });
    want.b_scale = Some(ScaleSpec {
        granularity: ScaleGranularity::Block { outer: 128, inner: 128 },
        format: Format::F32,
        storage: ScaleStorage::OuterMajor,
        ld: 3,
        batch_stride: 0,
    });
    assert_eq!(got.problem, want);
    assert_eq!(
        got.buffers,
        GemmBuffers {
            a: 0xa000,
            b: 0xb000,
            d: 0xd000,
            a_scale: 0x5a00,
            b_scale: 0x5b00,
            ..Default::default()
        }
    );
}

fn triton_params(m: i32, n: i32, k: i32, as_strides: (i32, i32), scratch: usize) -> Vec<P> {
    let kg = k / 128;
    let mut v = vec![
        P::Ptr(0xa000),
        P::Ptr(0xb000),
        P::Ptr(0xc000),
        P::Ptr(0x5a00),
        P::Ptr(0x5b00),
        P::I32(m),
        P::I32(n),
        P::I32(k),
        P::I32(k),
        P::I32(k),
        P::I32(n),
        P::I32(as_strides.0),
        P::I32(as_strides.1),
        P::I32(kg),
        P::I32(1),
    ];
    v.extend(std::iter::repeat_n(P::Ptr(0), scratch));
    v
}

#[test]
fn decodes_triton_spec_with_both_scratch_conventions_and_scale_orders() {
    let s = set(TRITON);
    let name = "qs_w8a8_block_fp8_matmul";
    for scratch in [1, 2] {
        let got = decode_indexed(&s, name, &triton_params(57, 4096, 4096, (32, 1), scratch)).unwrap();
        let a = got.problem.a_scale.unwrap();
        assert_eq!((a.storage, a.ld), (ScaleStorage::OuterMajor, 32));
        assert_eq!(a.granularity, ScaleGranularity::Block { outer: 1, inner: 128 });
        let b = got.problem.b_scale.unwrap();
        assert_eq!((b.storage, b.ld), (ScaleStorage::OuterMajor, 32));
        assert_eq!(got.problem.trans_b, Transpose::T);
        assert_eq!(got.buffers.d, 0xc000);
    }
    // Column-major activation scales (As^T contiguous): strides (1, M).
    let got = decode_indexed(&s, name, &triton_params(57, 4096, 4096, (1, 57), 2)).unwrap();
    let a = got.problem.a_scale.unwrap();
    assert_eq!((a.storage, a.ld), (ScaleStorage::InnerMajor, 57));
    // M = 1: both strides 1 is a single row, outer-major.
    let got = decode_indexed(&s, name, &triton_params(1, 4096, 4096, (1, 1), 2)).unwrap();
    let a = got.problem.a_scale.unwrap();
    assert_eq!((a.storage, a.ld), (ScaleStorage::OuterMajor, 32));
    // Strides that describe neither order: a skip.
    let e = skip(decode_indexed(&s, name, &triton_params(57, 4096, 4096, (2, 64), 2)));
    assert!(e.contains("neither outer- nor inner-major"), "{e}");
    // 15 or 18 parameters: a mismatch.
    let e = mismatch(decode_indexed(&s, name, &triton_params(57, 4096, 4096, (32, 1), 0)));
    assert!(e.contains("15 parameters") && e.contains("one of [16, 17]"), "{e}");
}

#[test]
fn decodes_cuda_example_spec() {
    let s = set(CUDA);
    let params = [
        P::Ptr(1 << 20),
        P::Ptr(2 << 20),
        P::Ptr(3 << 20),
        P::I32(128),
        P::I32(256),
        P::I32(512),
        P::I32(512),
        P::I32(512),
        P::I32(256),
        P::F32(1.0),
    ];
    let got = decode_indexed(&s, "qs_cuda_gemm_bf16_tiled", &params).unwrap();
    assert_eq!((got.problem.m, got.problem.n, got.problem.k), (128, 256, 512));
    assert_eq!((got.problem.a.ld, got.problem.b.ld, got.problem.d.ld), (512, 512, 256));
    assert_eq!(got.problem.trans_b, Transpose::T);
}

// ---- packed decoding ----

fn a8w8_fixture_buffer(m: u32, n: u32, k: u32) -> Vec<u8> {
    let mut buf = vec![0u8; 176];
    put(&mut buf, 0, &0xd000u64.to_ne_bytes());
    put(&mut buf, 16, &0xa000u64.to_ne_bytes());
    put(&mut buf, 32, &0xb000u64.to_ne_bytes());
    put(&mut buf, 48, &0x5a00u64.to_ne_bytes());
    put(&mut buf, 64, &0x5b00u64.to_ne_bytes());
    put(&mut buf, 80, &m.to_ne_bytes());
    put(&mut buf, 96, &n.to_ne_bytes());
    put(&mut buf, 112, &k.to_ne_bytes());
    put(&mut buf, 128, &k.to_ne_bytes()); // lda bytes (e4m3: 1 byte each)
    put(&mut buf, 144, &k.to_ne_bytes());
    put(&mut buf, 160, &(2 * n).to_ne_bytes()); // ldd bytes (bf16)
    buf
}

#[test]
fn the_weight_address_is_read_alone_for_per_site_sampling() {
    // Layers sharing one kernel and grid are told apart by B's address (the sampling key).
    let s = set(FIXTURES);
    let id = s.find("qs_fixture_gemm_bf16").unwrap();
    let owned: Vec<Vec<u8>> = bf16_params(5, 7, 9).iter().map(bytes).collect();
    let slices: Vec<&[u8]> = owned.iter().map(|v| v.as_slice()).collect();
    assert_eq!(s.weight_ptr(id, &LaunchArgs::Indexed(&slices)), Some(0x2000));
    // Arguments that do not hold it (too few, or packed for an indexed spec): None, no read past them.
    assert_eq!(s.weight_ptr(id, &LaunchArgs::Indexed(&slices[..1])), None);
    assert_eq!(s.weight_ptr(id, &LaunchArgs::Packed(&[0u8; 4])), None);
    let packed = s.find("qs_fixture_a8w8_packed").unwrap();
    let buf = a8w8_fixture_buffer(16, 64, 96);
    let b = decode_packed(&s, "qs_fixture_a8w8_packed", &buf).unwrap().buffers.b;
    assert_eq!(s.weight_ptr(packed, &LaunchArgs::Packed(&buf)), Some(b));
    assert_eq!(s.weight_ptr(packed, &LaunchArgs::Packed(&buf[..8])), None, "cut short");
    assert_eq!(s.weight_ptr(SpecId(999), &LaunchArgs::Packed(&buf)), None);
}

#[test]
fn decodes_packed_a8w8_fixture() {
    let s = set(FIXTURES);
    let got = decode_packed(&s, "qs_fixture_a8w8_packed", &a8w8_fixture_buffer(16, 64, 96)).unwrap();
    let mut want = GemmProblem::row_major(16, 64, 96, Format::E4m3fn, Format::E4m3fn, Format::Bf16);
    want.trans_b = Transpose::T;
    want.a = layout(Format::E4m3fn, 96);
    want.b = layout(Format::E4m3fn, 96);
    want.d = layout(Format::Bf16, 64);
    want.a_scale = Some(ScaleSpec::new(ScaleGranularity::PerOuter, Format::F32));
    want.b_scale = Some(ScaleSpec::new(ScaleGranularity::PerOuter, Format::F32));
    assert_eq!(got.problem, want);
    assert_eq!(
        got.buffers,
        GemmBuffers {
            a: 0xa000,
            b: 0xb000,
            d: 0xd000,
            a_scale: 0x5a00,
            b_scale: 0x5b00,
            ..Default::default()
        }
    );
    // A larger buffer is fine (the spec states a minimum).
    let mut big = a8w8_fixture_buffer(16, 64, 96);
    big.extend([0u8; 64]);
    assert!(decode_packed(&s, "qs_fixture_a8w8_packed", &big).is_ok());
}

#[test]
fn decodes_aiter_example_over_a_synthetic_buffer() {
    let s = set(AITER);
    let (m, n, k) = (32u32, 256u32, 512u32);
    let mut buf = vec![0u8; 208];
    for (off, v) in [(0, 0xd000u64), (16, 0xa000), (32, 0xb000), (48, 0x5a00), (64, 0x5b00), (80, 0xb1a5)] {
        put(&mut buf, off, &v.to_ne_bytes());
    }
    for (off, v) in [(96, m), (112, n), (128, k), (144, k), (160, k), (176, 2 * n), (192, 1)] {
        put(&mut buf, off, &v.to_ne_bytes());
    }
    let name = "_ZN5aiter17gemm_a8w8_bf16_asmE";
    let got = decode_packed(&s, name, &buf).unwrap();
    assert_eq!((got.problem.m, got.problem.n, got.problem.k), (32, 256, 512));
    assert_eq!((got.problem.a.ld, got.problem.b.ld, got.problem.d.ld), (512, 512, 256));
    assert_eq!(got.problem.a.format, Format::E4m3fn);
    assert_eq!(got.problem.d.format, Format::Bf16);
    assert_eq!(got.problem.epilogue.bias, Some(Bias { format: Format::Bf16, axis: BiasAxis::Cols }));
    assert_eq!(got.buffers.bias, 0xb1a5);
    assert_eq!(got.problem.a_scale.unwrap().granularity, ScaleGranularity::PerOuter);
    // A null bias is "no bias" for this kernel.
    put(&mut buf, 80, &0u64.to_ne_bytes());
    let got = decode_packed(&s, name, &buf).unwrap();
    assert_eq!(got.problem.epilogue.bias, None);
    assert_eq!(got.buffers.bias, 0);
}

// ---- mismatches ----

#[test]
fn wrong_parameter_count_is_a_mismatch() {
    let s = set(WRONG_COUNT);
    let e = mismatch(decode_indexed(&s, "qs_fixture_gemm_bf16", &bf16_params(4, 4, 4)));
    assert!(e.contains("test.toml") && e.contains("[qs_fixture_gemm_bf16]") && e.contains("params"), "{e}");
    assert!(e.contains("10 parameters") && e.contains("expects 9"), "{e}");
}

#[test]
fn size_disagreement_is_a_mismatch() {
    let s = set(FIXTURES);
    let mut p = bf16_params(4, 4, 4);
    p[6] = P::I32(4); // lda passed as 4 bytes, the spec reads i64
    let e = mismatch(decode_indexed(&s, "qs_fixture_gemm_bf16", &p));
    assert!(e.contains("a.ld") && e.contains("parameter 6 is 4 bytes") && e.contains("i64"), "{e}");
    let mut p = bf16_params(4, 4, 4);
    p[0] = P::U32(7);
    let e = mismatch(decode_indexed(&s, "qs_fixture_gemm_bf16", &p));
    assert!(e.contains("a.ptr"), "{e}");
}

#[test]
fn a_mismatch_beats_a_skip() {
    // m is negative (a skip) but lda has the wrong size: the structural problem wins.
    let s = set(FIXTURES);
    let mut p = bf16_params(-1, 4, 4);
    p[6] = P::I32(4);
    mismatch(decode_indexed(&s, "qs_fixture_gemm_bf16", &p));
}

#[test]
fn short_packed_buffer_is_a_mismatch() {
    let s = set(FIXTURES);
    let buf = a8w8_fixture_buffer(16, 64, 96);
    let e = mismatch(decode_packed(&s, "qs_fixture_a8w8_packed", &buf[..170]));
    assert!(e.contains("packed_bytes") && e.contains("170 bytes"), "{e}");
    let e = mismatch(decode_packed(&s, "qs_fixture_a8w8_packed", &[]));
    assert!(e.contains("0 bytes"), "{e}");
}

#[test]
fn launch_kind_disagreement_is_a_mismatch() {
    let s = set(FIXTURES);
    let e = mismatch(decode_packed(&s, "qs_fixture_gemm_bf16", &[0u8; 256]));
    assert!(e.contains("packed argument buffer"), "{e}");
    let e = mismatch(decode_indexed(&s, "qs_fixture_a8w8_packed", &bf16_params(1, 1, 1)));
    assert!(e.contains("indexed parameters"), "{e}");
}

// ---- skips ----

#[test]
fn skips_keep_the_spec_enabled() {
    let s = set(FIXTURES);
    let name = "qs_fixture_gemm_bf16";
    let mut p = bf16_params(4, 4, 4);
    p[0] = P::Ptr(0);
    assert!(skip(decode_indexed(&s, name, &p)).contains("a.ptr: null pointer"));
    assert!(skip(decode_indexed(&s, name, &bf16_params(-3, 4, 4))).contains("m: -3 is negative"));
    assert!(skip(decode_indexed(&s, name, &bf16_params(0, 4, 4))).contains("m is zero"));
    // k = 20 > lda = 12: the problem model rejects the leading dimension.
    let e = skip(decode_indexed(&s, name, &bf16_params(4, 4, 20)));
    assert!(e.contains("leading dimension"), "{e}");
    // A byte stride that is not a whole number of elements.
    let fx = set(FIXTURES);
    let mut buf = a8w8_fixture_buffer(16, 64, 96);
    put(&mut buf, 160, &129u32.to_ne_bytes());
    let e = skip(decode_packed(&fx, "qs_fixture_a8w8_packed", &buf));
    assert!(e.contains("d.ld") && e.contains("div = 2"), "{e}");
    let mut buf = a8w8_fixture_buffer(16, 64, 96);
    put(&mut buf, 48, &0u64.to_ne_bytes());
    assert!(skip(decode_packed(&fx, "qs_fixture_a8w8_packed", &buf)).contains("a_scale.ptr"));
    let id = s.find(name).unwrap();
    assert!(!s.is_disabled(id));
    assert!(decode_indexed(&s, name, &bf16_params(4, 4, 4)).is_ok());
}

// ---- disable / find ----

#[test]
fn disable_hides_a_spec_from_find() {
    let text = format!(
        "{WRONG_COUNT}\n{}",
        FIXTURES.split("\n[[kernel]]").nth(1).map(|k| format!("[[kernel]]{k}")).unwrap()
    );
    let s = set(&text);
    let name = "qs_fixture_gemm_bf16";
    let first = s.find(name).unwrap();
    assert_eq!(first, SpecId(0));
    let e = mismatch(decode_indexed(&s, name, &bf16_params(4, 4, 4)));
    let line = s.disable(first, &e);
    assert!(line.contains("disabled") && line.contains("expects 9") && !line.contains("already"), "{line}");
    assert!(s.is_disabled(first));
    assert!(s.disable(first, &e).contains("already disabled"));
    // The next matching spec takes over; decoding through the disabled one is a skip.
    let second = s.find(name).unwrap();
    assert_eq!(second, SpecId(1));
    assert!(decode_indexed(&s, name, &bf16_params(4, 4, 4)).is_ok());
    let owned: Vec<Vec<u8>> = bf16_params(4, 4, 4).iter().map(bytes).collect();
    let slices: Vec<&[u8]> = owned.iter().map(|v| v.as_slice()).collect();
    let view = LaunchView { name, grid: [1; 3], block: [1; 3], args: LaunchArgs::Indexed(&slices) };
    assert!(skip(s.decode(first, &view)).contains("disabled"));
}

#[test]
fn disable_is_thread_safe_and_reported_once() {
    let s = Arc::new(set(FIXTURES));
    let id = s.find("qs_fixture_gemm_bf16").unwrap();
    let lines: Vec<String> = (0..8)
        .map(|_| {
            let s = Arc::clone(&s);
            std::thread::spawn(move || s.disable(id, "test"))
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    assert_eq!(lines.iter().filter(|l| !l.contains("already")).count(), 1, "{lines:?}");
    assert_eq!(s.find("qs_fixture_gemm_bf16"), None);
    assert!(s.find("qs_fixture_fp8_blockscale").is_some());
}

// ---- suggestions and listings ----

#[test]
fn gemm_name_heuristic() {
    for n in [
        "qs_w8a8_block_fp8_matmul",
        "_Z20qs_cuda_gemm_bf16PKv",
        "cutlass_80_tensorop_bf16_s16816gemm",
        "sm90_xmma_gemm_e4m3",
        "_scaled_mm_kernel",
        "bmm_kernel",
        "triton_mm_0",
        "_ZN5aiter17gemm_a8w8_bf16_asmE",
    ] {
        assert!(looks_like_gemm(n), "{n}");
    }
    for n in
        ["per_token_group_quant_fp8", "vectorized_elementwise_kernel", "rms_norm_kernel", "commit_kernel"]
    {
        assert!(!looks_like_gemm(n), "{n}");
    }
}

#[test]
fn indexed_skeleton_loads_as_written() {
    let stat = KernelStat {
        name: "qs_fixture_gemm_bf16".into(),
        entry: "cuLaunchKernel".into(),
        calls: 3,
        grid: [4, 2, 1],
        block: [128, 1, 1],
        shapes: 1,
        param_sizes: Some(vec![8, 8, 8, 4, 4, 4, 8, 8, 8, 4]),
        packed_bytes: None,
        spec: None,
    };
    let text = skeleton(&stat);
    let s = SpecSet::parse_str(&text, "suggested.toml").unwrap_or_else(|e| panic!("{e}\n{text}"));
    let got = decode_indexed(
        &s,
        "qs_fixture_gemm_bf16",
        &[
            P::Ptr(1),
            P::Ptr(2),
            P::Ptr(3),
            P::I32(4),
            P::I32(4),
            P::I32(4),
            P::I64(4),
            P::I64(4),
            P::I64(4),
            P::F32(1.0),
        ],
    )
    .unwrap();
    assert_eq!(got.buffers.d, 3);
    // Packed kernels get placeholders that refuse to load until filled in.
    let packed = KernelStat { param_sizes: None, packed_bytes: Some(176), ..stat };
    let e = SpecSet::parse_str(&skeleton(&packed), "suggested.toml").unwrap_err();
    assert!(e.contains("TODO_"), "{e}");
}

#[test]
fn listing_json_round_trip_and_errors() {
    let l = KernelListing {
        kernels: vec![KernelStat {
            name: "k".into(),
            entry: "cuLaunchKernel".into(),
            calls: 1,
            grid: [1, 1, 1],
            block: [1, 1, 1],
            shapes: 1,
            param_sizes: Some(vec![8]),
            packed_bytes: None,
            spec: None,
        }],
    };
    let json = l.to_json();
    assert_eq!(KernelListing::from_json(&json).unwrap(), l);
    assert!(KernelListing::from_json(&json[..json.len() / 2]).unwrap_err().contains("truncated"));
    assert!(KernelListing::from_json("{\"kernels\": 3}").unwrap_err().contains("malformed"));
}
