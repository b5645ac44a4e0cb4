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
use std::sync::OnceLock;
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

/// Work done looking for good frames after damaged ones ([`RunReader::resync_stats`]). A
/// search must cost about one pass over the bytes it looks at, whatever garbage it meets: these
/// counters let tests (and diagnostics) check that.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResyncStats {
    /// Searches run (damaged frames met).
    pub searches: u64,
    /// Bytes after the damaged frames that the searches looked at (up to the last byte each
    /// one needed).
    pub bytes_examined: u64,
    /// Bytes the searches fed to CRC-32.
    pub bytes_hashed: u64,
    /// Positions whose length was plausible and whose payload fitted: the ones whose CRC was
    /// checked.
    pub candidates: u64,
}

// Finding the next good frame after damage
//
// The answer is the first position of the window where a frame checks out: a length of 1 to
// MAX_PAYLOAD_BYTES, a payload that fits in the window, and a payload CRC equal to the stored
// one. Hashing each candidate's payload on its own costs its length, and garbage has a
// plausible length at about one position in 256, averaging 8 MiB: a 64 MiB damaged region
// took half a minute. Instead the CRC of any payload comes from CRCs of window prefixes, since
// CRC-32 is linear over GF(2) (zlib's crc32_combine, solved for the second part):
//     crc(d[a..b]) = crc(d[..b]) ^ crc(d[..a]) * x^(8 (b - a))  mod P.
// Prefix CRCs are kept every CHECKPOINT_EVERY bytes, each byte hashed once; a prefix in between
// costs fewer than CHECKPOINT_EVERY bytes more, and the product two multiplications modulo P
// with tabulated powers of x. A search thus costs one hash of the bytes it looks at plus a
// constant per candidate, and reads the file only as far as it looks.
//
// Positions are tried in the same order and accepted by the same test as a direct search (the
// CRC equality is exact, only computed another way), so the result is the direct search's:
// every frame it would find is found, and a false match still needs a 32-bit CRC collision.

/// Spacing of the prefix CRCs a search keeps (4 bytes of memory per this many looked at).
const CHECKPOINT_EVERY: usize = 16;
/// Payloads up to this length are hashed directly: no dearer than two prefix lookups.
const HASH_DIRECTLY: usize = CHECKPOINT_EVERY;
/// Least the window grows by when a search needs more of the file.
const RESYNC_READ_CHUNK: usize = 256 << 10;

/// CRC-32 (IEEE 802.3) polynomial in the reflected bit order crc32fast uses: bit 31 holds
/// x^0, bit 0 holds x^31, and x^32 is implied.
const CRC_POLY: u32 = 0xedb8_8320;
/// x^0 in that order.
const CRC_ONE: u32 = 1 << 31;

const fn crc_table() -> [u32; 256] {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ CRC_POLY } else { c >> 1 };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
}

static CRC_TABLE: [u32; 256] = crc_table();

/// `v * x^8 mod P`: the CRC register after one zero byte.
fn crc_mul_x8(v: u32) -> u32 {
    (v >> 8) ^ CRC_TABLE[(v & 0xff) as usize]
}

/// `a * b mod P`, both in the reflected order.
fn crc_mul(a: u32, b: u32) -> u32 {
    // Carry-less product, four bits of `a` at a time. In the reflected order bit i of each
    // factor is x^(31 - i), so bit m of the integer product is x^(62 - m); shifted left by one,
    // its high word is the product's x^0..x^31 and its low word x^32..x^63, i.e. lo * x^32.
    let mut multiples = [0u64; 16];
    for k in 1..16usize {
        let low = k & k.wrapping_neg();
        multiples[k] = multiples[k ^ low] ^ ((b as u64) << low.trailing_zeros());
    }
    let mut p = 0u64;
    for i in (0..8).rev() {
        p = (p << 4) ^ multiples[((a >> (4 * i)) & 15) as usize];
    }
    let p = p << 1;
    let mut lo = p as u32;
    for _ in 0..4 {
        lo = crc_mul_x8(lo);
    }
    (p >> 32) as u32 ^ lo
}

