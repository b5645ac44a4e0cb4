//! Launch interception end to end on the CPU: `fixture_launch_app` loads the fixture driver
//! RTLD_LOCAL and resolves every entry point with dlsym(handle) (and cuLaunchKernel once more
//! through cuGetProcAddress_v2), as Triton and JAX do, under the real libquantshadow.so. The
//! `dlsym` override must hand out our wrappers for hooked names and nothing else, results must
//! not change, the kernel listing must count every launch, and with kernel specs the launches
//! of GEMM kernels are checked like BLAS calls.

use quantshadow_cli::collect::Collector;
use quantshadow_cli::report::{self, load_run_file, Verdict};
use quantshadow_runtime::record::{ClosingRecord, GemmObservation, Record};
use quantshadow_runtime::specs::{KernelListing, KernelStat};
use quantshadow_runtime::transport::Address;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const APP: &str = env!("QUANTSHADOW_FIXTURE_LAUNCH_APP");

/// libquantshadow.so built beside this test.
fn shim() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let p = exe.parent().unwrap().join("libquantshadow.so");
    assert!(p.is_file(), "{} missing: build with cargo test", p.display());
    p
}

fn specs_dir(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name).display().to_string()
}

fn app(scenario: &str, env: &[(&str, &str)], preload: bool) -> Output {
    let mut cmd = Command::new(APP);
    cmd.arg(scenario).env_remove("LD_PRELOAD");
    for (k, _) in std::env::vars() {
        if k.starts_with("QUANTSHADOW_") || k.starts_with("FIXTURE_") {
            cmd.env_remove(k);
        }
    }
    if preload {
        cmd.env("LD_PRELOAD", shim());
    }
    cmd.envs(env.iter().copied());
    let out = cmd.output().expect("fixture_launch_app runs");
    assert!(
        out.status.success(),
        "fixture_launch_app {scenario} failed: {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        stdout(&out),
        stderr(&out)
    );
    out
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The `key: value` lines of the dlsym scenario.
fn lines(o: &Output) -> Vec<(String, String)> {
    stdout(o)
        .lines()
        .filter_map(|l| l.split_once(": ").map(|(k, v)| (k.to_string(), v.to_string())))
        .collect()
}

fn value<'a>(lines: &'a [(String, String)], key: &str) -> &'a str {
    lines.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str()).unwrap_or_else(|| panic!("no line {key}"))
}

fn listing(path: &Path) -> KernelListing {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn kernel<'a>(l: &'a KernelListing, name: &str) -> &'a KernelStat {
    l.kernels.iter().find(|k| k.name == name).unwrap_or_else(|| panic!("{name} not listed: {l:?}"))
}

