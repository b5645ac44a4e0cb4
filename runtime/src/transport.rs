//! Getting records out of the process: addresses, socket framing, and the client.
//!
//! The client lives in someone else's process (DESIGN.md "Runtime rules"): producers hand it
//! encoded records with [`Client::send`], which never blocks, never allocates beyond the
//! payload it is given, and drops (with a counter) when the bounded queue is full. One sender
//! thread owns every socket and file; it connects with capped exponential backoff, resends the
//! session preamble on every new connection, and either spools to a run file or leaves records
//! queued (dropping once the queue is full) while no collector is reachable.
//!
//! A new connection is on trial until the collector shows that it serves it (a full collector
//! accepts and closes at once): only the preamble goes out before, and a connection refused
//! that way grows the backoff like a failed connect. See [`Client`] for the exact rules.
//!
//! Socket framing is `[u32 payload length LE][payload]`, payloads of 1 to [`MAX_FRAME_BYTES`]
//! bytes. The collector never writes back. Delivery is at most once: the records of a write
//! that fails before any of its bytes went out are kept for the next connection, but those of
//! a write that fails part way are counted as dropped even though the collector may have
//! received some of them (sending them again could store them twice).

use crate::runfile::{RunFileError, RunWriter, MAX_PAYLOAD_BYTES};
use crossbeam_queue::ArrayQueue;
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::{self, JoinHandle, Thread};
use std::time::{Duration, Instant};

/// Largest payload of one socket frame. Records are a few hundred bytes (a few KiB with logits
/// rows); a larger length means a confused or hostile peer.
pub const MAX_FRAME_BYTES: usize = 1 << 20;
const _: () = assert!(MAX_FRAME_BYTES <= MAX_PAYLOAD_BYTES as usize);

// ---------------------------------------------------------------------------------------------
// Addresses

/// Where records go (client) or come from (collector).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Address {
    /// `unix:PATH`, or a bare path.
    Unix(PathBuf),
    /// `tcp:HOST:PORT` (`tcp:PORT` means 127.0.0.1; IPv6 hosts in brackets: `tcp:[::1]:7000`).
    Tcp { host: String, port: u16 },
    /// `file:PATH`: the client writes a run file itself, no collector involved.
    File(PathBuf),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    #[error("empty address; expected unix:PATH, tcp:HOST:PORT or file:PATH")]
    Empty,
    #[error("unknown address scheme `{0}:`; expected unix:PATH, tcp:HOST:PORT or file:PATH")]
    UnknownScheme(String),
    #[error("`{0}:` address without a path; expected {0}:PATH")]
    MissingPath(&'static str),
    #[error("bad tcp address `{input}`: {reason}; expected tcp:HOST:PORT, e.g. tcp:127.0.0.1:7000")]
    BadTcp { input: String, reason: String },
}

impl FromStr for Address {
    type Err = AddressError;

    fn from_str(s: &str) -> Result<Address, AddressError> {
        if s.is_empty() {
            return Err(AddressError::Empty);
        }
        if let Some(rest) = s.strip_prefix("unix:") {
            return if rest.is_empty() {
                Err(AddressError::MissingPath("unix"))
            } else {
                Ok(Address::Unix(PathBuf::from(rest)))
            };
        }
        if let Some(rest) = s.strip_prefix("file:") {
            return if rest.is_empty() {
                Err(AddressError::MissingPath("file"))
            } else {
                Ok(Address::File(PathBuf::from(rest)))
            };
        }
        if let Some(rest) = s.strip_prefix("tcp:") {
            return parse_tcp(s, rest);
        }
        // `udp:...` or `http:...` is a mistake, not a socket file named that way; a path with a
        // slash before its first colon is a path.
        if let Some((scheme, _)) = s.split_once(':') {
            let looks_like_scheme = !scheme.is_empty()
                && scheme.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
            if looks_like_scheme {
                return Err(AddressError::UnknownScheme(scheme.to_string()));
            }
        }
        Ok(Address::Unix(PathBuf::from(s)))
    }
}

fn parse_tcp(input: &str, rest: &str) -> Result<Address, AddressError> {
    let bad = |reason: String| AddressError::BadTcp { input: input.to_string(), reason };
    let (host, port) = match rest.rsplit_once(':') {
        Some((host, port)) => (host, port),
        None if !rest.is_empty() => ("127.0.0.1", rest),
        None => return Err(bad("missing port".into())),
    };
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    if host.is_empty() {
        return Err(bad("missing host".into()));
    }
    let port =
        port.parse::<u16>().map_err(|_| bad(format!("port `{port}` is not a number from 0 to 65535")))?;
    Ok(Address::Tcp { host: host.to_string(), port })
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Address::Unix(p) => write!(f, "unix:{}", p.display()),
            Address::Tcp { host, port } if host.contains(':') => write!(f, "tcp:[{host}]:{port}"),
            Address::Tcp { host, port } => write!(f, "tcp:{host}:{port}"),
            Address::File(p) => write!(f, "file:{}", p.display()),
        }
    }
}

/// The address a collector listens on and a client sends to when none is given:
/// `$XDG_RUNTIME_DIR/quantshadow.sock` (a per-user 0700 directory), else
/// `/tmp/quantshadow-$UID.sock`.
pub fn default_address() -> Address {
    if let Some(dir) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        let dir = PathBuf::from(dir);
        if dir.is_dir() {
            return Address::Unix(dir.join("quantshadow.sock"));
        }
    }
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    Address::Unix(PathBuf::from(format!("/tmp/quantshadow-{uid}.sock")))
}

// ---------------------------------------------------------------------------------------------
// Framing

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("frame length {len} exceeds the maximum {max}")]
    Oversize { len: usize, max: usize },
    #[error("zero-length frame")]
    Empty,
    #[error("connection closed in the middle of a frame ({have} of {need} bytes)")]
    Truncated { have: usize, need: usize },
    #[error("{0}")]
    Io(#[from] io::Error),
}

impl FrameError {
    /// A read timeout (socket with `set_read_timeout`): nothing is lost, call again.
    pub fn is_timeout(&self) -> bool {
        matches!(self, FrameError::Io(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut))
    }
}

fn check_frame_len(len: usize) -> Result<(), FrameError> {
    if len == 0 {
        Err(FrameError::Empty)
    } else if len > MAX_FRAME_BYTES {
        Err(FrameError::Oversize { len, max: MAX_FRAME_BYTES })
    } else {
        Ok(())
    }
}

/// Appends one socket frame to `out`.
pub fn push_frame(out: &mut Vec<u8>, payload: &[u8]) -> Result<(), FrameError> {
    check_frame_len(payload.len())?;
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(payload);
    Ok(())
}

/// Writes one socket frame (convenience for simple writers; the client batches instead).
pub fn write_frame(w: &mut impl Write, payload: &[u8]) -> Result<(), FrameError> {
    check_frame_len(payload.len())?;
    w.write_all(&(payload.len() as u32).to_le_bytes())?;
    w.write_all(payload)?;
    Ok(())
}

