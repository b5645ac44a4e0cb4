//! Compile check of the device kernels without a GPU, and the host values a device selftest
//! compares the kernels' helpers with.
//!
//! `kernels_compile_with_nvrtc` hands the Rust registry's specialisations (abi::KernelBuild:
//! source, defines, entry names, the runtime's NVRTC options) to kernels/check_compile.py, which compiles each with NVRTC
//! for compute_90 and compute_80 and checks every entry name is in the PTX; so the registry,
//! the defines and the kernels' names cannot drift apart. It needs python3 and libnvrtc
//! ($QUANTSHADOW_NVRTC, else /opt/nvrtc/nvidia/cu13/lib/libnvrtc.so.13) and passes with a printed
//! note when either is missing. `kernels_compile_with_the_gpu_hosts_nvrtc` does the same with the
//! GPU host's NVRTC 13.0 for sm_90 where `.ci/run` installed it.
//!
//! `golden_values_for_the_device_selftest` computes, on the host, what qs_selftest.cu must
//! reproduce bit for bit (every decoder code, encoder results, hash3 / probe signs / row
//! permutation, scale entries), checks the host side's own invariants, and writes them as JSON to
//! $QUANTSHADOW_GOLDEN_OUT when set (to compare with a device's values by hand; `quantshadow
//! selftest --only helpers` checks the device against the same host functions).

use quantshadow_runtime::device::abi::{KernelBuild, QsScaleDesc};
use quantshadow_runtime::device::cuda::NVRTC_OPTIONS;
use quantshadow_runtime::device::registry::COMPILE_OPTIONS;
use quantshadow_runtime::formats::Format;
use quantshadow_runtime::problem::{ScaleGranularity, ScaleSpec, ScaleStorage};
use quantshadow_runtime::rng::{hash3, SplitMix64};
use quantshadow_runtime::sketch::{probe_negative, RowPermutation};
use std::path::{Path, PathBuf};
use std::process::Command;

const ELEMENT: [Format; 11] = [
    Format::F32,
    Format::F16,
    Format::Bf16,
    Format::E4m3fn,
    Format::E4m3fnuz,
    Format::E5m2,
    Format::E5m2fnuz,
    Format::E2m1,
    Format::Int8,
    Format::Int4,
    Format::I32,
];

/// Every element format in every format slot of every source, plus the mixed pairs engines use
/// (the full cross product adds no code path: each slot's decoder is independent).
fn registry_specs() -> Vec<KernelBuild> {
    let mut out = vec![];
    for f in ELEMENT {
        out.push(KernelBuild::gemm_ref(f, f).unwrap());
        out.push(KernelBuild::sketch(f, f, f).unwrap());
        out.push(KernelBuild::compare(f).unwrap());
    }
    let mixed = [
        (Format::Bf16, Format::Int4, Format::Bf16),
        (Format::F16, Format::Int4, Format::F16),
        (Format::Bf16, Format::E2m1, Format::Bf16),
        (Format::E4m3fn, Format::E2m1, Format::Bf16),
        (Format::Bf16, Format::E4m3fn, Format::Bf16),
        (Format::E4m3fn, Format::E5m2, Format::F32),
        (Format::E4m3fn, Format::E4m3fn, Format::Bf16),
        (Format::E4m3fnuz, Format::E4m3fnuz, Format::Bf16),
        (Format::Int8, Format::Int8, Format::I32),
        (Format::E4m3fn, Format::E4m3fn, Format::E4m3fn),
    ];
    for (a, b, d) in mixed {
        out.push(KernelBuild::gemm_ref(a, b).unwrap());
        out.push(KernelBuild::sketch(a, b, d).unwrap());
    }
    out.push(KernelBuild::selftest());
    // Fault injection (qs_inject.cu): every D format of 8 bits or more.
    for d in ELEMENT.into_iter().filter(|f| f.bits() >= 8) {
        out.push(KernelBuild::inject(d).unwrap());
    }
    out
}

