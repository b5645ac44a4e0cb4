//! Builds the C test fixtures (tests/fixtures/): the fake vendor BLAS core, compiled once into
//! position-independent objects that become
//! - a static library linked into this package, for the safe wrapper `cli/src/fixture.rs`;
//! - `libfixture_blas.so` in OUT_DIR, whose path is exported as `QUANTSHADOW_FIXTURE_BLAS`
//!   so tests and host programs can dlopen the same code as a stand-alone vendor library;
//! - `libfixture_vendor.so` (cuBLASLt/cuBLAS/hipBLASLt-shaped symbols over the core,
//!   `QUANTSHADOW_FIXTURE_VENDOR`), `libfixture_app.so` (a small "model" with DT_NEEDED on it,
//!   `QUANTSHADOW_FIXTURE_APP`) and the executable `fixture_host` that dlopens the app
//!   RTLD_LOCAL like a Python extension module (`QUANTSHADOW_FIXTURE_HOST`). All four sit in
//!   OUT_DIR and find each other through RUNPATH $ORIGIN.
//! - `libfixture_launch.so`, a fake CUDA driver whose kernels run on the host
//!   (`QUANTSHADOW_FIXTURE_LAUNCH`), and `fixture_launch_app`, which dlopens it RTLD_LOCAL and
//!   resolves everything with dlsym(handle) (`QUANTSHADOW_FIXTURE_LAUNCH_APP`).
//! - `libfixture_tracer.so`, another interposer of `cublasSgemm_v2` that forwards with
//!   dlsym(RTLD_NEXT), preloaded beside the shim (`QUANTSHADOW_FIXTURE_TRACER`).
//!
//! The C code is built with warnings as errors so a C mistake fails CI instead of scrolling by.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const FIXTURE_DIR: &str = "tests/fixtures";
/// Sources of the core, shared by the static and the shared library.
const CORE_SOURCES: &[&str] = &["tests/fixtures/fixture_blas_core.c"];
/// Headers the sources include (listed so that editing one rebuilds).
const CORE_HEADERS: &[&str] = &["tests/fixtures/fixture_blas_core.h"];
const SHARED_LIBRARY: &str = "libfixture_blas.so";
/// The vendor-shaped library, the app library and the host program (Linux only).
const VENDOR_SOURCES: &[&str] = &["tests/fixtures/fixture_vendor.c"];
const APP_SOURCES: &[&str] = &["tests/fixtures/fixture_app.c"];
const HOST_SOURCES: &[&str] = &["tests/fixtures/fixture_host.c"];
const VENDOR_HEADERS: &[&str] = &["tests/fixtures/fixture_vendor.h"];
const VENDOR_LIBRARY: &str = "libfixture_vendor.so";
const APP_LIBRARY: &str = "libfixture_app.so";
const HOST_PROGRAM: &str = "fixture_host";
const LAUNCH_SOURCES: &[&str] = &["tests/fixtures/fixture_launch.c"];
const LAUNCH_APP_SOURCES: &[&str] = &["tests/fixtures/fixture_launch_app.c"];
const LAUNCH_HEADERS: &[&str] = &["tests/fixtures/fixture_launch.h"];
const LAUNCH_LIBRARY: &str = "libfixture_launch.so";
const LAUNCH_PROGRAM: &str = "fixture_launch_app";
const TRACER_SOURCES: &[&str] = &["tests/fixtures/fixture_tracer.c"];
const TRACER_LIBRARY: &str = "libfixture_tracer.so";
/// Warnings added when the compiler knows them.
const OPTIONAL_WARNINGS: &[&str] =
    &["-Wpedantic", "-Wshadow", "-Wstrict-prototypes", "-Wmissing-prototypes", "-Wcast-qual"];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    for path in CORE_SOURCES.iter().chain(CORE_HEADERS).chain(VENDOR_SOURCES).chain(APP_SOURCES) {
        println!("cargo:rerun-if-changed={path}");
    }
    for path in HOST_SOURCES
        .iter()
        .chain(VENDOR_HEADERS)
        .chain(LAUNCH_SOURCES)
        .chain(LAUNCH_APP_SOURCES)
        .chain(LAUNCH_HEADERS)
        .chain(TRACER_SOURCES)
    {
        println!("cargo:rerun-if-changed={path}");
    }

    // Probe the optional warnings once (each probe runs the compiler).
    let probe = c_build(CORE_SOURCES, &[]);
    let warnings: Vec<&str> = OPTIONAL_WARNINGS
        .iter()
        .copied()
        .filter(|flag| probe.is_flag_supported(flag).unwrap_or(false))
        .collect();
    let mut build = c_build(CORE_SOURCES, &warnings);
    let objects = build.compile_intermediates();
    let archive = build.create_archive("fixture_blas_core", &objects);
    cc::emit_link_directives(&build, &archive);
    // tanh and sqrt; std links libm on Linux already, but the archive should not rely on it.
    println!("cargo:rustc-link-lib=m");

    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let shared = out_dir.join(SHARED_LIBRARY);
    if env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("linux") {
        // The shared libraries are LD_PRELOAD test vehicles: Linux only. Empty = not built.
        println!("cargo:warning=the fixture shared libraries are only built for Linux targets");
        for var in ["BLAS", "VENDOR", "APP", "HOST", "LAUNCH", "LAUNCH_APP", "TRACER"] {
            println!("cargo:rustc-env=QUANTSHADOW_FIXTURE_{var}=");
        }
        return;
    }
    link(&build, &objects, &shared, &shared_args(SHARED_LIBRARY), &["-lm"]);
    println!("cargo:rustc-env=QUANTSHADOW_FIXTURE_BLAS={}", shared.display());

    // The vendor library carries its own copy of the core (no DT_NEEDED on libfixture_blas).
    build = c_build(VENDOR_SOURCES, &warnings);
    let mut vendor_objects = build.compile_intermediates();
    vendor_objects.extend(objects.iter().cloned());
    let vendor = out_dir.join(VENDOR_LIBRARY);
    link(&build, &vendor_objects, &vendor, &shared_args(VENDOR_LIBRARY), &["-lm", "-lpthread", "-ldl"]);
    println!("cargo:rustc-env=QUANTSHADOW_FIXTURE_VENDOR={}", vendor.display());

    // The app calls the vendor symbols through its PLT (DT_NEEDED libfixture_vendor.so).
    build = c_build(APP_SOURCES, &warnings);
    let app_objects = build.compile_intermediates();
    let app = out_dir.join(APP_LIBRARY);
    let search = format!("-L{}", out_dir.display());
    link(&build, &app_objects, &app, &shared_args(APP_LIBRARY), &[&search, "-lfixture_vendor", "-lpthread"]);
    println!("cargo:rustc-env=QUANTSHADOW_FIXTURE_APP={}", app.display());

    build = c_build(HOST_SOURCES, &warnings);
    let host_objects = build.compile_intermediates();
    let host = out_dir.join(HOST_PROGRAM);
    link(&build, &host_objects, &host, &["-Wl,-rpath,$ORIGIN".to_string()], &["-ldl"]);
    println!("cargo:rustc-env=QUANTSHADOW_FIXTURE_HOST={}", host.display());

    build = c_build(LAUNCH_SOURCES, &warnings);
    let launch_objects = build.compile_intermediates();
    let launch = out_dir.join(LAUNCH_LIBRARY);
    link(&build, &launch_objects, &launch, &shared_args(LAUNCH_LIBRARY), &["-lm", "-ldl"]);
    println!("cargo:rustc-env=QUANTSHADOW_FIXTURE_LAUNCH={}", launch.display());

    build = c_build(LAUNCH_APP_SOURCES, &warnings);
    let launch_app_objects = build.compile_intermediates();
    let launch_app = out_dir.join(LAUNCH_PROGRAM);
    link(
        &build,
        &launch_app_objects,
        &launch_app,
        &["-Wl,-rpath,$ORIGIN".to_string()],
        &["-ldl", "-lpthread"],
    );
    println!("cargo:rustc-env=QUANTSHADOW_FIXTURE_LAUNCH_APP={}", launch_app.display());

    build = c_build(TRACER_SOURCES, &warnings);
    let tracer_objects = build.compile_intermediates();
    let tracer = out_dir.join(TRACER_LIBRARY);
    link(&build, &tracer_objects, &tracer, &shared_args(TRACER_LIBRARY), &["-ldl"]);
    println!("cargo:rustc-env=QUANTSHADOW_FIXTURE_TRACER={}", tracer.display());
}