#[test]
fn dlsym_hands_out_wrappers_for_hooked_names_only() {
    let plain = lines(&app("dlsym", &[], false));
    let shim = lines(&app("dlsym", &[], true));
    let fixture = "libfixture_launch.so";
    let ours = "libquantshadow.so";
    for key in [
        "dlsym cuLaunchKernel",
        "dlsym cuLaunchKernelEx",
        "dlsym cuGetProcAddress_v2",
        "proc cuLaunchKernel",
        "proc cuLaunchKernel per-thread",
    ] {
        assert_eq!(value(&plain, key), fixture, "{key} without the shim");
        assert_eq!(value(&shim, key), ours, "{key}: a hooked name must reach our wrapper");
    }
    for key in ["dlsym cuFuncGetName", "dlsym fixture_launch_get_function"] {
        assert_eq!(value(&shim, key), fixture, "{key}: not hooked, passed through");
    }
    // RTLD_NEXT is answered for the real caller. From the program (loaded before us), the
    // next definition of dlsym and cuLaunchKernel is ours, as glibc itself would answer.
    assert_eq!(value(&plain, "next from program dlsym"), "libc.so.6");
    assert_eq!(value(&shim, "next from program dlsym"), ours);
    assert_eq!(value(&shim, "next from program cuLaunchKernel"), ours);
    assert_eq!(value(&plain, "next from program cuLaunchKernel"), "NULL");
    // From the library (loaded RTLD_LOCAL after us), the answers are the same as without us.
    for key in ["next from program getpid", "next from library getpid", "next from library cuLaunchKernel"] {
        assert_eq!(value(&shim, key), value(&plain, key), "{key}");
    }
    assert_eq!(value(&shim, "next from library getpid"), "libc.so.6");
    assert_eq!(value(&shim, "next from library fixture_launch_next"), "NULL");
    // The wrappers forward to the function that was asked for: the per-thread lookup still
    // reaches cuLaunchKernel_ptsz (once), and the results are the same.
    assert_eq!(value(&shim, "per-thread launches"), "1");
    // Lookups in a constructor, under the loader's lock: RTLD_DEFAULT sees the global scope
    // first, where our preloaded export is (glibc's own answer); RTLD_NEXT finds nothing after
    // the library, with or without us.
    assert_eq!(value(&plain, "constructor default cuLaunchKernel"), fixture);
    assert_eq!(value(&shim, "constructor default cuLaunchKernel"), ours);
    assert_eq!(value(&plain, "constructor next cuLaunchKernel"), "NULL");
    assert_eq!(value(&shim, "constructor next cuLaunchKernel"), "NULL");
    for key in ["elementwise 0", "elementwise 1", "elementwise 2"] {
        assert_eq!(value(&shim, key), value(&plain, key), "{key}");
    }
}

#[test]
fn results_are_unchanged_and_the_listing_counts_every_launch() {
    let plain = app("all", &[], false);
    let dir = tempfile::tempdir().unwrap();
    let out_path = dir.path().join("kernels-{pid}.json");
    let out = app("all", &[("QUANTSHADOW_KERNELS_OUT", out_path.to_str().unwrap())], true);
    assert_eq!(stdout(&out), stdout(&plain), "results changed under the shim");
    assert!(stderr(&out).is_empty(), "{}", stderr(&out));

    let files: Vec<PathBuf> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let name = files[0].file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.starts_with("kernels-") && !name.contains("{pid}"), "{{pid}} replaced: {name}");
    let l = listing(&files[0]);
    assert_eq!(l.kernels.len(), 4, "{l:?}");

    let bf16 = kernel(&l, "qs_fixture_gemm_bf16");
    assert_eq!(bf16.entry, "cuLaunchKernel");
    assert_eq!(bf16.calls, 5, "3 direct, 1 through cuGetProcAddress, 1 per-thread");
    assert_eq!((bf16.grid, bf16.block, bf16.shapes), ([2, 1, 1], [16, 16, 1], 2));
    assert_eq!(bf16.param_sizes.as_deref(), Some(&[8, 8, 8, 4, 4, 4, 8, 8, 8, 4][..]));
    assert_eq!(bf16.packed_bytes, None);

    let fp8 = kernel(&l, "qs_fixture_fp8_blockscale");
    assert_eq!((fp8.entry.as_str(), fp8.calls, fp8.shapes), ("cuLaunchKernelEx", 2, 1));
    assert_eq!((fp8.grid, fp8.block), ([2, 1, 1], [128, 1, 1]));
    assert_eq!(fp8.param_sizes.as_deref(), Some(&[8, 8, 8, 8, 8, 4, 4, 4, 4, 4, 4, 4, 4, 4][..]));

    let packed = kernel(&l, "qs_fixture_a8w8_packed");
    assert_eq!((packed.calls, packed.packed_bytes), (2, Some(176)));
    assert_eq!(packed.param_sizes.as_deref(), Some(&[176][..]));

    let ew = kernel(&l, "qs_fixture_elementwise");
    assert_eq!((ew.calls, ew.shapes), (10, 1));
    assert_eq!(ew.param_sizes.as_deref(), Some(&[8, 8, 4][..]));
    // No specs loaded: nothing matched.
    assert!(l.kernels.iter().all(|k| k.spec.is_none()));
    // Most launched first.
    assert_eq!(l.kernels[0].name, "qs_fixture_elementwise");
}

