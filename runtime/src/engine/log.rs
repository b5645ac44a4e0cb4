//! The shim's log: one line per event on stderr, `[quantshadow PID] level: message`. No
//! subscriber, no allocation beyond the line, nothing before the engine starts.

use super::config::LogLevel;
use std::sync::atomic::{AtomicU8, Ordering};

static LEVEL: AtomicU8 = AtomicU8::new(LogLevel::Warn as u8);

pub fn set_level(level: LogLevel) {
    LEVEL.store(level as u8, Ordering::Relaxed);
}

pub fn enabled(level: LogLevel) -> bool {
    level as u8 <= LEVEL.load(Ordering::Relaxed)
}

fn emit(level: LogLevel, name: &str, message: &str) {
    if enabled(level) {
        use std::io::Write;
        let line = format!("[quantshadow {}] {name}: {message}\n", std::process::id());
        // One write call per line so lines of several threads do not interleave.
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }
}

pub fn error(message: &str) {
    emit(LogLevel::Error, "error", message)
}
pub fn warn(message: &str) {
    emit(LogLevel::Warn, "warning", message)
}
pub fn info(message: &str) {
    emit(LogLevel::Info, "info", message)
}
pub fn debug(message: &str) {
    emit(LogLevel::Debug, "debug", message)
}

/// A warning of a layer the CLI shares (device runtime, kernel registry, transport): through
/// `tracing` where the process installed a subscriber (the CLI does), else on this log. The
/// shim installs none (a global subscriber inside someone else's process would take theirs),
/// so `tracing` events alone would never be seen there.
pub fn shared_warn(message: &str) {
    if tracing::dispatcher::has_been_set() {
        tracing::warn!("{message}");
    } else {
        warn(message);
    }
}
