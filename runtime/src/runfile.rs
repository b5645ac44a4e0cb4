//! The run file: an append-only sequence of CRC-checked frames holding encoded records.
//!
//! Layout: a 12-byte header (`MAGIC`, then the format version as u32 LE), then frames
//! `[u32 payload length LE][u32 CRC-32 of the payload LE][payload]`. Payloads are opaque here
//! (encoded records, see [`crate::record`]); this layer only guarantees that what it returns is
//! exactly what was appended.
//!
//! Crash model: a writer killed at any point (kill -9, power loss after the page cache was
//! written back partially) leaves a file whose frames are all intact except possibly a damaged
//! tail. Readers stop at the first frame that does not check out and report it as a
//! [`TornTail`]; [`RunWriter::open_append`] truncates such a tail and appends after the last good
//! frame, so earlier frames are never rewritten.

use std::fs::{File, OpenOptions};
use std::io::{self, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// First bytes of every run file.
pub const MAGIC: [u8; 8] = *b"QSHADOW\x1a";
/// Format version this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// Bytes before the first frame.
pub const HEADER_LEN: u64 = 12;
/// Bytes of a frame before its payload (length + CRC).
pub const FRAME_HEADER_LEN: usize = 8;
/// Largest payload a frame may carry. Anything above is treated as damage, never allocated:
/// records are a few hundred bytes, so a larger length means the length field itself is
/// garbage. Larger than the socket limit ([`crate::transport::MAX_FRAME_BYTES`]) so that every
/// frame a collector accepts can be stored.
pub const MAX_PAYLOAD_BYTES: u32 = 16 << 20;

#[derive(Debug, thiserror::Error)]
pub enum RunFileError {
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{path}: not a quantshadow run file")]
    NotARunFile { path: String },
    #[error("{path}: run file format version {found} is not readable by this build (reads {supported})")]
    UnsupportedVersion { path: String, found: u32, supported: u32 },
    /// Another writer holds the file (two collectors on one file would interleave frames).
    #[error("{path}: run file is already open for appending by another process")]
    Locked { path: String },
    #[error("payload of {len} bytes cannot be stored (frames carry 1 to {max} bytes)")]
    BadPayloadSize { len: usize, max: u32 },
    /// Writing failed; the file was cut back to its last complete frame and the frames that
    /// were buffered but not yet written (`lost_records`, the current one included) are gone.
    #[error("{path}: write failed, {lost_records} buffered records lost: {source}")]
    WriteFailed { path: String, lost_records: u64, source: std::io::Error },
}

/// Where a file stopped being readable: everything before `offset` is intact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TornTail {
    pub offset: u64,
    pub reason: String,
}

impl std::fmt::Display for TornTail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "torn tail at byte {}: {}", self.offset, self.reason)
    }
}

pub struct RunContents {
    /// Record payloads in file order, CRC-checked but not decoded.
    pub payloads: Vec<Vec<u8>>,
    pub torn_tail: Option<TornTail>,
    /// Damaged regions skipped in the middle of the file.
    pub damaged: Vec<TornTail>,
}

/// Reads a whole run file into memory. For large files prefer [`RunReader`].
pub fn read_run_file(path: &Path) -> Result<RunContents, RunFileError> {
    let mut reader = RunReader::open(path)?;
    let mut payloads = Vec::new();
    for payload in &mut reader {
        payloads.push(payload?);
    }
    Ok(RunContents {
        payloads,
        torn_tail: reader.torn_tail().cloned(),
        damaged: reader.damaged_regions().to_vec(),
    })
}

fn header_bytes() -> [u8; HEADER_LEN as usize] {
    let mut h = [0u8; HEADER_LEN as usize];
    h[..8].copy_from_slice(&MAGIC);
    h[8..].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h
}

/// Checks a complete header.
fn check_header(h: &[u8; HEADER_LEN as usize], path: &str) -> Result<(), RunFileError> {
    if h[..8] != MAGIC {
        return Err(RunFileError::NotARunFile { path: path.to_string() });
    }
    let found = u32::from_le_bytes([h[8], h[9], h[10], h[11]]);
    if found != FORMAT_VERSION {
        return Err(RunFileError::UnsupportedVersion {
            path: path.to_string(),
            found,
            supported: FORMAT_VERSION,
        });
    }
    Ok(())
}

/// How far past a damaged frame the reader looks for the next valid one.
pub const MAX_RESYNC_BYTES: u64 = 256 << 20;