/// `-shared` with a soname, every symbol resolved at link time, RUNPATH $ORIGIN.
fn shared_args(soname: &str) -> Vec<String> {
    vec![
        "-shared".into(),
        format!("-Wl,-soname,{soname}"),
        // Every symbol must resolve at link time: a dlopen that fails later is harder to read.
        "-Wl,-z,defs".into(),
        "-Wl,-rpath,$ORIGIN".into(),
    ]
}

/// The common C settings of every fixture source.
fn c_build(sources: &[&str], warnings: &[&str]) -> cc::Build {
    let mut build = cc::Build::new();
    build
        .files(sources)
        .include(FIXTURE_DIR)
        .std("c11")
        // The fixture is the "production" GEMM of every CPU test and the demo: keep it fast
        // even in debug builds (2-core CI); its results do not depend on the level.
        .opt_level(2)
        // The same objects go into the shared library.
        .pic(true)
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        // Only FIXTURE_API functions leave the shared library.
        .flag("-fvisibility=hidden");
    for flag in warnings {
        build.flag(flag);
    }
    build
}

/// Links `objects` into `output` (a shared library or a program, by `args`) with the compiler
/// `cc` chose for the target; `libs` come after the objects.
fn link(build: &cc::Build, objects: &[PathBuf], output: &Path, args: &[String], libs: &[&str]) {
    let compiler = build.get_compiler();
    let mut cmd: Command = compiler.to_command();
    cmd.args(args).arg("-o").arg(output).args(objects).args(libs);
    let result = cmd.output().unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    if !result.status.success() {
        panic!(
            "linking {} failed ({}):\n{:?}\n{}{}",
            output.display(),
            result.status,
            cmd,
            String::from_utf8_lossy(&result.stdout),
            String::from_utf8_lossy(&result.stderr)
        );
    }
}