fn specs_json(builds: &[KernelBuild]) -> String {
    let list: Vec<serde_json::Value> = builds
        .iter()
        .map(|b| {
            serde_json::json!({
                "source": b.source.file_name(),
                "defines": b.defines.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>(),
                "entries": b.entries.iter().map(|e| e.name.clone()).collect::<Vec<_>>(),
                // The runtime's NVRTC options, so that the check compiles as the runtime does.
                "options": COMPILE_OPTIONS.iter().chain(NVRTC_OPTIONS).collect::<Vec<_>>(),
            })
        })
        .collect();
    serde_json::to_string_pretty(&list).unwrap()
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

#[test]
fn registry_sources_are_the_files_in_kernels() {
    // The registry embeds the sources with include_str!; they must be the files on disk.
    for b in registry_specs() {
        let on_disk =
            std::fs::read_to_string(repo_root().join("kernels").join(b.source.file_name())).unwrap();
        assert_eq!(on_disk, b.source.text(), "{} differs from the embedded copy", b.source.file_name());
    }
    for (name, text) in quantshadow_runtime::device::abi::HEADERS {
        assert_eq!(std::fs::read_to_string(repo_root().join("kernels").join(name)).unwrap(), text);
    }
}

/// The GPU host's NVRTC (13.0), where `.ci/run` unpacks the `nvidia-cuda-nvrtc` wheel of that
/// version. A kernel change once compiled with NVRTC 13.5 here and failed there (lambdas in
/// `__global__` functions before `-default-device`), so both are checked when both are present.
const GPU_HOST_NVRTC: &str = ".ci/cache/nvrtc-13.0/nvidia/cu13/lib/libnvrtc.so.13";

fn python3_present() -> bool {
    Command::new("python3").arg("--version").output().map(|o| o.status.success()).unwrap_or(false)
}

/// Runs kernels/check_compile.py over every registry specialisation with the NVRTC at `nvrtc`
/// for `archs`; panics with its log on any failure.
fn check_compile(nvrtc: &Path, archs: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let specs = dir.path().join("specs.json");
    std::fs::write(&specs, specs_json(&registry_specs())).unwrap();
    let jobs = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).clamp(1, 4);
    let mut cmd = Command::new("python3");
    cmd.arg(repo_root().join("kernels/check_compile.py"))
        .arg("--specs")
        .arg(&specs)
        .arg("--jobs")
        .arg(jobs.to_string())
        .env("QUANTSHADOW_NVRTC", nvrtc);
    for a in archs {
        cmd.arg("--arch").arg(a);
    }
    let out = cmd.output().expect("running kernels/check_compile.py");
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "kernel compile check with {} failed (log above)", nvrtc.display());
    assert!(text.contains(" 0 failed"));
}

#[test]
fn kernels_compile_with_nvrtc() {
    let nvrtc = std::env::var("QUANTSHADOW_NVRTC")
        .unwrap_or_else(|_| "/opt/nvrtc/nvidia/cu13/lib/libnvrtc.so.13".into());
    if !Path::new(&nvrtc).exists() {
        println!("NOTE: NVRTC not found at {nvrtc} (set QUANTSHADOW_NVRTC): kernel compile check skipped");
        return;
    }
    if !python3_present() {
        println!("NOTE: python3 not found: kernel compile check skipped");
        return;
    }
    check_compile(Path::new(&nvrtc), &["compute_90", "compute_80"]);
}

#[test]
fn kernels_compile_with_the_gpu_hosts_nvrtc() {
    let nvrtc = repo_root().join(GPU_HOST_NVRTC);
    if !nvrtc.exists() || !python3_present() {
        println!(
            "NOTE: {} (installed by .ci/run) or python3 missing: compile check with NVRTC 13.0 skipped",
            nvrtc.display()
        );
        return;
    }
    // The runtime compiles for the real architecture of the GPU it runs on (an H100 or H200).
    check_compile(&nvrtc, &["sm_90"]);
}