/// Reads socket frames with one buffer: payloads are returned as slices into it, so a stream
/// of small frames costs one `read` per buffer-full and no allocation per frame. Timeouts are
/// resumable: a partial frame stays buffered until the rest arrives.
pub struct FrameReader<R> {
    inner: R,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    deadline: Option<Instant>,
}

const FRAME_READER_INITIAL: usize = 256 << 10;

impl<R: Read> FrameReader<R> {
    pub fn new(inner: R) -> Self {
        FrameReader { inner, buf: vec![0; FRAME_READER_INITIAL], start: 0, end: 0, deadline: None }
    }

    /// After `deadline`, reads stop and [`Self::next_frame`] fails with a timeout
    /// ([`FrameError::is_timeout`]; a partial frame stays buffered) instead of reading on. A
    /// read timeout alone does not bound a read: a peer trickling a byte at a time never
    /// triggers it.
    pub fn set_deadline(&mut self, deadline: Option<Instant>) {
        self.deadline = deadline;
    }

    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    pub fn get_mut(&mut self) -> &mut R {
        &mut self.inner
    }

    /// Bytes received but not yet returned as frames.
    pub fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// Whether [`Self::next_frame`] would return a frame (or a framing error) without reading.
    pub fn has_buffered_frame(&self) -> bool {
        let avail = &self.buf[self.start..self.end];
        if avail.len() < 4 {
            return false;
        }
        let len = u32::from_le_bytes([avail[0], avail[1], avail[2], avail[3]]) as usize;
        len == 0 || len > MAX_FRAME_BYTES || avail.len() >= 4 + len
    }

    /// The next frame's payload; `Ok(None)` on a clean end of stream (between frames).
    pub fn next_frame(&mut self) -> Result<Option<&[u8]>, FrameError> {
        if !self.fill(4)? {
            return Ok(None);
        }
        let h = &self.buf[self.start..self.start + 4];
        let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize;
        check_frame_len(len)?;
        if !self.fill(4 + len)? {
            return Err(FrameError::Truncated { have: self.buffered(), need: 4 + len });
        }
        let payload = self.start + 4..self.start + 4 + len;
        self.start = payload.end;
        Ok(Some(&self.buf[payload]))
    }

    /// Ensures `need` bytes are buffered. `Ok(false)`: end of stream before that; an error
    /// only if the stream ended inside the first 4 bytes of a frame.
    fn fill(&mut self, need: usize) -> Result<bool, FrameError> {
        if self.buffered() >= need {
            return Ok(true);
        }
        if self.buf.len() - self.start < need {
            // Move the partial frame to the front; grow only for frames larger than the buffer.
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
            if self.buf.len() < need {
                self.buf.resize(need, 0);
            }
        }
        while self.buffered() < need {
            if self.deadline.is_some_and(|t| Instant::now() >= t) {
                return Err(FrameError::Io(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("deadline passed with {} of {need} bytes buffered", self.buffered()),
                )));
            }
            match self.inner.read(&mut self.buf[self.end..]) {
                Ok(0) if self.buffered() == 0 => return Ok(false),
                Ok(0) if need == 4 => {
                    return Err(FrameError::Truncated { have: self.buffered(), need: 4 });
                }
                Ok(0) => return Ok(false),
                Ok(n) => self.end += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(FrameError::Io(e)),
            }
        }
        Ok(true)
    }
}

// ---------------------------------------------------------------------------------------------
// Client

#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Records held while the sender is busy or no collector is reachable; beyond, drops.
    pub queue_capacity: usize,
    /// Payload bytes held in the queue; beyond, drops. Bounds memory when records are large
    /// (a record may be up to [`MAX_FRAME_BYTES`]; a larger budget than that is sensible).
    pub max_queued_bytes: usize,
    /// Sent first on every connection (and written first into a spool or `file:` run file):
    /// the encoded session record, so that every connection is self-describing.
    pub preamble: Option<Vec<u8>>,
    /// While no collector is reachable, write records to this run file instead of holding
    /// them. Not replayed to the collector later: pass it to the report with the main run file.
    pub spool: Option<PathBuf>,
    /// TCP connect timeout (unix sockets connect or fail at once).
    pub connect_timeout: Duration,
    /// A write that makes no progress for this long counts as a dead collector; a new
    /// connection whose trial has not ended by then counts as refused (see [`Client`]).
    pub write_timeout: Duration,
    /// First retry delay after a failed connection attempt; doubled per consecutive failure up
    /// to `backoff_max` (see [`Client`]).
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// Largest size of a `file:` run file or the spool: records beyond are dropped and counted
    /// (a long run with every call checked must not fill the host's disk). The closing record
    /// is written whatever the size.
    pub max_file_bytes: u64,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            queue_capacity: 4096,
            max_queued_bytes: 16 << 20,
            preamble: None,
            spool: None,
            connect_timeout: Duration::from_secs(1),
            write_timeout: Duration::from_secs(2),
            backoff_initial: Duration::from_millis(20),
            backoff_max: Duration::from_secs(2),
            max_file_bytes: 4 << 30,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// Records waiting now: in the queue, or kept from a write that found the connection
    /// closed (see [`Client`]).
    pub queued: u64,
    /// Records delivered to a collector (or to the run file of a `file:` address).
    pub sent: u64,
    /// Records written to the spool file.
    pub spooled: u64,
    /// Records lost: queue full, undeliverable, refused (empty or oversize), or left over when
    /// the client closed.
    pub dropped: u64,
    /// Connections accepted (their trial passed, see [`Client`]) after the first.
    pub reconnects: u64,
    /// Connections the collector closed, or did not serve, during their trial: a full
    /// collector refuses a client this way.
    pub refused: u64,
    /// The wait before the next connection attempt, as set by the latest failed one (connect
    /// error or refused connection): `backoff_initial` after the first failure, doubled per
    /// consecutive failure up to `backoff_max`. Zero once a connection is accepted, and after
    /// losing one that served for a second (the next attempt is immediate); a connection lost
    /// sooner waits `backoff_initial`, doubled for each such loss in a row.
    pub retry_delay: Duration,
    /// Rounds of the sender thread's loop so far: it rests between them, so this grows with
    /// the records and connection events, never with time alone.
    pub sender_rounds: u64,
}

/// Why a frame of `payload` bytes may not go into the run file `w`
/// ([`ClientOptions::max_file_bytes`]; the closing record always may); None when it may.
fn file_full(opts: &ClientOptions, closing_record: bool, w: &RunWriter, payload: usize) -> Option<String> {
    let after = w.len_bytes().saturating_add(payload as u64 + 8);
    (after > opts.max_file_bytes && !closing_record).then(|| {
        format!(
            "{} reached its limit of {} bytes: later records are dropped (counted)",
            w.path().display(),
            opts.max_file_bytes
        )
    })
}

const PHASE_RUN: u8 = 0;
/// `close` started: deliver what is queued, then report drained.
const PHASE_DRAIN: u8 = 1;
/// The closing record is in `final_payload`: send it and exit.
const PHASE_FINAL: u8 = 2;
/// Give up: exit as soon as possible (client dropped, or the close deadline passed).
const PHASE_ABANDON: u8 = 3;

#[derive(Default)]
struct Progress {
    drained: bool,
    done: bool,
}