#[test]
fn hip_launches_are_interposed_named_and_listed() {
    let plain = app("hip", &[], false);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("k.json");
    let out = app("hip", &[("QUANTSHADOW_KERNELS_OUT", path.to_str().unwrap())], true);
    let (p, s) = (lines(&plain), lines(&out));
    for key in ["dlsym hipModuleLaunchKernel", "dlsym hipExtModuleLaunchKernel"] {
        assert_eq!(value(&p, key), "libfixture_launch.so");
        assert_eq!(value(&s, key), "libquantshadow.so", "{key}");
    }
    let results = |l: &[(String, String)]| {
        l.iter().filter(|(k, _)| !k.starts_with("dlsym")).cloned().collect::<Vec<_>>()
    };
    assert_eq!(results(&s), results(&p), "results changed under the shim");
    let l = listing(&path);
    assert_eq!(l.kernels.len(), 2, "{l:?}");
    // Named through hipKernelNameRef; HIP reports no parameter sizes.
    let packed = kernel(&l, "qs_fixture_a8w8_packed");
    assert_eq!(packed.entry, "hipModuleLaunchKernel");
    assert_eq!((packed.calls, packed.packed_bytes, packed.param_sizes.clone()), (2, Some(176), None));
    // hipExtModuleLaunchKernel takes work-items: 128 global / 64 local = a grid of 2.
    let ew = kernel(&l, "qs_fixture_elementwise");
    assert_eq!(ew.entry, "hipExtModuleLaunchKernel");
    assert_eq!((ew.calls, ew.grid, ew.block), (3, [2, 1, 1], [64, 1, 1]));
}

#[test]
fn many_launches_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("k.json");
    app("many", &[("QUANTSHADOW_KERNELS_OUT", path.to_str().unwrap())], true);
    let l = listing(&path);
    assert_eq!(kernel(&l, "qs_fixture_elementwise").calls, 1000);
    assert_eq!(kernel(&l, "qs_fixture_gemm_bf16").calls, 100);
}

#[test]
fn concurrent_first_launches_share_one_entry_per_kernel() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("k.json");
    let out = app("threads", &[("QUANTSHADOW_KERNELS_OUT", path.to_str().unwrap())], true);
    assert_eq!(stdout(&out), "threads: ok\n");
    let l = listing(&path);
    assert_eq!(l.kernels.len(), 2, "{l:?}");
    assert_eq!(kernel(&l, "qs_fixture_elementwise").calls, 800);
    assert_eq!(kernel(&l, "qs_fixture_gemm_bf16").calls, 200);
}

#[test]
fn unspecced_launches_start_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("never.qsr");
    let address = format!("file:{}", run.display());
    let plain = app("all", &[], false);
    let out = app("all", &[("QUANTSHADOW_COLLECTOR", &address), ("QUANTSHADOW_LOG", "debug")], true);
    assert_eq!(stdout(&out), stdout(&plain));
    assert!(out.stderr.is_empty(), "no log line: {}", stderr(&out));
    assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none(), "no file");
}

#[test]
fn no_launch_no_listing_and_mode_off_is_inert() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("k.json");
    let p = path.to_str().unwrap();
    // Loads and resolves through the hooks, launches nothing.
    app("none", &[("QUANTSHADOW_KERNELS_OUT", p)], true);
    let sh = Command::new("/bin/sh")
        .args(["-c", "echo hello"])
        .env("LD_PRELOAD", shim())
        .env("QUANTSHADOW_KERNELS_OUT", p)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&sh.stdout), "hello\n");
    // Launches, but the shim is off.
    let plain = app("all", &[], false);
    let off = app("all", &[("QUANTSHADOW_KERNELS_OUT", p), ("QUANTSHADOW_MODE", "off")], true);
    assert_eq!(stdout(&off), stdout(&plain));
    assert!(!path.exists(), "no listing written");
}

// ---- With kernel specs (the spec engine decodes the launches) ----------------------------

