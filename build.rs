//! Builds the C test fixtures (tests/fixtures/): the fake vendor BLAS core, compiled once into
//! position-independent objects that become
//! - a static library linked into this package, for the safe wrapper `cli/src/fixture.rs`;
//! - `libfixture_blas.so` in OUT_DIR, whose path is exported as `QUANTSHADOW_FIXTURE_BLAS`
//!   so tests and host programs can dlopen the same code as a stand-alone vendor library.
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

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    for path in CORE_SOURCES.iter().chain(CORE_HEADERS) {
        println!("cargo:rerun-if-changed={path}");
    }

    let mut build = cc::Build::new();
    build
        .files(CORE_SOURCES)
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
    for flag in ["-Wpedantic", "-Wshadow", "-Wstrict-prototypes", "-Wmissing-prototypes", "-Wcast-qual"] {
        build.flag_if_supported(flag);
    }

    let objects = build.compile_intermediates();
    let archive = build.create_archive("fixture_blas_core", &objects);
    cc::emit_link_directives(&build, &archive);
    // tanh and sqrt; std links libm on Linux already, but the archive should not rely on it.
    println!("cargo:rustc-link-lib=m");

    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let shared = out_dir.join(SHARED_LIBRARY);
    if env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        link_shared(&build, &objects, &shared);
        println!("cargo:rustc-env=QUANTSHADOW_FIXTURE_BLAS={}", shared.display());
    } else {
        // The shared library is an LD_PRELOAD test vehicle: Linux only. Empty = not built.
        println!("cargo:warning={SHARED_LIBRARY} is only built for Linux targets");
        println!("cargo:rustc-env=QUANTSHADOW_FIXTURE_BLAS=");
    }
}

/// Links `objects` into a shared library with the compiler `cc` chose for the target.
fn link_shared(build: &cc::Build, objects: &[PathBuf], output: &Path) {
    let compiler = build.get_compiler();
    let mut cmd: Command = compiler.to_command();
    cmd.arg("-shared")
        .arg(format!("-Wl,-soname,{SHARED_LIBRARY}"))
        // Every symbol must resolve at link time: a dlopen that fails later is harder to read.
        .arg("-Wl,-z,defs")
        .arg("-o")
        .arg(output)
        .args(objects)
        .arg("-lm");
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