struct Shared {
    queue: ArrayQueue<Vec<u8>>,
    /// Payload bytes in `queue` (and framed bytes of a kept batch), bounded by
    /// `max_queued_bytes`.
    queued_bytes: AtomicUsize,
    max_queued_bytes: usize,
    accepting: AtomicBool,
    closing: AtomicBool,
    phase: AtomicU8,
    sent: AtomicU64,
    spooled: AtomicU64,
    dropped: AtomicU64,
    reconnects: AtomicU64,
    refused: AtomicU64,
    retry_delay_ns: AtomicU64,
    sender_rounds: AtomicU64,
    /// Records the sender holds in its write buffer, not yet counted as sent or dropped.
    /// Whoever takes them (swap to 0) counts them: the sender when a write ends, or a `close`
    /// that gives up on a stuck sender, so none is counted twice or never.
    in_flight: AtomicU64,
    /// Records of a failed write that the sender keeps for the next connection (see
    /// [`Client`]). Taken the same way: by the sender, to send or drop them, or by a `close`
    /// that gives up on them (its closing record then includes them).
    kept: AtomicU64,
    /// Held while records move between `in_flight` and `kept`, and while a `close` takes from
    /// both, so that each record is in exactly one of them whenever it is counted.
    held_lock: Mutex<()>,
    /// The sender is (about to be) parked and wants an unpark on the next push.
    sleeping: AtomicBool,
    sender: OnceLock<Thread>,
    final_payload: Mutex<Option<Vec<u8>>>,
    /// When the sender must be done with the closing work.
    close_deadline: Mutex<Option<Instant>>,
    progress: Mutex<Progress>,
    progress_cv: Condvar,
}

impl Shared {
    fn wake_sender(&self) {
        if let Some(t) = self.sender.get() {
            t.unpark();
        }
    }

    fn set_progress(&self, f: impl FnOnce(&mut Progress)) {
        let mut p = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut p);
        self.progress_cv.notify_all();
    }

    /// Waits until `cond` holds or `until`; returns whether it holds.
    fn wait_progress(&self, until: Instant, cond: impl Fn(&Progress) -> bool) -> bool {
        let mut p = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if cond(&p) {
                return true;
            }
            let now = Instant::now();
            if now >= until {
                return false;
            }
            p = match self.progress_cv.wait_timeout(p, until - now) {
                Ok((p, _)) => p,
                Err(e) => e.into_inner().0,
            };
        }
    }

    fn pop(&self) -> Option<Vec<u8>> {
        let p = self.queue.pop()?;
        self.queued_bytes.fetch_sub(p.len(), Ordering::Relaxed);
        Some(p)
    }

    /// Drops everything waiting (queued and kept); returns how many.
    fn drop_queued(&self) -> u64 {
        let mut n = 0;
        while self.pop().is_some() {
            n += 1;
        }
        n += {
            let _held = self.held_lock.lock().unwrap_or_else(|e| e.into_inner());
            self.kept.swap(0, Ordering::AcqRel)
        };
        self.dropped.fetch_add(n, Ordering::Relaxed);
        n
    }

    /// Drops everything not delivered, the sender's write buffer included: for a sender that
    /// is stuck or gone.
    fn drop_all_held(&self) {
        self.drop_queued();
        let _held = self.held_lock.lock().unwrap_or_else(|e| e.into_inner());
        let n = self.kept.swap(0, Ordering::AcqRel) + self.in_flight.swap(0, Ordering::AcqRel);
        self.dropped.fetch_add(n, Ordering::Relaxed);
    }
}

/// Non-blocking record sender. See the module documentation.
///
/// # Connections
///
/// A new socket connection is on trial until the collector shows that it serves it. Only the
/// preamble is written before that, so a collector that refuses the connection (a full one
/// accepts it and closes it at once) costs no record:
///
/// - unix socket with a preamble: accepted once the peer has *read* the preamble, i.e. our
///   send queue (`SIOCOUTQ`) is empty. A unix peer's unread bytes stay charged to our socket,
///   and a refusing collector never reads.
/// - TCP, or no preamble: accepted once the preamble is acknowledged (TCP) and the connection
///   has stayed open for 50 ms without a hang-up. The peer's reading cannot be seen there: a
///   collector that takes longer than that to refuse loses the first write after the trial
///   (counted as sent).
/// - A hang-up during the trial, a failed preamble write, or no proof within `write_timeout`
///   (the close deadline when closing) refuses the connection: it is closed, counted in
///   [`ClientStats::refused`], and the next attempt waits as after a failed connect.
///
/// Backoff: every failed attempt (connect error or refused connection) waits the current
/// delay (`backoff_initial` at first) and doubles it, up to `backoff_max`; an accepted
/// connection resets it. Losing an accepted connection that served for a second or more (a
/// collector restart, or an idle client evicted by a full collector) retries at once. Accepted
/// connections lost sooner, one after another, wait `backoff_initial` doubled per such loss in
/// a row (up to `backoff_max`), so a collector that reads the preamble and hangs up is not
/// redialled at every write; their kept records wait for the next connection.
///
/// A write that fails: if none of its bytes reached the socket (the hang-up was seen before
/// writing, or the first send failed), its records are kept and go first on the next accepted
/// connection, right after the preamble. While they wait they count against `queue_capacity`
/// and `max_queued_bytes`, producers' records go on into the queue (overflow is dropped and
/// counted), an attempt that fails moves them to the spool if there is one, and a `close` that
/// cannot send them counts them as dropped before it builds the closing record. If part of the
/// write was transferred, all its records are dropped (counted): the collector may have stored
/// the complete frames among them, and sending those again would store them twice.
pub struct Client {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
    address: Address,
}

impl Client {
    /// Starts the sender thread. Never fails: if the thread cannot be started, every record is
    /// dropped and counted, so an engine keeps running without checks.
    pub fn start(address: Address, options: ClientOptions) -> Client {
        let shared = Arc::new(Shared {
            queue: ArrayQueue::new(options.queue_capacity.max(1)),
            queued_bytes: AtomicUsize::new(0),
            max_queued_bytes: options.max_queued_bytes,
            accepting: AtomicBool::new(true),
            closing: AtomicBool::new(false),
            phase: AtomicU8::new(PHASE_RUN),
            sent: AtomicU64::new(0),
            spooled: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            reconnects: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            retry_delay_ns: AtomicU64::new(0),
            sender_rounds: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            kept: AtomicU64::new(0),
            held_lock: Mutex::new(()),
            sleeping: AtomicBool::new(false),
            sender: OnceLock::new(),
            final_payload: Mutex::new(None),
            close_deadline: Mutex::new(None),
            progress: Mutex::new(Progress::default()),
            progress_cv: Condvar::new(),
        });
        let sender = Sender::new(shared.clone(), address.clone(), options);
        let spawned = thread::Builder::new()
            .name("quantshadow-tx".into())
            // Records are built by producers; the sender only moves bytes.
            .stack_size(256 << 10)
            .spawn(move || sender.run_guarded());
        let thread = match spawned {
            Ok(handle) => {
                let _ = shared.sender.set(handle.thread().clone());
                Some(handle)
            }
            Err(e) => {
                crate::engine::log::shared_warn(&format!(
                    "cannot start the sender thread ({e}); records will be dropped"
                ));
                shared.accepting.store(false, Ordering::Release);
                shared.set_progress(|p| {
                    p.drained = true;
                    p.done = true;
                });
                None
            }
        };
        Client { shared, thread: Mutex::new(thread), address }
    }

