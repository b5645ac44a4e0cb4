//! Placeholder: filled in by its own change.
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn main(_args: Args) -> ExitCode {
    eprintln!("quantshadow demo: not built yet");
    ExitCode::from(crate::exit::BAD_INPUT)
}
