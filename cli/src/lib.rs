//! The `quantshadow` command: collector, report, demo and benchmarks. Each subcommand is a
//! module with an `Args` struct (clap) and `pub fn main(args) -> ExitCode`.

pub mod bench;
pub mod bench_gpu;
pub mod collect;
pub mod demo;
pub mod dump;
pub mod fixture;
pub mod kernels;
pub mod report;
pub mod run;
pub mod selftest;

/// Exit codes shared by every subcommand.
pub mod exit {
    pub const OK: u8 = 0;
    /// A check or configuration failed (report), or the checked program failed.
    pub const FAILED: u8 = 1;
    /// Bad input or usage.
    pub const BAD_INPUT: u8 = 2;
}