/// Position of the first complete, CRC-valid frame in `data` (a frame header then payload).
/// A false match needs a plausible length and a 32-bit CRC collision: about 2^-32 per position.
fn next_valid_frame(data: &[u8]) -> Option<usize> {
    let header = FRAME_HEADER_LEN;
    (0..data.len().saturating_sub(header)).find(|&p| {
        let len = u32::from_le_bytes([data[p], data[p + 1], data[p + 2], data[p + 3]]);
        if len == 0 || len > MAX_PAYLOAD_BYTES || p + header + len as usize > data.len() {
            return false;
        }
        let crc = u32::from_le_bytes([data[p + 4], data[p + 5], data[p + 6], data[p + 7]]);
        crc32fast::hash(&data[p + header..p + header + len as usize]) == crc
    })
}

/// Reads until `buf` is full or EOF; returns the number of bytes read. Unlike `read_exact`,
/// a short read at EOF is an answer (how much of a frame exists), not an error.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Streaming reader: yields payloads in file order and stops at the first damaged frame,
/// which [`RunReader::torn_tail`] then describes. Memory use is one payload at a time.
pub struct RunReader<R = BufReader<File>> {
    inner: R,
    /// Bytes read ahead while resynchronising after a damaged frame; consumed before `inner`.
    pending: Option<std::io::Cursor<Vec<u8>>>,
    /// Damaged regions skipped in the middle of the file (each followed by good frames).
    damaged: Vec<TornTail>,
    path: String,
    /// End of the last good frame.
    offset: u64,
    records: u64,
    torn: Option<TornTail>,
    done: bool,
}

impl RunReader<BufReader<File>> {
    pub fn open(path: &Path) -> Result<Self, RunFileError> {
        let name = path.display().to_string();
        let file = File::open(path).map_err(|source| RunFileError::Io { path: name.clone(), source })?;
        RunReader::new(BufReader::with_capacity(256 << 10, file), name)
    }
}

impl<R: Read> RunReader<R> {
    /// Reads and checks the header from `inner`; `name` is used in errors.
    pub fn new(mut inner: R, name: impl Into<String>) -> Result<Self, RunFileError> {
        let path = name.into();
        let mut h = [0u8; HEADER_LEN as usize];
        let got = read_full(&mut inner, &mut h)
            .map_err(|source| RunFileError::Io { path: path.clone(), source })?;
        if got < h.len() {
            return Err(RunFileError::NotARunFile { path });
        }
        check_header(&h, &path)?;
        Ok(RunReader {
            inner,
            pending: None,
            damaged: Vec::new(),
            path,
            offset: HEADER_LEN,
            records: 0,
            torn: None,
            done: false,
        })
    }

    /// Reads the next payload into `buf` (replacing its contents, reusing its allocation).
    /// `Ok(false)`: no more frames, either a clean end or a torn tail (see [`Self::torn_tail`]).
    pub fn read_into(&mut self, buf: &mut Vec<u8>) -> Result<bool, RunFileError> {
        if self.done {
            return Ok(false);
        }
        let io_err = |path: &str, source| RunFileError::Io { path: path.to_string(), source };
        let mut fh = [0u8; FRAME_HEADER_LEN];
        let got = match self.fill(&mut fh) {
            Ok(n) => n,
            Err(e) => {
                self.done = true;
                return Err(io_err(&self.path, e));
            }
        };
        if got == 0 {
            self.done = true;
            return Ok(false);
        }
        if got < FRAME_HEADER_LEN {
            return self.tear(format!("incomplete frame header ({got} of {FRAME_HEADER_LEN} bytes)"));
        }
        let len = u32::from_le_bytes([fh[0], fh[1], fh[2], fh[3]]);
        let crc = u32::from_le_bytes([fh[4], fh[5], fh[6], fh[7]]);
        if len == 0 {
            // Zero-filled blocks (a file system that extended the file before writing the data)
            // would otherwise parse as endless empty frames with CRC 0.
            return self.damaged_frame(&fh, &[], "zero-length frame".to_string(), buf);
        }
        if len > MAX_PAYLOAD_BYTES {
            let reason = format!("frame length {len} exceeds the maximum {MAX_PAYLOAD_BYTES}");
            return self.damaged_frame(&fh, &[], reason, buf);
        }
        buf.clear();
        buf.resize(len as usize, 0);
        let got = match self.fill(buf) {
            Ok(n) => n,
            Err(e) => {
                self.done = true;
                return Err(io_err(&self.path, e));
            }
        };
        if got < len as usize {
            // A torn last frame, or a damaged length in the middle of the file: good frames
            // after it must be found (and kept by recovery), as for any other damaged frame.
            let payload = buf[..got].to_vec();
            buf.clear();
            let reason = format!("frame of {len} bytes runs past the end of the file ({got} bytes present)");
            return self.damaged_frame(&fh, &payload, reason, buf);
        }
        let computed = crc32fast::hash(buf);
        if computed != crc {
            let payload = std::mem::take(buf);
            let reason = format!("CRC mismatch (stored {crc:08x}, computed {computed:08x})");
            return self.damaged_frame(&fh, &payload, reason, buf);
        }
        self.offset += FRAME_HEADER_LEN as u64 + len as u64;
        self.records += 1;
        Ok(true)
    }