/// `x^(8 n) mod P` for n up to 2^24 (covers every payload length).
fn crc_x8n(n: usize) -> u32 {
    const LOW_BITS: usize = 12;
    const LOW: usize = 1 << LOW_BITS;
    const HIGH: usize = (MAX_PAYLOAD_BYTES as usize >> LOW_BITS) + 1;
    /// `low[i] = x^(8 i)`, `high[j] = x^(8 j 2^12)`.
    struct Powers {
        low: [u32; LOW],
        high: [u32; HIGH],
    }
    static POWERS: OnceLock<Box<Powers>> = OnceLock::new();
    let p = POWERS.get_or_init(|| {
        let mut p = Box::new(Powers { low: [CRC_ONE; LOW], high: [CRC_ONE; HIGH] });
        for i in 1..LOW {
            p.low[i] = crc_mul_x8(p.low[i - 1]);
        }
        let step = crc_mul_x8(p.low[LOW - 1]);
        for j in 1..HIGH {
            p.high[j] = crc_mul(p.high[j - 1], step);
        }
        p
    });
    debug_assert!(n < LOW * HIGH);
    let (low, high) = (p.low[n % LOW], p.high[n / LOW]);
    if n < LOW {
        low
    } else {
        crc_mul(low, high)
    }
}

/// The CRC-32 state `state` (as crc32fast keeps it) continued over `bytes`.
fn crc_continue(state: u32, bytes: &[u8]) -> u32 {
    if bytes.len() >= 64 {
        let mut h = crc32fast::Hasher::new_with_initial(state);
        h.update(bytes);
        return h.finalize();
    }
    let mut r = !state;
    for &b in bytes {
        r = (r >> 8) ^ CRC_TABLE[((r ^ b as u32) & 0xff) as usize];
    }
    !r
}

/// The bytes after a damaged frame, read from the file only as far as a search needs them, up
/// to a cap.
struct ResyncWindow<'r, R> {
    data: Vec<u8>,
    inner: &'r mut R,
    cap: usize,
    at_end: bool,
    /// The furthest byte a search asked for.
    wanted: usize,
}

impl<R: Read> ResyncWindow<'_, R> {
    /// Makes `data[..n]` present if the file has it within the cap; returns how much of it is.
    fn ensure(&mut self, n: usize) -> io::Result<usize> {
        self.wanted = self.wanted.max(n);
        let have = self.data.len();
        if n > have && !self.at_end {
            // Grow geometrically so a window read in small steps is copied a bounded number
            // of times.
            let target = n.max(have + (have / 2).max(RESYNC_READ_CHUNK)).min(self.cap);
            self.data.resize(target, 0);
            let got = read_full(&mut *self.inner, &mut self.data[have..]);
            let got = got.inspect_err(|_| self.data.truncate(have))?;
            self.data.truncate(have + got);
            self.at_end = self.data.len() < target || self.data.len() >= self.cap;
        }
        Ok(n.min(self.data.len()))
    }

    fn examined(&self) -> usize {
        self.wanted.min(self.data.len())
    }
}

/// Prefix CRCs of a window, kept every [`CHECKPOINT_EVERY`] bytes.
struct PrefixCrcs {
    /// `checkpoints[j]` is the CRC-32 of `data[..j * CHECKPOINT_EVERY]`.
    checkpoints: Vec<u32>,
    /// The last payload start asked for and its prefix CRC: starts only move forward, by a
    /// few bytes where candidates are dense.
    last_start: Option<(usize, u32)>,
    hashed: u64,
}

impl PrefixCrcs {
    fn new() -> Self {
        PrefixCrcs { checkpoints: vec![0], last_start: None, hashed: 0 }
    }

    /// CRC-32 of `data[..end]`.
    fn prefix(&mut self, data: &[u8], end: usize) -> u32 {
        let j = end / CHECKPOINT_EVERY;
        while self.checkpoints.len() <= j {
            let i = self.checkpoints.len();
            let block = &data[(i - 1) * CHECKPOINT_EVERY..i * CHECKPOINT_EVERY];
            self.checkpoints.push(crc_continue(self.checkpoints[i - 1], block));
            self.hashed += CHECKPOINT_EVERY as u64;
        }
        let tail = &data[j * CHECKPOINT_EVERY..end];
        self.hashed += tail.len() as u64;
        crc_continue(self.checkpoints[j], tail)
    }

    /// CRC-32 of `data[start..end]`.
    fn range(&mut self, data: &[u8], start: usize, end: usize) -> u32 {
        if end - start <= HASH_DIRECTLY {
            self.hashed += (end - start) as u64;
            return crc32fast::hash(&data[start..end]);
        }
        let a = match self.last_start {
            Some((at, crc)) if at <= start && start - at < start % CHECKPOINT_EVERY => {
                self.hashed += (start - at) as u64;
                crc_continue(crc, &data[at..start])
            }
            _ => self.prefix(data, start),
        };
        self.last_start = Some((start, a));
        let b = self.prefix(data, end);
        b ^ crc_mul(a, crc_x8n(end - start))
    }
}