    pub fn address(&self) -> &Address {
        &self.address
    }

    /// Queues one encoded record. Never blocks: `false` (and a counted drop) when the queue is
    /// full, the client is closing, or the payload is empty or larger than [`MAX_FRAME_BYTES`].
    pub fn send(&self, payload: Vec<u8>) -> bool {
        let s = &*self.shared;
        if payload.is_empty() || payload.len() > MAX_FRAME_BYTES || !s.accepting.load(Ordering::Acquire) {
            s.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let len = payload.len();
        if s.queued_bytes.fetch_add(len, Ordering::Relaxed) + len > s.max_queued_bytes {
            s.queued_bytes.fetch_sub(len, Ordering::Relaxed);
            s.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        // Records kept from a failed write take room in the queue while they wait (rare: one
        // relaxed load otherwise).
        let kept = s.kept.load(Ordering::Relaxed);
        let room = kept == 0 || (s.queue.len() as u64).saturating_add(kept) < s.queue.capacity() as u64;
        if !room || s.queue.push(payload).is_err() {
            s.queued_bytes.fetch_sub(len, Ordering::Relaxed);
            s.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        // Pairs with the fence in `Sender::park`: either the sender sees this record before it
        // parks, or we see `sleeping` and wake it. Only a parked sender costs a syscall.
        fence(Ordering::SeqCst);
        if s.sleeping.load(Ordering::Relaxed) && s.sleeping.swap(false, Ordering::AcqRel) {
            s.wake_sender();
        }
        true
    }

    pub fn stats(&self) -> ClientStats {
        let s = &*self.shared;
        ClientStats {
            queued: s.queue.len() as u64 + s.kept.load(Ordering::Relaxed),
            sent: s.sent.load(Ordering::Relaxed),
            spooled: s.spooled.load(Ordering::Relaxed),
            dropped: s.dropped.load(Ordering::Relaxed),
            reconnects: s.reconnects.load(Ordering::Relaxed),
            refused: s.refused.load(Ordering::Relaxed),
            retry_delay: Duration::from_nanos(s.retry_delay_ns.load(Ordering::Relaxed)),
            sender_rounds: s.sender_rounds.load(Ordering::Relaxed),
        }
    }

    /// Delivers what is queued (and kept), then the closing record built by `final_payload`
    /// from the number of records dropped so far, and stops the sender. Returns within
    /// `deadline` (plus scheduling noise) whatever the collector does; records not delivered by
    /// then are counted as dropped (those the closing record could not include, ones the sender
    /// was writing when time ran out, are in the returned stats only). Later calls return the
    /// stats at once.
    pub fn close(&self, final_payload: impl FnOnce(u64) -> Vec<u8>, deadline: Duration) -> ClientStats {
        let s = &*self.shared;
        let t0 = Instant::now();
        // A deadline too far to represent (Duration::MAX) means "a day": never a panic here.
        let end = t0.checked_add(deadline).unwrap_or_else(|| t0 + Duration::from_secs(86_400));
        // Only the first call closes; a concurrent or later one just reports.
        if s.closing.swap(true, Ordering::AcqRel) || s.phase.load(Ordering::Acquire) != PHASE_RUN {
            return self.stats();
        }
        s.accepting.store(false, Ordering::Release);
        // Keep a quarter of the time (at most 250 ms) for the closing record itself: queued
        // records may use the rest, and the sender's writes give up when it is over.
        let drain_end = end - (deadline / 4).min(Duration::from_millis(250));
        *s.close_deadline.lock().unwrap_or_else(|e| e.into_inner()) = Some(drain_end);
        s.phase.store(PHASE_DRAIN, Ordering::Release);
        s.wake_sender();
        s.wait_progress(drain_end, |p| p.drained || p.done);
        // Whatever the sender could not take in time (queued, or kept for a connection that
        // did not come) will not be sent: count it now so the closing record includes it.
        s.drop_queued();
        let payload = final_payload(s.dropped.load(Ordering::Relaxed));
        if payload.is_empty() || payload.len() > MAX_FRAME_BYTES {
            s.dropped.fetch_add(1, Ordering::Relaxed);
        } else {
            *s.final_payload.lock().unwrap_or_else(|e| e.into_inner()) = Some(payload);
        }
        *s.close_deadline.lock().unwrap_or_else(|e| e.into_inner()) = Some(end);
        s.phase.store(PHASE_FINAL, Ordering::Release);
        s.wake_sender();
        if s.wait_progress(end, |p| p.done) {
            if let Some(h) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
                // Done was the sender's last act: this join returns at once.
                let _ = h.join();
            }
        } else {
            // The sender is stuck (a connect or write that outlives the deadline): leave it
            // behind; it exits on its own when the call returns. Records stuck in its write
            // buffer are counted here, so the stats returned now are complete (the sender
            // finds nothing left to count).
            s.phase.store(PHASE_ABANDON, Ordering::Release);
            s.wake_sender();
            s.drop_all_held();
        }
        // Not taken: no sender thread, or it never got to it.
        if s.final_payload.lock().unwrap_or_else(|e| e.into_inner()).take().is_some() {
            s.dropped.fetch_add(1, Ordering::Relaxed);
        }
        self.stats()
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        // Without `close`, nobody waits: ask the sender to stop and leave. It writes what it
        // already holds (bounded by a short write timeout) and exits.
        let s = &*self.shared;
        s.accepting.store(false, Ordering::Release);
        if !s.progress.lock().unwrap_or_else(|e| e.into_inner()).done {
            {
                let mut end = s.close_deadline.lock().unwrap_or_else(|e| e.into_inner());
                let soon = Instant::now() + ABANDON_WRITE;
                *end = Some(end.map_or(soon, |e| e.min(soon)));
            }
            s.phase.store(PHASE_ABANDON, Ordering::Release);
        }
        s.wake_sender();
    }
}

/// An open collector connection.
enum Conn {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Conn {
    fn fd(&self) -> RawFd {
        match self {
            Conn::Unix(s) => s.as_raw_fd(),
            Conn::Tcp(s) => s.as_raw_fd(),
        }
    }

    fn set_write_timeout(&self, t: Duration) -> io::Result<()> {
        let t = Some(t);
        match self {
            Conn::Unix(s) => s.set_write_timeout(t),
            Conn::Tcp(s) => s.set_write_timeout(t),
        }
    }

    /// The collector never writes, so a hang-up is the only thing to see: checked before a
    /// write so that records are not written into a socket whose reader is gone (TCP accepts
    /// the first write after the peer closed).
    fn peer_closed(&self) -> bool {
        let mut p = libc::pollfd { fd: self.fd(), events: libc::POLLRDHUP, revents: 0 };
        // SAFETY: one valid pollfd, zero timeout.
        let rc = unsafe { libc::poll(&mut p, 1, 0) };
        rc > 0 && p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0
    }

    /// Waits up to `timeout` (at least a millisecond) for a hang-up.
    fn wait_hangup(&self, timeout: Duration) {
        let mut p = libc::pollfd { fd: self.fd(), events: libc::POLLRDHUP, revents: 0 };
        let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as libc::c_int;
        // SAFETY: one valid pollfd; EINTR only ends the wait early.
        unsafe { libc::poll(&mut p, 1, ms) };
    }

    /// Bytes written that the peer has not consumed yet (`SIOCOUTQ`): on a unix socket until
    /// the peer has *read* them (they stay charged to our socket until then, and are released
    /// only after the hang-up when a peer closes without reading them); on TCP until the peer's
    /// kernel acknowledged them. `None` if the kernel does not say.
    fn unsent(&self) -> Option<usize> {
        let mut n: libc::c_int = 0;
        // SAFETY: SIOCOUTQ (TIOCOUTQ) writes one int; the fd is open while `self` lives.
        let rc = unsafe { libc::ioctl(self.fd(), libc::TIOCOUTQ, &mut n) };
        (rc == 0).then_some(n.max(0) as usize)
    }

    /// Writes all of `buf`, giving up once `deadline(last progress)` has passed. The deadline
    /// is asked again after every blocked slice (the socket's send timeout is
    /// [`WRITE_SLICE`]), so a `close` or a drop that shortens it takes effect mid-write.
    /// Uses send(MSG_NOSIGNAL): a host process that has not ignored SIGPIPE must not die
    /// because a collector went away. On failure, says how many bytes went out before it.
    fn send_all(
        &self,
        mut buf: &[u8],
        deadline: impl Fn(Instant) -> Instant,
    ) -> Result<(), (usize, io::Error)> {
        let mut progress = Instant::now();
        let mut transferred = 0;
        while !buf.is_empty() {
            if Instant::now() >= deadline(progress) {
                return Err((transferred, io::ErrorKind::TimedOut.into()));
            }
            // SAFETY: `buf` is valid for reads of its length; the fd is open while `self` lives.
            let n = unsafe { libc::send(self.fd(), buf.as_ptr().cast(), buf.len(), libc::MSG_NOSIGNAL) };
            if n < 0 {
                let e = io::Error::last_os_error();
                match e.kind() {
                    // A slice of the send timeout passed without room in the socket: look at
                    // the deadline again.
                    io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                        continue
                    }
                    _ => return Err((transferred, e)),
                }
            }
            if n == 0 {
                return Err((transferred, io::ErrorKind::WriteZero.into()));
            }
            buf = &buf[n as usize..];
            transferred += n as usize;
            progress = Instant::now();
        }
        Ok(())
    }
}

/// Where the sender puts records right now.
enum Sink {
    None,
    Socket(Conn),
    /// `file:` address.
    File(RunWriter),
}

/// A new socket connection on trial (see [`Client`]).
struct Trial {
    since: Instant,
    /// A preamble was written: on a unix socket, its being read is the proof.
    preamble: bool,
    /// Next wait for a hang-up between looks; grows while nothing happens.
    slice: Duration,
}

/// Records popped per round before checking phase and buffers again.
const SEND_BATCH: usize = 512;
/// Socket bytes gathered before a write.
const SOCKET_CHUNK: usize = 64 << 10;
/// How long an idle sender sleeps before looking again without a wake-up.
const IDLE_PARK: Duration = Duration::from_millis(100);
/// An accepted connection lost before serving this long makes the next attempt wait (backoff).
const STABLE_AFTER: Duration = Duration::from_secs(1);
/// Write budget when abandoning (client dropped without `close`).
const ABANDON_WRITE: Duration = Duration::from_millis(100);
/// Socket send timeout: how often a blocked write looks at its deadline again.
const WRITE_SLICE: Duration = Duration::from_millis(20);
/// Where the peer's reading cannot be observed (TCP, or no preamble): how long a new
/// connection must stay open without a hang-up to be accepted. A full collector closes a
/// connection as soon as it accepts it, well within this unless it is overloaded.
const TRIAL_QUIET: Duration = Duration::from_millis(50);
/// First and longest wait between looks at a connection on trial (a hang-up ends a wait at
/// once; the peer reading the preamble does not).
const TRIAL_SLICE_MIN: Duration = Duration::from_millis(1);
const TRIAL_SLICE_MAX: Duration = Duration::from_millis(20);

struct Sender {
    shared: Arc<Shared>,
    address: Address,
    opts: ClientOptions,
    sink: Sink,
    spool: Option<RunWriter>,
    /// Socket frames not written yet and how many producer records they hold. While
    /// `kept_bytes > 0` they are exactly the kept batch, and nothing is added to them.
    out: Vec<u8>,
    out_records: u64,
    /// Bytes of `out` kept from a failed write (counted in `queued_bytes` meanwhile); 0 if
    /// none. Their records are counted in `Shared::kept`.
    kept_bytes: usize,
    /// The socket in `sink` is on trial: nothing but the preamble has been written to it.
    trial: Option<Trial>,
    /// The closing record is being delivered: written past [`ClientOptions::max_file_bytes`].
    closing_record: bool,
    ever_connected: bool,
    /// When the connection in `sink` was accepted (None while on trial or without one).
    accepted_at: Option<Instant>,
    /// The wait after the next accepted connection lost within [`STABLE_AFTER`] (see
    /// `connection_lost`): `backoff_initial`, doubled per such loss in a row.
    quick_backoff: Duration,
    backoff: Duration,
    next_attempt: Instant,
    /// Remembered so a persistent failure is logged once, not per attempt.
    last_error: Option<String>,
}

impl Sender {
    fn new(shared: Arc<Shared>, address: Address, opts: ClientOptions) -> Sender {
        Sender {
            shared,
            address,
            backoff: opts.backoff_initial,
            quick_backoff: opts.backoff_initial,
            opts,
            sink: Sink::None,
            spool: None,
            out: Vec::with_capacity(SOCKET_CHUNK + 4096),
            out_records: 0,
            kept_bytes: 0,
            trial: None,
            closing_record: false,
            ever_connected: false,
            accepted_at: None,
            next_attempt: Instant::now(),
            last_error: None,
        }
    }

    /// Thread body: no panic leaves this function (it would unwind into the host's runtime).
    fn run_guarded(mut self) {
        let shared = self.shared.clone();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.run()));
        if result.is_err() {
            shared.accepting.store(false, Ordering::Release);
            shared.drop_all_held();
        }
        // Always the last act, whatever happened: `close` waits for it.
        shared.set_progress(|p| {
            p.drained = true;
            p.done = true;
        });
    }