    fn tear(&mut self, reason: String) -> Result<bool, RunFileError> {
        self.done = true;
        self.torn = Some(TornTail { offset: self.offset, reason });
        Ok(false)
    }

    /// Reads from the resync buffer first, then from the file.
    fn fill(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut got = 0;
        if let Some(pending) = &mut self.pending {
            got = read_full(pending, buf)?;
            if got < buf.len() {
                self.pending = None;
            }
        }
        Ok(got + read_full(&mut self.inner, &mut buf[got..])?)
    }

    /// A damaged frame at `self.offset` (its header `fh` and the payload bytes read, if any):
    /// when a valid frame follows within [`MAX_RESYNC_BYTES`], the damaged bytes are recorded as
    /// a damaged region and reading goes on from there, so damage in the middle of a file
    /// loses only the damaged frames; otherwise it is a torn tail.
    fn damaged_frame(
        &mut self,
        fh: &[u8],
        payload: &[u8],
        reason: String,
        buf: &mut Vec<u8>,
    ) -> Result<bool, RunFileError> {
        let mut data = Vec::with_capacity(fh.len() + payload.len());
        data.extend_from_slice(&fh[1..]);
        data.extend_from_slice(payload);
        let mut rest = Vec::new();
        let limit = MAX_RESYNC_BYTES.saturating_sub(data.len() as u64);
        if let Err(e) = self.pending.take().map_or(Ok(0), |mut p| p.read_to_end(&mut rest)).and_then(|_| {
            (&mut self.inner).take(limit.saturating_sub(rest.len() as u64)).read_to_end(&mut rest)
        }) {
            self.done = true;
            return Err(RunFileError::Io { path: self.path.clone(), source: e });
        }
        data.extend_from_slice(&rest);
        match next_valid_frame(&data) {
            Some(position) => {
                let skipped = 1 + position as u64;
                self.damaged.push(TornTail {
                    offset: self.offset,
                    reason: format!("{reason}; {skipped} bytes skipped"),
                });
                self.offset += skipped;
                data.drain(..position);
                self.pending = Some(std::io::Cursor::new(data));
                self.read_into(buf)
            }
            None => self.tear(reason),
        }
    }

    /// Damaged regions skipped in the middle of the file (good frames follow each).
    pub fn damaged_regions(&self) -> &[TornTail] {
        &self.damaged
    }

    /// Set once reading stopped at a damaged frame.
    pub fn torn_tail(&self) -> Option<&TornTail> {
        self.torn.as_ref()
    }

    /// Byte offset just past the last good frame read so far.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Good frames read so far.
    pub fn records(&self) -> u64 {
        self.records
    }
}

impl<R: Read> Iterator for RunReader<R> {
    type Item = Result<Vec<u8>, RunFileError>;

    fn next(&mut self) -> Option<Self::Item> {
        let mut buf = Vec::new();
        match self.read_into(&mut buf) {
            Ok(true) => Some(Ok(buf)),
            Ok(false) => None,
            Err(e) => Some(Err(e)),
        }
    }
}

/// What [`RunWriter::open_append`] found in an existing file.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Recovery {
    /// Good frames already in the file (kept).
    pub records_intact: u64,
    /// The damaged tail that was cut off, if any.
    pub torn_tail: Option<TornTail>,
    /// Bytes removed with the torn tail.
    pub bytes_truncated: u64,
    /// Damaged regions in the middle of the file, left in place and skipped by readers.
    pub damaged: Vec<TornTail>,
}

/// When buffered frames are written to the file. A writer killed with kill -9 loses at most
/// what is buffered; since a buffer holds whole frames and is written in one piece, the loss is
/// the newest records (a clean end or a torn tail), never damage to earlier frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlushPolicy {
    /// Write once this many bytes are buffered.
    pub max_bytes: usize,
    /// ... or this many records.
    pub max_records: u64,
    /// ... or when the oldest buffered record is this old (checked on every append and by
    /// [`RunWriter::flush_if_due`], which an idle writer should call periodically).
    pub max_delay: Duration,
}