/// Position of the first complete, CRC-valid frame in the window (a frame header then its
/// payload). A false match needs a plausible length and a 32-bit CRC collision: about 2^-32
/// per position. See "Finding the next good frame after damage" above for the cost.
fn next_valid_frame<R: Read>(
    w: &mut ResyncWindow<'_, R>,
    stats: &mut ResyncStats,
) -> io::Result<Option<usize>> {
    let header = FRAME_HEADER_LEN;
    let mut crcs = PrefixCrcs::new();
    let mut found = None;
    let mut p = 0;
    // A frame needs its header and at least one payload byte.
    while w.ensure(p + header + 1)? == p + header + 1 {
        let d = &w.data;
        let len = u32::from_le_bytes([d[p], d[p + 1], d[p + 2], d[p + 3]]);
        if (1..=MAX_PAYLOAD_BYTES).contains(&len) {
            let end = p + header + len as usize;
            if w.ensure(end)? == end {
                stats.candidates += 1;
                let d = &w.data;
                let crc = u32::from_le_bytes([d[p + 4], d[p + 5], d[p + 6], d[p + 7]]);
                if crcs.range(d, p + header, end) == crc {
                    found = Some(p);
                    break;
                }
            }
        }
        p += 1;
    }
    stats.searches += 1;
    stats.bytes_examined += w.examined() as u64;
    stats.bytes_hashed += crcs.hashed;
    Ok(found)
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
    resync: ResyncStats,
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
            resync: ResyncStats::default(),
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
        let mut data = Vec::with_capacity(fh.len() + payload.len() + RESYNC_READ_CHUNK);
        data.extend_from_slice(&fh[1..]);
        data.extend_from_slice(payload);
        // Bytes read ahead by an earlier search come before the rest of the file.
        if let Some(pending) = self.pending.take() {
            let at = (pending.position() as usize).min(pending.get_ref().len());
            data.extend_from_slice(&pending.get_ref()[at..]);
        }
        let cap = (MAX_RESYNC_BYTES as usize).max(data.len());
        let mut window = ResyncWindow { data, inner: &mut self.inner, cap, at_end: false, wanted: 0 };
        let found = match next_valid_frame(&mut window, &mut self.resync) {
            Ok(found) => found,
            Err(e) => {
                self.done = true;
                return Err(RunFileError::Io { path: self.path.clone(), source: e });
            }
        };
        let data = window.data;
        match found {
            Some(position) => {
                let skipped = 1 + position as u64;
                self.damaged.push(TornTail {
                    offset: self.offset,
                    reason: format!("{reason}; {skipped} bytes skipped"),
                });
                self.offset += skipped;
                let mut pending = std::io::Cursor::new(data);
                pending.set_position(position as u64);
                self.pending = Some(pending);
                self.read_into(buf)
            }
            None => self.tear(reason),
        }
    }

    /// Damaged regions skipped in the middle of the file (good frames follow each).
    pub fn damaged_regions(&self) -> &[TornTail] {
        &self.damaged
    }

    /// Work spent looking for good frames after damaged ones.
    pub fn resync_stats(&self) -> ResyncStats {
        self.resync
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

    /// Bytes of the file, counting buffered frames.
    pub fn len_bytes(&self) -> u64 {
        self.file_len + self.buf.len() as u64
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

    /// Deterministic pseudo-random bytes (xorshift64*).
    fn noise(seed: u64, n: usize) -> Vec<u8> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x >> 12;
                x ^= x << 25;
                x ^= x >> 27;
                (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8
            })
            .collect()
    }

    /// The search as it was: every candidate's payload hashed on its own. The reference the
    /// fast search must agree with exactly.
    fn next_valid_frame_direct(data: &[u8]) -> Option<usize> {
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

    fn search(data: &[u8], cap: usize) -> (Option<usize>, ResyncStats) {
        let mut inner = data;
        let mut w = ResyncWindow { data: Vec::new(), inner: &mut inner, cap, at_end: false, wanted: 0 };
        let mut stats = ResyncStats::default();
        let found = next_valid_frame(&mut w, &mut stats).unwrap();
        (found, stats)
    }

    #[test]
    fn crc_of_a_range_from_prefix_crcs() {
        let data = noise(7, 70_000);
        let mut crcs = PrefixCrcs::new();
        let mut rng = noise(8, 4000).into_iter();
        let mut next = || rng.next().unwrap() as usize;
        for i in 0..1000 {
            let a = (next() << 8 | next()) % data.len();
            // Short, checkpoint-straddling and long ranges, and the full 2^24 power table.
            let span = match i % 4 {
                0 => next() % 40,
                1 => next() * 37 % 600,
                _ => next() << 8 | next(),
            };
            let b = (a + span).min(data.len());
            assert_eq!(crcs.range(&data, a, b), crc32fast::hash(&data[a..b]), "{a}..{b}");
        }
        // x^(8n) agrees with n zero bytes through the register, at the table's seams too;
        // beyond, products of powers must add exponents.
        let mut v = CRC_ONE;
        for n in 0..=65_537usize {
            if [0, 1, 4095, 4096, 4097, 65_536, 65_537].contains(&n) {
                assert_eq!(crc_x8n(n), v, "n = {n}");
            }
            v = crc_mul_x8(v);
        }
        assert_eq!(crc_mul(crc_x8n(1 << 23), crc_x8n(1 << 23)), crc_x8n(1 << 24));
        assert_eq!(crc_mul(crc_x8n(12_345), crc_x8n(4_000_000)), crc_x8n(4_012_345));
        assert_eq!(crc_continue(0, &data[..1000]), crc32fast::hash(&data[..1000]));
        assert_eq!(crc_continue(crc32fast::hash(&data[..10]), &data[10..50]), crc32fast::hash(&data[..50]));
    }

    /// Windows full of plausible lengths, real frames (some inside others' payloads, some cut
    /// short, some with a wrong CRC) and noise: the fast search must pick exactly the position
    /// the direct one picks, which makes it lose nothing the direct one keeps.
    #[test]
    fn fast_search_finds_what_the_direct_search_finds() {
        let mut found = 0;
        for case in 0..400u64 {
            let mut rng = noise(case * 7919 + 1, 1 << 14).into_iter().cycle();
            let mut next = || rng.next().unwrap();
            let size = 64 + (next() as usize) * 8 + (next() as usize % 8);
            let mut data = Vec::with_capacity(size + 600);
            while data.len() < size {
                match next() % 6 {
                    // Bytes that make small plausible lengths common.
                    0 | 1 => {
                        data.extend((0..1 + next() % 12).map(|_| [0, 0, 1, next() % 40][next() as usize % 4]))
                    }
                    2 => data.extend((0..1 + next() % 12).map(|_| next())),
                    _ => {
                        let len = 1 + next() as usize % 300;
                        let payload = noise(u64::from(next()) << 8 | u64::from(next()), len);
                        let mut crc = crc32fast::hash(&payload);
                        if next() % 4 == 0 {
                            crc ^= 1 << (next() % 32);
                        }
                        data.extend_from_slice(&(len as u32).to_le_bytes());
                        data.extend_from_slice(&crc.to_le_bytes());
                        // Sometimes cut short: the frame runs into what follows.
                        let keep = if next() % 5 == 0 { next() as usize % len } else { len };
                        data.extend_from_slice(&payload[..keep]);
                    }
                }
            }
            // Skip the first frame header so that the search starts inside damage.
            let start = next() as usize % 9;
            let window = &data[start..];
            let direct = next_valid_frame_direct(window);
            let (fast, stats) = search(window, usize::MAX);
            assert_eq!(fast, direct, "case {case}");
            // A cap cuts the window short exactly as a shorter window would.
            let cap = window.len() / 2;
            assert_eq!(search(window, cap).0, next_valid_frame_direct(&window[..cap]), "case {case}, cap");
            assert!(stats.bytes_examined <= window.len() as u64);
            found += usize::from(direct.is_some());
        }
        assert!(found > 300, "the cases must mostly contain frames to find ({found})");
    }

    #[test]
    fn search_work_is_linear_in_the_bytes_looked_at() {
        // Every position has a plausible length (1, 2^24, 2^16, 2^8): the direct search hashes
        // 2^16 bytes at every fourth position.
        let mut data: Vec<u8> = [1u8, 0, 0, 0].repeat(200_000);
        let payload = noise(3, 5000);
        data.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        data.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
        data.extend_from_slice(&payload);
        let (found, stats) = search(&data, usize::MAX);
        assert_eq!(found, Some(800_000));
        assert_eq!(stats.bytes_examined, data.len() as u64);
        // 2^24 does not fit; 2^16 fits but near the end.
        assert!(stats.candidates >= 550_000, "{stats:?}");
        // Checkpoints (one pass) plus at most two sub-checkpoint tails per candidate.
        let bound = stats.bytes_examined + 2 * CHECKPOINT_EVERY as u64 * stats.candidates;
        assert!(stats.bytes_hashed <= bound, "{stats:?}");
        assert!(stats.bytes_hashed <= 8 * stats.bytes_examined, "{stats:?}");
        // What the direct search would hash here: about 2^16 bytes per position.
        let direct: u64 = (0..800_000usize)
            .filter_map(|p| {
                let len = u32::from_le_bytes(data[p..p + 4].try_into().unwrap()) as usize;
                (len <= MAX_PAYLOAD_BYTES as usize && p + 8 + len <= data.len()).then_some(len as u64)
            })
            .sum();
        assert!(direct > 1000 * stats.bytes_hashed, "direct {direct}, {stats:?}");
    }
}