/// Values the encoders are probed with: every decoded code's value, the midpoints between
/// neighbouring codes (ties to even), values just off them, saturation, NaN/inf, signed zeros.
fn encode_inputs(f: Format) -> Vec<f64> {
    let mut v: Vec<f64> =
        vec![0.0, -0.0, f64::INFINITY, f64::NEG_INFINITY, f64::NAN, 1e30, -1e30, 1e-30, -1e-30];
    if f.bits() <= 8 {
        let mut vals: Vec<f64> =
            (0..1u32 << f.bits()).map(|c| f.decode_code(c)).filter(|x| x.is_finite()).collect();
        vals.sort_by(f64::total_cmp);
        vals.dedup();
        for w in vals.windows(2) {
            let mid = 0.5 * (w[0] + w[1]);
            v.extend([w[0], mid, mid * (1.0 + 1e-9), mid * (1.0 - 1e-9)]);
        }
        v.push(*vals.last().unwrap() * 1.5);
    } else {
        let mut r = SplitMix64::new(f as u64);
        for _ in 0..2000 {
            // f32-exact inputs: the device reference that gets rounded is f32.
            v.push((r.normal() * 10f64.powf(r.uniform(-8.0, 8.0))) as f32 as f64);
        }
        v.extend([
            65504.0,
            65520.0,
            65519.99,
            3.0e38,
            1.0 + 2f64.powi(-8),
            1.0 + 2f64.powi(-11),
            1.0 + 3.0 * 2f64.powi(-11),
        ]);
        // Just above a tie by the last f32 bit: where rounding after dropping bits goes wrong.
        v.extend([1.0 + 2f64.powi(-8) + 2f64.powi(-23), 1.0 + 2f64.powi(-11) + 2f64.powi(-23)]);
        // The device reference that gets rounded is f32.
        v.iter_mut().for_each(|x| *x = *x as f32 as f64);
    }
    v
}

/// Expected device encoding. 16-bit floats: IEEE round-to-nearest-even of the (f32-exact)
/// input, as `cvt.rn` does; formats.rs goes through half's f64 path, which for bf16 rounds
/// after dropping the low 32 mantissa bits (1 + 2^-8 + 2^-23 gives 0x3f80 there, 0x3f81 here).
/// Everything else: formats.rs `encode`.
fn expected_code(f: Format, v: f64) -> u32 {
    match f {
        Format::F16 => half::f16::from_f32(v as f32).to_bits() as u32,
        Format::Bf16 => half::bf16::from_f32(v as f32).to_bits() as u32,
        _ => f.encode(v),
    }
}