impl Default for FlushPolicy {
    fn default() -> Self {
        FlushPolicy { max_bytes: 256 << 10, max_records: 4096, max_delay: Duration::from_millis(50) }
    }
}

/// Frames prepared away from the writer (length and CRC computed by the producer thread), to
/// be appended in one piece with [`RunWriter::append_batch`].
#[derive(Debug, Default, Clone)]
pub struct FrameBatch {
    bytes: Vec<u8>,
    records: u64,
}

impl FrameBatch {
    pub fn new() -> Self {
        FrameBatch::default()
    }

    pub fn with_capacity(bytes: usize) -> Self {
        FrameBatch { bytes: Vec::with_capacity(bytes), records: 0 }
    }

    pub fn push(&mut self, payload: &[u8]) -> Result<(), RunFileError> {
        check_payload(payload)?;
        push_frame(&mut self.bytes, payload);
        self.records += 1;
        Ok(())
    }

    pub fn records(&self) -> u64 {
        self.records
    }

    /// Encoded size (frame headers included).
    pub fn len_bytes(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records == 0
    }

    pub fn clear(&mut self) {
        self.bytes.clear();
        self.records = 0;
    }
}

fn check_payload(payload: &[u8]) -> Result<(), RunFileError> {
    if payload.is_empty() || payload.len() > MAX_PAYLOAD_BYTES as usize {
        return Err(RunFileError::BadPayloadSize { len: payload.len(), max: MAX_PAYLOAD_BYTES });
    }
    Ok(())
}

fn push_frame(out: &mut Vec<u8>, payload: &[u8]) {
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out.extend_from_slice(payload);
}

/// Appends frames to a run file. Holds an exclusive advisory lock (`flock`) on the file for its
/// lifetime so that two writers never interleave frames.
pub struct RunWriter {
    file: File,
    path: PathBuf,
    /// Length of the file up to its last complete, written frame.
    file_len: u64,
    buf: Vec<u8>,
    buffered_records: u64,
    oldest_buffered: Option<Instant>,
    policy: FlushPolicy,
    records_written: u64,
}

impl RunWriter {
    /// Creates `path`, or opens it and recovers it: scans every frame, cuts off a torn tail and
    /// positions the writer after the last good frame.
    pub fn open_append(path: &Path) -> Result<(RunWriter, Recovery), RunFileError> {
        RunWriter::open_append_with(path, FlushPolicy::default())
    }

    pub fn open_append_with(path: &Path, policy: FlushPolicy) -> Result<(RunWriter, Recovery), RunFileError> {
        let name = path.display().to_string();
        let io = |source| RunFileError::Io { path: name.clone(), source };
        let mut file =
            OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path).map_err(io)?;
        lock_exclusive(&file, &name)?;
        let len = file.metadata().map_err(io)?.len();
        let mut recovery = Recovery::default();
        let good_end = if len < HEADER_LEN {
            // Empty, or a writer died while writing the header: only ever rewrite bytes that
            // are a prefix of our own header, so a foreign file is never clobbered.
            let mut existing = vec![0u8; len as usize];
            file.read_exact(&mut existing).map_err(io)?;
            if existing[..] != header_bytes()[..existing.len()] {
                return Err(RunFileError::NotARunFile { path: name });
            }
            if len > 0 {
                recovery.torn_tail = Some(TornTail {
                    offset: 0,
                    reason: format!("incomplete file header ({len} of {HEADER_LEN} bytes)"),
                });
                recovery.bytes_truncated = len;
            }
            file.set_len(0).map_err(io)?;
            file.seek(SeekFrom::Start(0)).map_err(io)?;
            file.write_all(&header_bytes()).map_err(io)?;
            HEADER_LEN
        } else {
            let mut reader = RunReader::new(BufReader::with_capacity(256 << 10, &mut file), name.clone())?;
            let mut scratch = Vec::new();
            while reader.read_into(&mut scratch)? {}
            recovery.records_intact = reader.records();
            recovery.torn_tail = reader.torn_tail().cloned();
            // Damage in the middle stays where it is (good frames follow it and readers skip
            // it); only a torn tail is cut.
            recovery.damaged = reader.damaged_regions().to_vec();
            let end = reader.offset();
            drop(reader);
            if end < len {
                recovery.bytes_truncated = len - end;
                file.set_len(end).map_err(io)?;
            }
            end
        };
        file.seek(SeekFrom::Start(good_end)).map_err(io)?;
        let writer = RunWriter {
            file,
            path: path.to_path_buf(),
            file_len: good_end,
            buf: Vec::with_capacity(policy.max_bytes.min(16 << 20) + 4096),
            buffered_records: 0,
            oldest_buffered: None,
            policy,
            records_written: recovery.records_intact,
        };
        Ok((writer, recovery))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records in the file, counting buffered ones.
    pub fn records(&self) -> u64 {
        self.records_written + self.buffered_records
    }

