//! Loading run files: CRC-checked payloads -> decoded records, with every problem either
//! fatal (a clear error, exit 2) or counted and shown in the report, never silently lost.
//!
//! Fatal: a missing or unreadable file, a file that is not a run file or has a run-file version
//! this build cannot read, a file with no intact record ("empty run"), a record with a schema
//! major version this build cannot read (a newer shim wrote it: guessing would misreport), and
//! a file none of whose records decode. Reported and survived: a torn tail (a writer killed
//! mid-record: everything before it is intact) and individual undecodable records.

use quantshadow_runtime::record::{decode, Record, RecordError};
use quantshadow_runtime::runfile::{RunFileError, RunReader, TornTail};
use serde::Serialize;
use std::path::Path;

/// One input file as the report describes it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunSource {
    pub path: String,
    /// Records decoded and reported.
    pub records: u64,
    pub torn_tail: Option<TornTailInfo>,
    /// Damaged regions in the middle of the file: skipped, the records after them are read.
    pub damaged: Vec<TornTailInfo>,
    /// Intact payloads that did not decode; they are not in the report.
    pub undecodable: u64,
    pub first_undecodable: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TornTailInfo {
    /// Everything before this byte offset is intact.
    pub offset: u64,
    pub reason: String,
}

impl From<TornTail> for TornTailInfo {
    fn from(t: TornTail) -> Self {
        TornTailInfo { offset: t.offset, reason: t.reason }
    }
}

impl RunSource {
    /// The file's problems in words, for the report and stderr.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(torn) = &self.torn_tail {
            out.push(format!(
                "{}: torn tail at byte {} ({}): whatever was written after it is lost; the {} intact \
                 records before it are reported",
                self.path, torn.offset, torn.reason, self.records
            ));
        }
        for region in &self.damaged {
            out.push(format!(
                "{}: damaged data at byte {} ({}): the records in it are lost and not in this report; \
                 reading went on after it",
                self.path, region.offset, region.reason
            ));
        }
        if self.undecodable > 0 {
            out.push(format!(
                "{}: {} records could not be decoded and are not in this report (first: {})",
                self.path,
                self.undecodable,
                self.first_undecodable.as_deref().unwrap_or("no detail")
            ));
        }
        out
    }
}

/// A run file decoded into memory (tests, small runs; the binary streams instead).
#[derive(Debug, Clone)]
pub struct LoadedRun {
    pub source: RunSource,
    pub records: Vec<Record>,
}

impl LoadedRun {
    /// Records that did not come from a file (tests, demos): no load problems.
    pub fn from_records(path: &str, records: Vec<Record>) -> LoadedRun {
        let source = RunSource {
            path: path.to_string(),
            records: records.len() as u64,
            torn_tail: None,
            damaged: Vec::new(),
            undecodable: 0,
            first_undecodable: None,
        };
        LoadedRun { source, records }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{path}: no such file")]
    Missing { path: String },
    #[error("{path}: is a directory, not a run file")]
    Directory { path: String },
    #[error(transparent)]
    RunFile(#[from] RunFileError),
    #[error("{path}: empty run: the file holds no intact record{detail}")]
    Empty { path: String, detail: String },
    #[error("{path}: record {index}: {source}; a newer quantshadow wrote this file")]
    UnsupportedRecordVersion { path: String, index: usize, source: RecordError },
    #[error("{path}: none of its {count} records could be decoded (first: {first})")]
    Undecodable { path: String, count: usize, first: String },
}

/// Reads and decodes a whole run file into memory.
pub fn load_run_file(path: &Path) -> Result<LoadedRun, LoadError> {
    let mut records = Vec::new();
    let source = stream_run_file(path, |record| records.push(record))?;
    Ok(LoadedRun { source, records })
}

/// Reads a run file and hands each decoded record to `on_record`, in file order, dropping each
/// payload once decoded. On error, records already handed over are to be discarded.
pub fn stream_run_file(path: &Path, mut on_record: impl FnMut(Record)) -> Result<RunSource, LoadError> {
    let display = path.display().to_string();
    // Checked up front only for a clearer message; any other failure to open is reported by
    // the run-file reader with its cause.
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(LoadError::Missing { path: display })
        }
        Ok(meta) if meta.is_dir() => return Err(LoadError::Directory { path: display }),
        _ => {}
    }
    // One payload in memory at a time: a report over a multi-GB run stays small.
    let mut reader = RunReader::open(path)?;
    let mut decoder = PayloadDecoder::new(display);
    let mut payload = Vec::new();
    while reader.read_into(&mut payload)? {
        decoder.push(&payload, &mut on_record)?;
    }
    let mut source = decoder.finish(reader.torn_tail().cloned())?;
    source.damaged = reader.damaged_regions().iter().cloned().map(TornTailInfo::from).collect();
    Ok(source)
}

/// Decodes the payloads of one run file held in memory (see the module doc for what is fatal).
pub fn decode_payloads(
    path: String,
    payloads: Vec<Vec<u8>>,
    torn_tail: Option<TornTail>,
    mut on_record: impl FnMut(Record),
) -> Result<RunSource, LoadError> {
    let mut decoder = PayloadDecoder::new(path);
    for payload in &payloads {
        decoder.push(payload, &mut on_record)?;
    }
    decoder.finish(torn_tail)
}

/// Decodes payloads one by one, counting what cannot be decoded.
struct PayloadDecoder {
    source: RunSource,
    index: usize,
}

impl PayloadDecoder {
    fn new(path: String) -> PayloadDecoder {
        PayloadDecoder {
            source: RunSource {
                path,
                records: 0,
                torn_tail: None,
                damaged: Vec::new(),
                undecodable: 0,
                first_undecodable: None,
            },
            index: 0,
        }
    }

    fn push(&mut self, payload: &[u8], on_record: &mut impl FnMut(Record)) -> Result<(), LoadError> {
        let index = self.index;
        self.index += 1;
        match decode(payload) {
            Ok(record) => {
                self.source.records += 1;
                on_record(record);
            }
            // A record from a newer major version: reading on would misread, so stop here.
            Err(error @ RecordError::UnsupportedVersion { .. }) => {
                return Err(LoadError::UnsupportedRecordVersion {
                    path: self.source.path.clone(),
                    index,
                    source: error,
                });
            }
            Err(error) => {
                self.source.undecodable += 1;
                if self.source.first_undecodable.is_none() {
                    self.source.first_undecodable = Some(format!("record {index}: {error}"));
                }
            }
        }
        Ok(())
    }

    fn finish(mut self, torn_tail: Option<TornTail>) -> Result<RunSource, LoadError> {
        self.source.torn_tail = torn_tail.map(TornTailInfo::from);
        if self.index == 0 {
            let detail = match &self.source.torn_tail {
                Some(t) => format!(" (torn at byte {}: {})", t.offset, t.reason),
                None => String::new(),
            };
            return Err(LoadError::Empty { path: self.source.path, detail });
        }
        if self.source.records == 0 {
            let first = self.source.first_undecodable.unwrap_or_default();
            return Err(LoadError::Undecodable { path: self.source.path, count: self.index, first });
        }
        Ok(self.source)
    }
}
