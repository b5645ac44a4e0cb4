use clap::{Parser, Subcommand};
use quantshadow_cli::{bench, collect, demo, dump, exit, kernels, report, run, selftest};
use std::process::ExitCode;

/// quantshadow: catch silent numerical bugs in quantized GEMMs inside a running engine.
#[derive(Debug, Parser)]
#[command(name = "quantshadow", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Receive records from instrumented processes and append them to a run file.
    Collect(collect::Args),
    /// Turn one or more run files into a markdown pass/fail report.
    Report(report::CommandArgs),
    /// Run a program under the shim and report on it: quantshadow run [OPTIONS] -- CMD ARGS...
    Run(run::Args),
    /// List the kernels a program launches (observe mode), optionally with spec skeletons:
    /// quantshadow kernels [--suggest] [--out DIR] -- CMD ARGS... | --from FILE.json
    Kernels(kernels::Args),
    /// Run the whole pipeline on a built-in example (no GPU needed).
    Demo(demo::Args),
    /// Measure the collector and the report on this machine.
    Bench(bench::Args),
    /// Check the device's reference kernels against the host oracle (host device without a GPU).
    Selftest(selftest::Args),
    /// Print run files' records as JSON lines, or a one-line summary (for scripts).
    Dump(dump::Args),
}

fn main() -> ExitCode {
    init_logging();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { exit::BAD_INPUT } else { exit::OK };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    match cli.command {
        Command::Collect(a) => collect::main(a),
        Command::Report(a) => report::main(a),
        Command::Run(a) => run::main(a),
        Command::Kernels(a) => kernels::main(a),
        Command::Demo(a) => demo::main(a),
        Command::Bench(a) => bench::main(a),
        Command::Selftest(a) => selftest::main(a),
        Command::Dump(a) => dump::main(a),
    }
}

/// Logs go to stderr, filtered by QUANTSHADOW_LOG (default: info).
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("QUANTSHADOW_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .without_time()
        .try_init();
}