#[test]
fn golden_values_for_the_device_selftest() {
    use serde_json::json;
    let all_formats = Format::ALL;
    let mut decode = serde_json::Map::new();
    let mut encode = serde_json::Map::new();
    for f in all_formats {
        // Every code of the <= 16-bit formats; a spread of codes (specials included) for 32-bit.
        let codes: Vec<u32> = if f.bits() <= 16 {
            (0..1u32 << f.bits()).collect()
        } else {
            let mut r = SplitMix64::new(3);
            let mut c: Vec<u32> = (0..4096).map(|_| r.next_u64() as u32).collect();
            c.extend([
                0,
                0x8000_0000,
                0x7F80_0000,
                0xFF80_0000,
                0x7FC0_0000,
                0x0000_0001,
                0x0100_0001,
                0x7FFF_FFFF,
            ]);
            c
        };
        // Host invariant the device decoder relies on: every value is exactly an f32 except
        // I32 beyond 2^24.
        for &c in &codes {
            let v = f.decode_code(c);
            if f != Format::I32 && !v.is_nan() {
                assert_eq!(v as f32 as f64, v, "{f} code {c:#x} is not f32-exact");
            }
        }
        let bits: Vec<String> =
            codes.iter().map(|&c| format!("{:016x}", f.decode_code(c).to_bits())).collect();
        decode.insert(f.name().into(), json!({ "codes": codes, "f64_bits": bits }));
        // formats.rs round-trips the value of every finite code of the minifloats (the device's
        // binary search must return codes of the same values).
        if !f.is_integer() && f.bits() <= 8 {
            for c in 0..1u32 << f.bits() {
                let v = f.decode_code(c);
                if v.is_finite() {
                    assert_eq!(f.decode_code(f.encode(v)), v, "{f}: code {c:#x} does not round-trip");
                }
            }
        }
        let inputs = encode_inputs(f);
        let inputs_bits: Vec<String> = inputs.iter().map(|v| format!("{:016x}", v.to_bits())).collect();
        let codes: Vec<u32> = inputs.iter().map(|&v| expected_code(f, v)).collect();
        encode.insert(f.name().into(), json!({ "inputs_f64_bits": inputs_bits, "codes": codes }));
    }
    // hash3, probe signs, permutation rows.
    let seeds = [0u64, 1, 0x1234_5678_9abc_def0, u64::MAX];
    let idx: Vec<u64> = (0..64).chain([1000, 4095, 4096, 1 << 20, (1 << 40) + 3, u64::MAX]).collect();
    let mut hashes = vec![];
    for &seed in &seeds {
        for stream in [0u64, 5, 31, 0x5153_5F50_4552_4D00] {
            let perm = RowPermutation::new(seed, 4099);
            hashes.push(json!({
                "seed": seed.to_string(), "stream": stream.to_string(),
                "perm_a": perm.a, "perm_b": perm.b, "total": 4099, "stride": 256, "epoch": 7,
                "index": idx.iter().map(|i| i.to_string()).collect::<Vec<_>>(),
                "hash": idx.iter().map(|&i| hash3(seed, stream, i).to_string()).collect::<Vec<_>>(),
                "negative": idx.iter().map(|&i| probe_negative(seed, (stream & 0xFFFF_FFFF) as u32, i) as u32).collect::<Vec<_>>(),
                "perm_row": idx.iter().map(|&i| perm.sample_row(256, 7, i)).collect::<Vec<_>>(),
            }));
        }
    }
    // Scale entries for every storage, through the same descriptor builder the runtime uses.
    let mut scales = vec![];
    let specs = [
        (ScaleSpec::new(ScaleGranularity::Block { outer: 1, inner: 128 }, Format::F32), 300u64, 1000u64),
        (
            ScaleSpec::new(ScaleGranularity::Block { outer: 128, inner: 128 }, Format::F32)
                .with_storage(ScaleStorage::InnerMajor),
            300,
            1000,
        ),
        (
            ScaleSpec::new(ScaleGranularity::Mx32, Format::Ue8m0).with_storage(ScaleStorage::Swizzled128x4),
            300,
            1000,
        ),
        (
            ScaleSpec::new(ScaleGranularity::Nvfp4, Format::Ue4m3).with_storage(ScaleStorage::Swizzled128x4),
            257,
            4096,
        ),
        (
            ScaleSpec {
                batch_stride: 5000,
                ld: 9,
                ..ScaleSpec::new(ScaleGranularity::PerOuter, Format::Bf16)
            },
            64,
            64,
        ),
    ];
    for (spec, outer, inner) in specs {
        let d = QsScaleDesc::from_spec(&spec, 0x100, outer, inner, 2).unwrap();
        let mut r = SplitMix64::new(outer ^ inner);
        let pts: Vec<[u64; 3]> = (0..512).map(|_| [r.below(2), r.below(outer), r.below(inner)]).collect();
        let entries: Vec<u64> =
            pts.iter().map(|p| spec.entry_for_element(p[0], p[1], p[2], outer, inner)).collect();
        for (p, e) in pts.iter().zip(&entries) {
            assert_eq!(d.entry(p[0], p[1], p[2]), *e);
            assert!(*e < d.extent);
        }
        scales.push(json!({
            "desc": { "ld": d.ld, "batch_stride": d.batch_stride, "extent": d.extent, "format": d.format,
                      "storage": d.storage, "granularity": d.granularity, "block_outer": d.block_outer,
                      "block_inner": d.block_inner, "grid_outer": d.grid_outer, "grid_inner": d.grid_inner },
            "points": pts, "entries": entries,
        }));
    }
    let golden = json!({ "decode": decode, "encode": encode, "hash": hashes, "scale": scales });
    if let Ok(path) = std::env::var("QUANTSHADOW_GOLDEN_OUT") {
        std::fs::write(&path, serde_json::to_vec(&golden).unwrap()).unwrap();
        println!("golden values written to {path}");
    }
}