    fn phase(&self) -> u8 {
        self.shared.phase.load(Ordering::Acquire)
    }

    fn run(&mut self) {
        let mut drained_reported = false;
        loop {
            self.shared.sender_rounds.fetch_add(1, Ordering::Relaxed);
            match self.phase() {
                PHASE_ABANDON => return self.abandon(),
                PHASE_FINAL => return self.finish(),
                _ => {}
            }
            let draining = self.phase() == PHASE_DRAIN;
            if matches!(self.sink, Sink::None) && (draining || Instant::now() >= self.next_attempt) {
                self.connect();
            }
            if self.trial.is_some() {
                // Records wait (queued or kept) until the trial ends; a pending look waited a
                // slice on the socket, then the phase is looked at again.
                self.probe();
                if self.trial.is_some() {
                    continue;
                }
            }
            let moved = self.pump();
            if moved > 0 {
                continue;
            }
            let had_socket = matches!(self.sink, Sink::Socket(_));
            self.flush_all();
            if had_socket && matches!(self.sink, Sink::None) {
                // Lost it in that write (what it held may be kept): reconnect first.
                continue;
            }
            if draining && !drained_reported {
                if !self.has_destination() {
                    // Closing with nowhere to deliver: the connect attempt above just failed
                    // (or its trial did).
                    self.drop_kept();
                    self.shared.drop_queued();
                }
                if self.shared.queue.is_empty() && self.out.is_empty() {
                    drained_reported = true;
                    self.shared.set_progress(|p| p.drained = true);
                }
            }
            let nap = if !self.waits_for_attempt() || draining {
                IDLE_PARK
            } else {
                self.next_attempt.saturating_duration_since(Instant::now()).min(IDLE_PARK)
            };
            self.park(nap);
        }
    }