    /// Appends one payload (buffered; written per the [`FlushPolicy`]).
    pub fn append(&mut self, payload: &[u8]) -> Result<(), RunFileError> {
        check_payload(payload)?;
        push_frame(&mut self.buf, payload);
        self.note_buffered(1);
        self.flush_if_due().map(|_| ())
    }

    /// Appends prepared frames in one piece.
    pub fn append_batch(&mut self, batch: &FrameBatch) -> Result<(), RunFileError> {
        if batch.is_empty() {
            return Ok(());
        }
        self.buf.extend_from_slice(&batch.bytes);
        self.note_buffered(batch.records);
        self.flush_if_due().map(|_| ())
    }

    fn note_buffered(&mut self, n: u64) {
        self.buffered_records += n;
        if self.oldest_buffered.is_none() {
            self.oldest_buffered = Some(Instant::now());
        }
    }

    /// Writes buffered frames if the policy says so; `Ok(true)` when it wrote.
    pub fn flush_if_due(&mut self) -> Result<bool, RunFileError> {
        let due = self.buf.len() >= self.policy.max_bytes
            || self.buffered_records >= self.policy.max_records
            || self.oldest_buffered.is_some_and(|t| t.elapsed() >= self.policy.max_delay);
        if due {
            self.flush()?;
        }
        Ok(due)
    }

    /// Writes every buffered frame to the file (to the OS, not to stable storage: see
    /// [`Self::sync`]).
    pub fn flush(&mut self) -> Result<(), RunFileError> {
        if self.buf.is_empty() {
            return Ok(());
        }
        match self.file.write_all(&self.buf) {
            Ok(()) => {
                self.file_len += self.buf.len() as u64;
                self.records_written += self.buffered_records;
                self.discard_buffer();
                Ok(())
            }
            Err(source) => {
                // A partial write would leave half a frame that later appends would follow;
                // cut the file back to the last complete frame so the file stays readable.
                // Best effort: if even that fails, readers still stop at the torn frame.
                let _ = self.file.set_len(self.file_len);
                let _ = self.file.seek(SeekFrom::Start(self.file_len));
                let lost_records = self.buffered_records;
                self.discard_buffer();
                Err(RunFileError::WriteFailed { path: self.path.display().to_string(), lost_records, source })
            }
        }
    }

    fn discard_buffer(&mut self) {
        self.buf.clear();
        self.buffered_records = 0;
        self.oldest_buffered = None;
        // A burst of huge batches should not pin memory for the rest of the run.
        if self.buf.capacity() > 4 * self.policy.max_bytes.max(64 << 10) {
            self.buf.shrink_to(self.policy.max_bytes);
        }
    }

    /// Flushes and forces the data to stable storage.
    pub fn sync(&mut self) -> Result<(), RunFileError> {
        self.flush()?;
        self.file
            .sync_data()
            .map_err(|source| RunFileError::Io { path: self.path.display().to_string(), source })
    }

    /// Flushes, syncs and closes (releasing the lock).
    pub fn finish(mut self) -> Result<(), RunFileError> {
        self.sync()
    }
}

impl Drop for RunWriter {
    fn drop(&mut self) {
        // Buffered frames are whole, so writing them here cannot damage the file; errors have
        // nobody to go to.
        let _ = self.flush();
    }
}

fn lock_exclusive(file: &File, path: &str) -> Result<(), RunFileError> {
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a descriptor we own; no memory is involved.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.kind() == io::ErrorKind::WouldBlock {
        Err(RunFileError::Locked { path: path.to_string() })
    } else {
        Err(RunFileError::Io { path: path.to_string(), source: e })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_is_magic_then_version() {
        let h = header_bytes();
        assert_eq!(&h[..8], &MAGIC);
        assert_eq!(u32::from_le_bytes(h[8..].try_into().unwrap()), FORMAT_VERSION);
    }

    #[test]
    fn frame_layout_is_len_crc_payload() {
        let mut b = FrameBatch::new();
        b.push(b"abc").unwrap();
        assert_eq!(b.bytes[..4], 3u32.to_le_bytes());
        assert_eq!(b.bytes[4..8], crc32fast::hash(b"abc").to_le_bytes());
        assert_eq!(&b.bytes[8..], b"abc");
        assert!(b.push(b"").is_err());
    }
}
