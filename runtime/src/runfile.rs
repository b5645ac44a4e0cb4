//! Placeholder with the final API; the implementation lands in its own change.
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum RunFileError {
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{path}: not a quantshadow run file")]
    NotARunFile { path: String },
    #[error("{path}: run file format version {found} is not readable by this build (reads {supported})")]
    UnsupportedVersion { path: String, found: u32, supported: u32 },
}

/// Where a file stopped being readable: everything before `offset` is intact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TornTail {
    pub offset: u64,
    pub reason: String,
}

pub struct RunContents {
    /// Record payloads in file order, CRC-checked but not decoded.
    pub payloads: Vec<Vec<u8>>,
    pub torn_tail: Option<TornTail>,
}

pub fn read_run_file(path: &Path) -> Result<RunContents, RunFileError> {
    Err(RunFileError::NotARunFile { path: path.display().to_string() })
}