    fn has_destination(&self) -> bool {
        !matches!(self.sink, Sink::None) || self.spool.is_some()
    }

    /// Whether popped records can go somewhere now: not to a socket on trial, and not around a
    /// kept batch (it goes first).
    fn can_deliver(&self) -> bool {
        match self.sink {
            Sink::Socket(_) => self.trial.is_none() && self.kept_bytes == 0,
            Sink::File(_) => true,
            Sink::None => self.spool.is_some() && self.kept_bytes == 0,
        }
    }

    /// Without a connection, whether nothing can move before the next connect attempt: no
    /// spool, or records kept from the lost connection, which wait for the next one (they go
    /// before anything newer).
    fn waits_for_attempt(&self) -> bool {
        matches!(self.sink, Sink::None) && !self.can_deliver()
    }

    fn park(&self, timeout: Duration) {
        let s = &*self.shared;
        // With nothing able to move before the next connect attempt, new records change
        // nothing: producers must not wake us (one syscall per park cycle, for nothing).
        let waits = self.waits_for_attempt();
        s.sleeping.store(!waits, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        let phase = self.phase();
        // Records queued then stay queued: parking is right (not a spin until the attempt),
        // except while closing, when every round attempts a connection.
        let nothing_to_do = s.queue.is_empty() || !self.has_destination() || (waits && phase != PHASE_DRAIN);
        if nothing_to_do && (phase == PHASE_RUN || phase == PHASE_DRAIN) && !timeout.is_zero() {
            thread::park_timeout(timeout);
        }
        s.sleeping.store(false, Ordering::Relaxed);
    }

    /// Moves up to one batch from the queue to the current destination; returns how many.
    /// Stops when the socket is lost mid-batch: the rest waits for the next connection rather
    /// than being dropped.
    fn pump(&mut self) -> usize {
        let mut moved = 0;
        let on_socket = matches!(self.sink, Sink::Socket(_));
        while moved < SEND_BATCH && self.can_deliver() {
            if on_socket && !matches!(self.sink, Sink::Socket(_)) {
                break;
            }
            let Some(payload) = self.shared.pop() else { break };
            moved += 1;
            self.deliver(&payload);
        }
        moved
    }

    fn deliver(&mut self, payload: &[u8]) {
        match &mut self.sink {
            Sink::Socket(_) => {
                // Size was checked by `send`.
                let _ = push_frame(&mut self.out, payload);
                self.out_records += 1;
                self.shared.in_flight.fetch_add(1, Ordering::AcqRel);
                if self.out.len() >= SOCKET_CHUNK {
                    self.write_out();
                }
            }
            Sink::File(w) => {
                let full = file_full(&self.opts, self.closing_record, w, payload.len());
                if let Some(why) = full {
                    self.shared.dropped.fetch_add(1, Ordering::Relaxed);
                    return self.note_error(why);
                }
                match w.append(payload) {
                    Ok(()) => {
                        self.shared.sent.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => self.writer_failed(e),
                }
            }
            Sink::None => self.spool_one(payload),
        }
    }

    fn spool_one(&mut self, payload: &[u8]) {
        let Some(w) = &mut self.spool else {
            self.shared.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        };
        if let Some(why) = file_full(&self.opts, self.closing_record, w, payload.len()) {
            self.shared.dropped.fetch_add(1, Ordering::Relaxed);
            return self.note_error(why);
        }
        match w.append(payload) {
            Ok(()) => {
                self.shared.spooled.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => self.writer_failed(e),
        }
    }

    fn writer_failed(&mut self, e: RunFileError) {
        let lost = match &e {
            RunFileError::WriteFailed { lost_records, .. } => *lost_records,
            _ => 1,
        };
        self.shared.dropped.fetch_add(lost, Ordering::Relaxed);
        self.note_error(format!("{e}"));
    }

    fn note_error(&mut self, msg: String) {
        if self.last_error.as_deref() != Some(msg.as_str()) {
            tracing::debug!("quantshadow transport: {msg}");
            self.last_error = Some(msg);
        }
    }

    /// When a write whose last progress was at `progress` gives up: after `write_timeout`
    /// without progress, and once closing (or abandoned) at the close deadline at the latest.
    fn write_deadline(&self) -> impl Fn(Instant) -> Instant + '_ {
        let (shared, write_timeout) = (&*self.shared, self.opts.write_timeout);
        move |progress: Instant| {
            let stalled =
                progress.checked_add(write_timeout).unwrap_or_else(|| progress + Duration::from_secs(86_400));
            if shared.phase.load(Ordering::Acquire) == PHASE_RUN {
                return stalled;
            }
            let end = *shared.close_deadline.lock().unwrap_or_else(|e| e.into_inner());
            end.map_or(stalled, |end| stalled.min(end))
        }
    }

    /// Whether a write that transferred nothing may keep its records for the next connection:
    /// not once the time for delivering them is over.
    fn may_keep(&self) -> bool {
        match self.phase() {
            PHASE_RUN => true,
            PHASE_DRAIN => {
                let end = *self.shared.close_deadline.lock().unwrap_or_else(|e| e.into_inner());
                end.is_none_or(|end| Instant::now() < end)
            }
            _ => false,
        }
    }

    /// Writes the gathered socket frames. On failure the connection is given up; the frames
    /// are kept for the next one if none of their bytes went out, else dropped (see
    /// [`Client`]: part of them may be stored already).
    fn write_out(&mut self) {
        if self.out.is_empty() || self.trial.is_some() || self.kept_bytes > 0 {
            return;
        }
        let Sink::Socket(conn) = &self.sink else { return };
        let result = if conn.peer_closed() {
            Err((0, io::Error::new(io::ErrorKind::BrokenPipe, "collector closed the connection")))
        } else {
            conn.send_all(&self.out, self.write_deadline())
        };
        let lost = match result {
            Ok(()) => {
                // Zero when a `close` that gave up already counted these as dropped.
                let records = self.shared.in_flight.swap(0, Ordering::AcqRel);
                self.shared.sent.fetch_add(records, Ordering::Relaxed);
                None
            }
            Err((0, e)) if self.may_keep() => {
                let kept = self.keep_out();
                Some(format!(
                    "lost the collector at {}: {e}; {kept} records kept for the next connection",
                    self.address
                ))
            }
            Err((transferred, e)) => {
                let records = self.shared.in_flight.swap(0, Ordering::AcqRel);
                self.shared.dropped.fetch_add(records, Ordering::Relaxed);
                Some(format!(
                    "lost the collector at {}: {e} after {transferred} of {} bytes; {records} records dropped",
                    self.address,
                    self.out.len()
                ))
            }
        };
        if self.kept_bytes == 0 {
            self.out.clear();
            self.out_records = 0;
        }
        if let Some(msg) = lost {
            self.connection_lost(msg);
        }
    }

    /// An accepted connection is gone. One that served for [`STABLE_AFTER`] may come back at
    /// once (a collector restart, or an eviction that made room for another client): no
    /// backoff. Ones lost sooner wait, longer for each in a row: a collector that reads the
    /// preamble and then hangs up would otherwise be redialled in a tight loop.
    fn connection_lost(&mut self, msg: String) {
        let quick = self.accepted_at.take().is_some_and(|t| t.elapsed() < STABLE_AFTER);
        self.note_error(msg);
        self.sink = Sink::None;
        self.trial = None;
        self.backoff = self.opts.backoff_initial;
        if !quick {
            self.quick_backoff = self.opts.backoff_initial;
            return self.retry_after(Duration::ZERO);
        }
        // Its own doubling (the accept reset the refusals' delay); kept records stay kept for
        // the next connection, not spooled.
        self.retry_after(self.quick_backoff);
        self.quick_backoff = self.doubled(self.quick_backoff);
    }

    /// The next attempt waits `delay` (shown in the stats as the retry delay).
    fn retry_after(&mut self, delay: Duration) {
        let now = Instant::now();
        self.next_attempt = now.checked_add(delay).unwrap_or_else(|| now + Duration::from_secs(86_400));
        self.shared.retry_delay_ns.store(delay.as_nanos().min(u64::MAX as u128) as u64, Ordering::Relaxed);
    }

    /// `delay` doubled, within `backoff_max` (and at least 1 ms).
    fn doubled(&self, delay: Duration) -> Duration {
        delay.saturating_mul(2).min(self.opts.backoff_max).max(Duration::from_millis(1))
    }

    /// Turns the records of `out` from in flight into kept; returns how many.
    fn keep_out(&mut self) -> u64 {
        let n = {
            let _held = self.shared.held_lock.lock().unwrap_or_else(|e| e.into_inner());
            let n = self.shared.in_flight.swap(0, Ordering::AcqRel);
            self.shared.kept.fetch_add(n, Ordering::AcqRel);
            n
        };
        // None: a `close` that gave up already counted them.
        if n > 0 {
            self.kept_bytes = self.out.len();
            self.shared.queued_bytes.fetch_add(self.kept_bytes, Ordering::Relaxed);
        }
        n
    }

    /// Ends keeping `out`: its records go back in flight (`resend`) or to the caller, who
    /// counts them; returns how many. If a `close` took them meanwhile (counted as dropped),
    /// returns 0 and forgets the frames.
    fn take_kept(&mut self, resend: bool) -> u64 {
        if self.kept_bytes == 0 {
            return 0;
        }
        self.shared.queued_bytes.fetch_sub(self.kept_bytes, Ordering::Relaxed);
        self.kept_bytes = 0;
        let n = {
            let _held = self.shared.held_lock.lock().unwrap_or_else(|e| e.into_inner());
            let n = self.shared.kept.swap(0, Ordering::AcqRel);
            if resend {
                self.shared.in_flight.fetch_add(n, Ordering::AcqRel);
            }
            n
        };
        if n == 0 {
            self.out.clear();
            self.out_records = 0;
        }
        // Otherwise the frames stay: to be written (`resend`), or read and cleared by the caller.
        n
    }

    fn drop_kept(&mut self) {
        let n = self.take_kept(false);
        self.shared.dropped.fetch_add(n, Ordering::Relaxed);
        if n > 0 {
            self.out.clear();
            self.out_records = 0;
        }
    }

    /// An attempt failed and a spool is open: the kept records go there (before any record
    /// still queued, which keeps their order).
    fn spool_kept(&mut self) {
        if self.kept_bytes == 0 || self.spool.is_none() {
            return;
        }
        if self.take_kept(false) == 0 {
            return;
        }
        let out = std::mem::take(&mut self.out);
        let mut rest = &out[..];
        while rest.len() >= 4 {
            let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
            let Some(payload) = rest.get(4..4 + len) else { break };
            self.spool_one(payload);
            rest = &rest[4 + len..];
        }
        self.out = out;
        self.out.clear();
        self.out_records = 0;
    }

    fn flush_all(&mut self) {
        if matches!(self.sink, Sink::Socket(_)) {
            self.write_out();
        }
        if let Sink::File(w) = &mut self.sink {
            if let Err(e) = w.flush() {
                self.writer_failed(e);
            }
        }
        if let Some(w) = &mut self.spool {
            if let Err(e) = w.flush() {
                self.writer_failed(e);
            }
        }
    }

    /// One connection attempt. A socket that connects goes on trial with its preamble written;
    /// a failure schedules the next attempt and falls back to the spool.
    fn connect(&mut self) {
        let conn = match self.open_sink() {
            Ok(Sink::Socket(conn)) => conn,
            Ok(sink) => {
                self.sink = sink;
                return self.accepted();
            }
            Err(msg) => return self.attempt_failed(format!("cannot reach {}: {msg}", self.address)),
        };
        let since = Instant::now();
        if let Some(p) = &self.opts.preamble {
            let mut frame = Vec::with_capacity(4 + p.len());
            // Its size was checked by `open_sink`.
            let _ = push_frame(&mut frame, p);
            if let Err((_, e)) = conn.send_all(&frame, self.write_deadline()) {
                return self.refused(&format!("cannot write the session record: {e}"));
            }
        }
        self.sink = Sink::Socket(conn);
        self.trial = Some(Trial { since, preamble: self.opts.preamble.is_some(), slice: TRIAL_SLICE_MIN });
    }

    /// Looks at the connection on trial once: accepts it, refuses it, or waits one slice for
    /// a hang-up (see [`Client`] for the rules).
    fn probe(&mut self) {
        let Some(trial) = &self.trial else { return };
        let (since, preamble, slice) = (trial.since, trial.preamble, trial.slice);
        let Sink::Socket(conn) = &self.sink else {
            self.trial = None;
            return;
        };
        // Our send queue before the hang-up: a unix peer that closes without reading hangs up
        // first and only then releases what it had not read.
        let unsent = conn.unsent();
        let closed = conn.peer_closed();
        let quiet = since.elapsed() >= TRIAL_QUIET;
        let served = match (preamble, conn, unsent) {
            (true, Conn::Unix(_), Some(n)) => n == 0,
            (true, Conn::Tcp(_), Some(n)) => n == 0 && quiet,
            _ => quiet,
        };
        let deadline = self.write_deadline()(since);
        let now = Instant::now();
        if closed {
            return self
                .refused("closed the connection during its trial (a full collector refuses this way)");
        }
        if served {
            return self.accepted();
        }
        if now >= deadline {
            let ms = now.duration_since(since).as_millis();
            return self.refused(&format!("did not serve the connection within {ms} ms"));
        }
        conn.wait_hangup(slice.min(deadline - now));
        if let Some(t) = &mut self.trial {
            t.slice = (slice * 2).min(TRIAL_SLICE_MAX);
        }
    }

    /// Ends a trial one way or the other (the deadline of `probe` bounds it).
    fn settle(&mut self) {
        while self.trial.is_some() {
            self.probe();
        }
    }

    /// The connection (or the `file:` run file) is accepted: the backoff starts over, and what
    /// was kept goes first, right after the preamble.
    fn accepted(&mut self) {
        self.trial = None;
        if self.ever_connected {
            self.shared.reconnects.fetch_add(1, Ordering::Relaxed);
        }
        self.ever_connected = true;
        self.backoff = self.opts.backoff_initial;
        self.accepted_at = Some(Instant::now());
        self.shared.retry_delay_ns.store(0, Ordering::Relaxed);
        self.last_error = None;
        // Leaving spool mode: make the spooled records durable-ish now; the spool stays open
        // (no rescan) in case the collector goes away again.
        if let Some(w) = &mut self.spool {
            if let Err(e) = w.flush() {
                self.writer_failed(e);
            }
        }
        self.take_kept(true);
    }

    fn refused(&mut self, why: &str) {
        self.shared.refused.fetch_add(1, Ordering::Relaxed);
        self.attempt_failed(format!("{} refused the connection: {why}", self.address));
    }

    /// A connect error or a refused connection: closes it, waits the current delay before the
    /// next attempt and doubles it, and falls back to the spool.
    fn attempt_failed(&mut self, msg: String) {
        self.note_error(msg);
        self.sink = Sink::None;
        self.trial = None;
        self.retry_after(self.backoff);
        self.backoff = self.doubled(self.backoff);
        self.open_spool();
        self.spool_kept();
    }

    fn open_sink(&mut self) -> Result<Sink, String> {
        if let (Some(p), false) = (&self.opts.preamble, matches!(self.address, Address::File(_))) {
            check_frame_len(p.len()).map_err(|e| format!("preamble: {e}"))?;
        }
        let conn = match &self.address {
            Address::File(path) => {
                // Several processes (ranks, workers) given the same file: the first holds it,
                // the others write PATH.<pid> next to it (the report takes several files)
                // rather than dropping everything they have.
                let (mut w, _recovery) = match RunWriter::open_append(path) {
                    Err(crate::runfile::RunFileError::Locked { .. }) => {
                        let own = per_process_path(path);
                        crate::engine::log::shared_warn(&format!(
                            "{} is held by another process; this process writes {}",
                            path.display(),
                            own.display()
                        ));
                        RunWriter::open_append(&own).map_err(|e| e.to_string())?
                    }
                    other => other.map_err(|e| e.to_string())?,
                };
                if let Some(p) = &self.opts.preamble {
                    w.append(p).map_err(|e| e.to_string())?;
                }
                return Ok(Sink::File(w));
            }
            Address::Unix(path) => Conn::Unix(UnixStream::connect(path).map_err(|e| e.to_string())?),
            Address::Tcp { host, port } => {
                let addrs = (host.as_str(), *port).to_socket_addrs().map_err(|e| e.to_string())?;
                let mut last = String::from("no addresses");
                let mut found = None;
                for a in addrs {
                    match TcpStream::connect_timeout(&a, self.opts.connect_timeout) {
                        Ok(s) => {
                            let _ = s.set_nodelay(true);
                            found = Some(s);
                            break;
                        }
                        Err(e) => last = e.to_string(),
                    }
                }
                Conn::Tcp(found.ok_or(last)?)
            }
        };
        conn.set_write_timeout(WRITE_SLICE).map_err(|e| e.to_string())?;
        // Frames of an earlier connection are either kept (they go first on this one) or were
        // counted when its write ended; any other remainder is counted as dropped rather than
        // forgotten.
        if self.kept_bytes == 0 {
            self.dropped_unsent();
        }
        Ok(Sink::Socket(conn))
    }

    fn open_spool(&mut self) {
        if self.spool.is_some() || matches!(self.address, Address::File(_)) {
            return;
        }
        let Some(path) = self.opts.spool.clone() else { return };
        match RunWriter::open_append(&path) {
            Ok((mut w, _)) => {
                if let Some(p) = &self.opts.preamble {
                    if let Err(e) = w.append(p) {
                        self.note_error(format!("spool {}: {e}", path.display()));
                        return;
                    }
                }
                self.spool = Some(w);
            }
            Err(e) => self.note_error(format!("spool {}: {e}", path.display())),
        }
    }

    /// Close: deliver the closing record, flush everything, exit.
    fn finish(&mut self) {
        self.settle();
        // An idle connection that the collector closed (an eviction) is seen before anything
        // is written to it: the closing record goes on a new connection instead of being lost.
        if let Sink::Socket(conn) = &self.sink {
            if self.out.is_empty() && conn.peer_closed() {
                self.connection_lost(format!("{} closed the connection while it was idle", self.address));
            }
        }
        let payload = self.shared.final_payload.lock().unwrap_or_else(|e| e.into_inner()).take();
        if payload.is_some() && matches!(self.sink, Sink::None) {
            self.connect();
            self.settle();
        }
        // Records that raced into the queue before `close` took the rest.
        while self.pump() > 0 {}
        if let Some(p) = payload {
            if self.has_destination() && self.can_deliver() {
                self.closing_record = true;
                self.deliver(&p);
            } else {
                self.shared.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.flush_all();
        // Nothing comes after this: whatever is still kept or queued is lost.
        self.drop_kept();
        self.dropped_unsent();
        self.shared.drop_queued();
        self.sync_files();
    }

    fn abandon(&mut self) {
        // The deadline was set by whoever abandoned (drop: now + ABANDON_WRITE; a close that
        // timed out: its own deadline, already past).
        self.drop_kept();
        if matches!(self.sink, Sink::Socket(_)) {
            self.write_out();
        }
        self.shared.drop_queued();
        self.flush_all();
        self.dropped_unsent();
    }

    fn dropped_unsent(&mut self) {
        if self.out_records > 0 {
            let records = self.shared.in_flight.swap(0, Ordering::AcqRel);
            self.shared.dropped.fetch_add(records, Ordering::Relaxed);
            self.out.clear();
            self.out_records = 0;
        }
    }

    fn sync_files(&mut self) {
        if let Sink::File(w) = &mut self.sink {
            if let Err(e) = w.sync() {
                self.writer_failed(e);
            }
        }
        if let Some(w) = &mut self.spool {
            if let Err(e) = w.sync() {
                self.writer_failed(e);
            }
        }
    }
}

/// `run.qsr` -> `run.qsr.<pid>`: this process's own file when the shared one is taken.
pub fn per_process_path(path: &std::path::Path) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(format!(".{}", std::process::id()));
    PathBuf::from(name)
}