/// Runs a scenario with specs under the shim and a real collector (host device).
fn checked_run(dir: &Path, scenario: &str, env: &[(&str, &str)]) -> (Output, Vec<Record>) {
    let sock = dir.join("c.sock");
    let run = dir.join("run.qsr");
    let collector = Collector::start(&Address::Unix(sock.clone()), &run).unwrap();
    let address = format!("unix:{}", sock.display());
    let mut all: Vec<(&str, &str)> =
        vec![("QUANTSHADOW_COLLECTOR", &address), ("QUANTSHADOW_DEVICE", "host")];
    all.extend_from_slice(env);
    let out = app(scenario, &all, true);
    collector.shutdown();
    (out, load_run_file(&run).unwrap().records)
}

fn observations(records: &[Record]) -> Vec<&GemmObservation> {
    records
        .iter()
        .filter_map(|r| match r {
            Record::Observation(o) => Some(o),
            _ => None,
        })
        .collect()
}

fn closing(records: &[Record]) -> &ClosingRecord {
    let c: Vec<_> = records
        .iter()
        .filter_map(|r| match r {
            Record::Closing(c) => Some(c),
            _ => None,
        })
        .collect();
    assert_eq!(c.len(), 1, "one closing record");
    c[0]
}

fn report_of(dir: &Path) -> report::Report {
    report::run(&report::Args {
        files: vec![dir.join("run.qsr")],
        out: Some(dir.join("report.md")),
        json: None,
        thresholds: None,
    })
    .unwrap()
}

/// The 9 GEMM launches of "all" (5 bf16, 2 FP8 block-scale, 2 packed A8W8).
const GEMM_LAUNCHES: u64 = 9;

#[test]
fn specced_launches_are_checked_and_pass() {
    let specs = specs_dir("specs");
    let dir = tempfile::tempdir().unwrap();
    let listing_path = dir.path().join("k.json");
    let plain = app("all", &[], false);
    let (out, records) = checked_run(
        dir.path(),
        "all",
        &[("QUANTSHADOW_SPECS", &specs), ("QUANTSHADOW_KERNELS_OUT", listing_path.to_str().unwrap())],
    );
    assert_eq!(stdout(&out), stdout(&plain), "results changed under the shim");
    let c = closing(&records);
    assert_eq!(c.calls_seen, GEMM_LAUNCHES, "the elementwise kernel has no spec: {:?}", c.skipped);
    assert_eq!(c.checked, GEMM_LAUNCHES, "skipped {:?}", c.skipped);
    let obs = observations(&records);
    assert_eq!(obs.len() as u64, GEMM_LAUNCHES);
    for o in &obs {
        assert!(o.entry_point.starts_with("cuLaunchKernel"), "{}", o.entry_point);
        let name = o.site_name.as_deref().unwrap_or("");
        assert!(name.starts_with("qs_fixture_"), "sites are named after the kernel: {name:?}");
    }
    let r = report_of(dir.path());
    assert_eq!(
        r.verdict,
        Verdict::Pass,
        "{}",
        std::fs::read_to_string(dir.path().join("report.md")).unwrap()
    );
    let l = listing(&listing_path);
    for k in &l.kernels {
        assert_eq!(k.spec.is_some(), k.name != "qs_fixture_elementwise", "{k:?}");
    }
}

#[test]
fn sampling_one_in_n_reaches_every_layer_sharing_a_kernel() {
    // Four layers launch one kernel with one grid, each on its own weight. Sampled 1/4 per
    // site, each layer is checked (its first call and every 4th after): one counter for the
    // kernel and grid would check layer 0 alone.
    let specs = specs_dir("specs");
    let dir = tempfile::tempdir().unwrap();
    let plain = app("layers", &[], false);
    let (out, records) =
        checked_run(dir.path(), "layers", &[("QUANTSHADOW_SPECS", &specs), ("QUANTSHADOW_SAMPLE", "1/4")]);
    assert_eq!(stdout(&out), stdout(&plain), "results changed under the shim");
    let c = closing(&records);
    assert_eq!(c.calls_seen, 40);
    let sites: std::collections::BTreeSet<u64> = observations(&records).iter().map(|o| o.site_id).collect();
    assert_eq!(sites.len(), 4, "every layer checked: {sites:?}, skipped {:?}", c.skipped);
    assert_eq!(c.checked, 12, "calls 0, 4 and 8 of each layer's 10: {:?}", c.skipped);
}

