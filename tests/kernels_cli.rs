//! `quantshadow kernels --from FILE.json`: the table, `--suggest`, and errors for bad listings.

use std::path::Path;
use std::process::{Command, Output};

const LISTING: &str = r#"{
  "kernels": [
    {"name": "qs_fixture_elementwise", "entry": "cuLaunchKernel", "calls": 40,
     "grid": [64,1,1], "block": [256,1,1], "shapes": 1,
     "param_sizes": [8,8,4], "packed_bytes": null, "spec": null},
    {"name": "qs_fixture_gemm_bf16", "entry": "cuLaunchKernelEx", "calls": 7,
     "grid": [4,2,1], "block": [128,1,1], "shapes": 3,
     "param_sizes": [8,8,8,4,4,4,8,8,8,4], "packed_bytes": null,
     "spec": "tests/fixtures/specs/fixtures.toml [qs_fixture_gemm_bf16]"},
    {"name": "_ZN5aiter17gemm_a8w8_bf16_asmE", "entry": "hipModuleLaunchKernel", "calls": 12,
     "grid": [8,8,1], "block": [256,1,1], "shapes": 1,
     "param_sizes": null, "packed_bytes": 208, "spec": null},
    {"name": "my_fp8_matmul_kernel", "entry": "cuLaunchKernel", "calls": 12,
     "grid": [16,1,1], "block": [128,1,1], "shapes": 1,
     "param_sizes": [8,8,8,8,8,4,4,4], "packed_bytes": null, "spec": null}
  ]
}"#;

fn kernels(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_quantshadow"))
        .arg("kernels")
        .args(args)
        .output()
        .expect("the binary runs")
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_string()
}

#[test]
fn table_is_sorted_by_calls_and_shows_launch_shapes() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "kernels.json", LISTING);
    let out = kernels(&["--from", &file]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].contains("calls") && lines[0].contains("kernel"), "{text}");
    // 40 calls first; the two 12-call kernels by name; 7 last.
    assert!(lines[1].ends_with("qs_fixture_elementwise"), "{text}");
    assert!(lines[2].ends_with("_ZN5aiter17gemm_a8w8_bf16_asmE"), "{text}");
    assert!(lines[3].ends_with("my_fp8_matmul_kernel"), "{text}");
    assert!(lines[4].ends_with("qs_fixture_gemm_bf16"), "{text}");
    assert!(
        lines[1].contains("64x1x1") && lines[1].contains("256x1x1") && lines[1].contains("3 params [8,8,4]")
    );
    assert!(lines[2].contains("packed 208 B") && lines[2].contains("hipModuleLaunchKernel"));
    assert!(lines[4].contains("4x2x1 (+2)") && lines[4].contains("fixtures.toml [qs_fixture_gemm_bf16]"));
    assert!(text.contains("4 kernels, 71 launches, 1 matched a spec"), "{text}");
    assert!(!text.contains("[[kernel]]"), "no skeletons without --suggest");
}

#[test]
fn suggest_prints_skeletons_for_unmatched_gemm_kernels_only() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "kernels.json", LISTING);
    let out = kernels(&["--suggest", "--from", &file]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.matches("[[kernel]]").count(), 2, "{text}");
    assert!(text.contains("name = \"my_fp8_matmul_kernel\""), "{text}");
    assert!(text.contains("name = \"_ZN5aiter17gemm_a8w8_bf16_asmE\""), "{text}");
    assert!(text.contains("packed_bytes = 208"), "{text}");
    assert!(!text.contains("name = \"qs_fixture_elementwise\""), "not a GEMM");
    assert!(!text.contains("name = \"qs_fixture_gemm_bf16\""), "already has a spec");
    assert!(text.contains("params = 8") && text.contains("format = \"e4m3fn\""), "{text}");
    assert!(text.contains("[kernel.a_scale]"), "fp8 kernels get a scale hint: {text}");
}

#[test]
fn bad_listings_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let truncated = write(dir.path(), "truncated.json", &LISTING[..LISTING.len() / 2]);
    let malformed = write(dir.path(), "malformed.json", "{\"kernels\": [{\"name\": 3}]}");
    let empty = write(dir.path(), "empty.json", "");
    let missing = dir.path().join("missing.json").to_str().unwrap().to_string();
    for (file, want) in [
        (truncated, "truncated kernel listing"),
        (malformed, "malformed kernel listing"),
        (empty, "empty kernel listing"),
        (missing, "no kernel listing"),
    ] {
        let out = kernels(&["--from", &file]);
        assert_eq!(out.status.code(), Some(2), "{file}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want) && err.contains(&file), "{file}: {err}");
        assert!(out.stdout.is_empty());
    }
}

#[test]
fn usage_errors() {
    let out = kernels(&[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--from"));
    let out = kernels(&["--from", "x.json", "--", "true"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn empty_listing_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "kernels.json", "{\"kernels\": []}");
    let out = kernels(&["--suggest", "--from", &file]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("no kernel launches were seen") && text.contains("nothing to suggest"), "{text}");
}

/// Running a program that never loads a GPU library: the shim writes no listing unless it
/// implements the observe-mode listing, so only the plumbing (exit code, clear message) is
/// checked here; the launch e2e tests cover the listing itself.
#[test]
fn a_failing_program_keeps_its_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let shim = dir.path().join("libfake.so");
    std::fs::write(&shim, b"").unwrap();
    // An empty file as the shim: the loader ignores an unloadable LD_PRELOAD with a warning.
    let out = kernels(&[
        "--shim",
        shim.to_str().unwrap(),
        "--out",
        dir.path().join("out").to_str().unwrap(),
        "--",
        "sh",
        "-c",
        "exit 3",
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no kernel listing"));
}