#[test]
fn a_planted_scale_layout_fault_fails_exactly_its_launch() {
    let specs = specs_dir("specs");
    // Launch 6: the second FP8 block-scale launch; launch 8: the second packed A8W8 one.
    for fault in ["6:scale_t", "8:scale_t"] {
        let dir = tempfile::tempdir().unwrap();
        let (_, records) =
            checked_run(dir.path(), "all", &[("QUANTSHADOW_SPECS", &specs), ("FIXTURE_LAUNCH_FAULT", fault)]);
        let r = report_of(dir.path());
        assert_eq!(r.verdict, Verdict::Fail, "{fault}");
        let th = quantshadow_runtime::thresholds::Thresholds::default();
        let failing: Vec<u64> = observations(&records)
            .iter()
            .filter(|o| !th.judge(o.problem.class(), o.metrics.as_ref().unwrap()).is_empty())
            .map(|o| o.call_seq)
            .collect();
        let at: u64 = fault.split(':').next().unwrap().parse().unwrap();
        assert_eq!(failing, vec![at], "{fault}: only the planted launch fails");
    }
}

#[test]
fn a_spec_that_does_not_fit_disables_itself_with_one_line_and_a_counted_skip() {
    let specs = specs_dir("specs_bad");
    let dir = tempfile::tempdir().unwrap();
    let plain = app("all", &[], false);
    let (out, records) = checked_run(dir.path(), "all", &[("QUANTSHADOW_SPECS", &specs)]);
    assert_eq!(stdout(&out), stdout(&plain), "results changed under the shim");
    let err = stderr(&out);
    assert_eq!(err.lines().filter(|l| l.contains("disabled")).count(), 1, "one log line: {err}");
    let c = closing(&records);
    let skip: Vec<_> = c.skipped.iter().filter(|s| s.reason.contains("spec disabled")).collect();
    assert_eq!(skip.len(), 1, "{:?}", c.skipped);
    assert_eq!(skip[0].count, 1, "the spec is used once, then never again: {:?}", c.skipped);
    assert_eq!(c.checked, 0);
}

#[test]
fn a_kernel_handle_reused_after_a_module_unload_is_named_again() {
    // The gemm_bf16 spec must not follow its handle to the next module's elementwise kernel:
    // decoding three arguments as the GEMM's ten would read past the caller's argument array.
    let specs = specs_dir("specs");
    let dir = tempfile::tempdir().unwrap();
    let listing_path = dir.path().join("k.json");
    let plain = app("reload", &[], false);
    assert!(stdout(&plain).contains("same handle: yes"), "{}", stdout(&plain));
    let (out, records) = checked_run(
        dir.path(),
        "reload",
        &[("QUANTSHADOW_SPECS", &specs), ("QUANTSHADOW_KERNELS_OUT", listing_path.to_str().unwrap())],
    );
    let shim_lines = lines(&out);
    assert_eq!(value(&shim_lines, "proc cuModuleUnload"), "libquantshadow.so", "the unload reaches our hook");
    let results = |o: &Output| {
        stdout(o).lines().filter(|l| !l.starts_with("proc ")).map(String::from).collect::<Vec<_>>()
    };
    assert_eq!(results(&out), results(&plain), "results changed under the shim");
    let c = closing(&records);
    assert_eq!((c.calls_seen, c.checked), (1, 1), "only the GEMM launch is a GEMM: {:?}", c.skipped);
    let l = listing(&listing_path);
    assert_eq!(kernel(&l, "qs_fixture_gemm_bf16").calls, 1, "{l:?}");
    let ew = kernel(&l, "qs_fixture_elementwise");
    assert_eq!((ew.calls, ew.spec.is_some()), (2, false), "{l:?}");
}
