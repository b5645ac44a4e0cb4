//! `quantshadow collect`: receives records from instrumented processes and appends them to a
//! run file.
//!
//! One acceptor thread, one thread per connection, one writer thread. Connection threads read
//! frames in bulk, validate each payload by decoding it (garbage never reaches the run file; a
//! record of a newer schema minor that this build cannot read is stored as received, for a
//! newer report; decoding also feeds the session/site counters of the status line), and hand whole
//! batches of run-file frames (CRC computed there, in parallel) to the writer over a bounded
//! channel. When the writer falls behind, connection threads block on that channel, the
//! sockets fill, and the clients drop records on their side: the collector's memory stays
//! bounded.
//!
//! Slots: at most `max_clients` connections are served at once. A connection that stays
//! silent (or stops sending without closing) must not keep a slot from a real client for ever,
//! and a real shim may be silent for minutes between GEMM bursts, so nothing is closed for
//! being idle alone: only when every slot is taken and a new client arrives, the connection
//! idle longest is closed to make room, provided it has been idle at least `evict_idle_after`
//! (one that never sent a record goes before one that did). What it sent is kept: it is read to
//! the end, like at shutdown, before it is closed (its write side is shut first, so the client
//! stops writing to it). The shim's client notices the close before
//! its next write, keeps the records it gathered for it, reconnects at once and sends them after
//! its session record (nothing lost; only a write cut short mid-way is dropped, counted, since
//! resending it could store frames twice). A full collector's refusal makes it back off.
//!
//! The in-process API ([`Collector`]) serves the demo, the tests and the benchmarks.

use quantshadow_runtime::record::{self, Record, RecordError};
use quantshadow_runtime::runfile::{FrameBatch, Recovery, RunFileError, RunWriter};
use quantshadow_runtime::thresholds::Thresholds;
use quantshadow_runtime::transport::{default_address, Address, FrameError, FrameReader};
use std::collections::HashSet;
use std::io::{self, IsTerminal};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Where to listen: unix:PATH, tcp:HOST:PORT, or a socket path
    /// [default: unix:$XDG_RUNTIME_DIR/quantshadow.sock, else unix:/tmp/quantshadow-$UID.sock]
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<Address>,
    /// Run file to append to; created if missing, a torn tail left by a crash is cut off
    #[arg(long, value_name = "FILE.qsr", default_value = "quantshadow.qsr")]
    pub out: PathBuf,
    /// No status line and no summary (warnings are still logged)
    #[arg(long)]
    pub quiet: bool,
    /// Connections served at once; further ones are refused
    #[arg(long, value_name = "N", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_clients: u32,
    /// With every --max-clients slot taken, a new connection closes the one idle longest if it
    /// has been idle (no record received) this long; otherwise the new one is refused
    #[arg(long, value_name = "SECONDS", default_value_t = 10)]
    pub evict_idle_after: u64,
}

pub fn main(args: Args) -> ExitCode {
    let listen = args.listen.clone().unwrap_or_else(default_address);
    install_signal_handlers();
    let options = CollectOptions {
        max_clients: args.max_clients as usize,
        evict_idle_after: Duration::from_secs(args.evict_idle_after),
        ..CollectOptions::default()
    };
    let collector = match Collector::start_with(&listen, &args.out, options) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("quantshadow collect: {e}");
            return ExitCode::from(crate::exit::BAD_INPUT);
        }
    };
    tracing::info!("listening on {}, appending to {}", collector.local_address(), args.out.display());
    let status = (!args.quiet && io::stderr().is_terminal()).then(StatusLine::new);
    let mut status = status;
    while !STOP.load(Ordering::Relaxed) {
        thread::sleep(Duration::from_millis(100));
        if let Some(s) = &mut status {
            s.update(&collector.stats());
        }
    }
    if let Some(s) = status {
        s.finish();
    }
    let summary = collector.shutdown();
    if !args.quiet {
        let st = &summary.stats;
        eprintln!(
            "quantshadow collect: {} records ({} sessions, {} sites, {} failing) from {} connections \
             appended to {} in {:.1} s{}{}{}",
            st.records,
            st.sessions,
            st.sites,
            st.failing_sites,
            st.clients,
            summary.out.display(),
            summary.elapsed.as_secs_f64(),
            if st.bad_clients > 0 {
                format!("; {} bad clients disconnected", st.bad_clients)
            } else {
                String::new()
            },
            if st.evicted_clients + st.refused_clients > 0 {
                format!(
                    "; {} idle clients closed to make room, {} refused (all {} slots busy)",
                    st.evicted_clients, st.refused_clients, args.max_clients
                )
            } else {
                String::new()
            },
            if st.unreadable_records > 0 {
                format!(
                    "; {} records of a newer schema minor stored unread (a newer report reads them)",
                    st.unreadable_records
                )
            } else {
                String::new()
            }
        );
    }
    if let Some(e) = &summary.error {
        eprintln!("quantshadow collect: {e}");
    }
    if summary.error.is_some() || summary.stats.lost_records > 0 {
        ExitCode::from(crate::exit::FAILED)
    } else {
        ExitCode::from(crate::exit::OK)
    }
}

// ---------------------------------------------------------------------------------------------
// Signals

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_sig: libc::c_int) {
    // A second signal means the clean shutdown itself is stuck: leave now.
    if STOP.swap(true, Ordering::SeqCst) {
        // SAFETY: _exit is async-signal-safe.
        unsafe { libc::_exit(130) };
    }
}

fn install_signal_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a zeroed sigaction is a valid starting point; the handler only touches an
        // atomic and calls _exit, both async-signal-safe. SA_RESTART keeps the worker threads'
        // blocking calls from failing with EINTR.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as libc::sighandler_t;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

struct StatusLine {
    bar: indicatif::ProgressBar,
    last: Instant,
    last_records: u64,
}

impl StatusLine {
    fn new() -> StatusLine {
        let bar = indicatif::ProgressBar::new_spinner();
        bar.set_style(indicatif::ProgressStyle::with_template("{spinner} {msg}").expect("static template"));
        StatusLine { bar, last: Instant::now(), last_records: 0 }
    }

    fn update(&mut self, st: &CollectStats) {
        let dt = self.last.elapsed().as_secs_f64();
        if dt < 0.5 {
            self.bar.tick();
            return;
        }
        let rate = (st.records - self.last_records) as f64 / dt;
        self.last = Instant::now();
        self.last_records = st.records;
        self.bar.set_message(format!(
            "{} records ({:.0}/s), {} sessions, {} sites, {} failing sites, {} clients",
            st.records, rate, st.sessions, st.sites, st.failing_sites, st.active_clients
        ));
    }

    fn finish(self) {
        self.bar.finish_and_clear();
    }
}

// ---------------------------------------------------------------------------------------------
// In-process collector

#[derive(Debug, thiserror::Error)]
pub enum CollectError {
    #[error("cannot listen on {address}: {source}")]
    Listen { address: String, source: io::Error },
    #[error("another collector is already listening on {0}")]
    InUse(String),
    #[error("{0} exists and is not a socket; refusing to replace it")]
    NotASocket(String),
    #[error("cannot listen on a file: address ({0}); use unix:PATH or tcp:HOST:PORT")]
    FileAddress(String),
    #[error(transparent)]
    RunFile(#[from] RunFileError),
    #[error("cannot start a thread: {0}")]
    Thread(io::Error),
}

#[derive(Debug, Clone)]
pub struct CollectOptions {
    /// Connections served at once; further ones are closed at once (and counted), unless one
    /// can be evicted (see `evict_idle_after`).
    pub max_clients: usize,
    /// With `max_clients` connections open, a new one closes the connection idle longest (no
    /// complete frame received for this long; never-sent connections first) instead of being
    /// refused. Long enough that a client in the middle of its work is never chosen.
    pub evict_idle_after: Duration,
    /// Decode every payload (rejecting clients that send garbage) and count sessions, sites
    /// and failing sites. `false` stores frames unchecked: for measuring the transport alone.
    pub validate: bool,
    /// Decides which observations make a site "failing" in the counters.
    pub thresholds: Thresholds,
}

impl Default for CollectOptions {
    fn default() -> Self {
        CollectOptions {
            max_clients: 256,
            evict_idle_after: Duration::from_secs(10),
            validate: true,
            thresholds: Thresholds::default(),
        }
    }
}

/// Counters of a running collector.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CollectStats {
    /// Records appended to the run file by this collector.
    pub records: u64,
    /// Bytes handed to the run file (frame headers included).
    pub bytes: u64,
    /// Distinct session ids seen (at most `CATALOG_MAX_KEYS` are told apart; this and the next
    /// two are lower bounds past it).
    pub sessions: u64,
    /// Distinct (session, site) pairs seen in observations.
    pub sites: u64,
    /// Sites with at least one observation failing the thresholds (metrics or logits).
    pub failing_sites: u64,
    /// Connections accepted.
    pub clients: u64,
    /// Connections open now.
    pub active_clients: u64,
    /// Connections closed for sending malformed frames or malformed records.
    pub bad_clients: u64,
    /// Records of a newer schema minor (an enum value or record kind this build does not know)
    /// that this build cannot decode: appended as received, for a report that reads them, but
    /// not in the session/site counters. Included in `records`. (A record of another major
    /// closes its connection as bad: this build's report refuses a file holding one.)
    pub unreadable_records: u64,
    /// Connections refused because `max_clients` were open and none had been idle long enough
    /// to be evicted.
    pub refused_clients: u64,
    /// Idle connections closed to make room for a new one (everything they sent is kept).
    pub evicted_clients: u64,
    /// Records lost to write errors on the run file.
    pub lost_records: u64,
}

#[derive(Debug, Clone)]
pub struct CollectSummary {
    pub stats: CollectStats,
    /// What was found in the run file at startup.
    pub recovery: Recovery,
    pub out: PathBuf,
    pub elapsed: Duration,
    /// The final flush/sync failed.
    pub error: Option<String>,
}

/// Appended-record batches are handed over at this size (or when a connection goes quiet).
const BATCH_BYTES: usize = 128 << 10;
/// Batches in flight to the writer; beyond, connection threads wait (backpressure).
const WRITER_QUEUE: usize = 32;
/// How often blocked threads look at the stop flag.
const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// After stop, how long a connection is read until it goes quiet.
const DRAIN_READ_TIMEOUT: Duration = Duration::from_millis(20);
/// After stop, the longest a busy connection is still read.
const DRAIN_MAX: Duration = Duration::from_secs(1);

#[derive(Default)]
struct Catalog {
    sessions: HashSet<u64>,
    sites: HashSet<(u64, u64)>,
    failing: HashSet<(u64, u64)>,
}

/// Keys each catalog set holds at most (tens of MB): the counts feed the status line only (the
/// report reads the run file), and a client sending a new session or site id with every record
/// must not grow the collector's memory without bound. Past it, counts are lower bounds.
const CATALOG_MAX_KEYS: usize = 1 << 20;

/// Inserts `v` unless `set` already holds `cap` keys; whether it was new and inserted.
fn insert_capped<T: std::hash::Hash + Eq>(set: &mut HashSet<T>, v: T, cap: usize) -> bool {
    set.len() < cap && set.insert(v)
}

struct Shared {
    stop: AtomicBool,
    stop_at: Mutex<Option<Instant>>,
    options: CollectOptions,
    catalog: Mutex<Catalog>,
    appended: AtomicU64,
    bytes: AtomicU64,
    clients: AtomicU64,
    active: AtomicU64,
    bad: AtomicU64,
    unreadable: AtomicU64,
    refused: AtomicU64,
    evicted: AtomicU64,
    lost: AtomicU64,
    conns: Mutex<Vec<Conn>>,
    /// Origin of the connections' activity times.
    epoch: Instant,
}

impl Shared {
    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }
}

/// A connection's thread and what the acceptor needs to choose one to evict.
struct Conn {
    thread: JoinHandle<()>,
    state: Arc<ConnState>,
}

struct ConnState {
    id: u64,
    label: String,
    /// When the last complete frame was received (or the connection accepted), in
    /// nanoseconds since [`Shared::epoch`].
    last_frame_ns: AtomicU64,
    /// Frames received so far.
    frames: AtomicU64,
    /// Set by the acceptor: read what the client already sent, then close.
    evict: AtomicBool,
}

enum Listener {
    Unix(UnixListener),
    Tcp(TcpListener),
}

enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl io::Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(buf),
            Stream::Tcp(s) => s.read(buf),
        }
    }
}

impl Stream {
    fn set_read_timeout(&self, t: Duration) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_read_timeout(Some(t)),
            Stream::Tcp(s) => s.set_read_timeout(Some(t)),
        }
    }

    /// Ends the collector's side: the client sees the hang-up before its next write.
    fn shutdown_write(&self) {
        let _ = match self {
            Stream::Unix(s) => s.shutdown(std::net::Shutdown::Write),
            Stream::Tcp(s) => s.shutdown(std::net::Shutdown::Write),
        };
    }
}

/// A running collector. Dropping it shuts it down like [`Collector::shutdown`].
pub struct Collector {
    shared: Arc<Shared>,
    local: Address,
    out: PathBuf,
    recovery: Recovery,
    started: Instant,
    acceptor: Option<JoinHandle<()>>,
    writer: Option<JoinHandle<Result<(), RunFileError>>>,
    /// Socket file to remove at shutdown, with its inode so that a socket another collector
    /// created at the same path later is left alone.
    socket_file: Option<(PathBuf, u64)>,
}

impl Collector {
    pub fn start(listen: &Address, out: &Path) -> Result<Collector, CollectError> {
        Collector::start_with(listen, out, CollectOptions::default())
    }

    pub fn start_with(
        listen: &Address,
        out: &Path,
        options: CollectOptions,
    ) -> Result<Collector, CollectError> {
        if let Address::File(p) = listen {
            return Err(CollectError::FileAddress(p.display().to_string()));
        }
        // Open the run file first: a bad output file should not leave a socket behind.
        let (writer, recovery) = RunWriter::open_append(out)?;
        if let Some(t) = &recovery.torn_tail {
            tracing::warn!(
                "{}: {t}; cut {} bytes, {} earlier records intact, appending after them",
                out.display(),
                recovery.bytes_truncated,
                recovery.records_intact
            );
        }
        for region in &recovery.damaged {
            tracing::warn!(
                "{}: damaged data at byte {} ({}); left in place, readers skip it and the records after it are kept",
                out.display(),
                region.offset,
                region.reason
            );
        }
        if recovery.torn_tail.is_none() && recovery.records_intact > 0 {
            tracing::info!("{}: appending after {} existing records", out.display(), recovery.records_intact);
        }
        let (listener, local, socket_file) = bind(listen)?;
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            stop_at: Mutex::new(None),
            options,
            catalog: Mutex::new(Catalog::default()),
            appended: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            clients: AtomicU64::new(0),
            active: AtomicU64::new(0),
            bad: AtomicU64::new(0),
            unreadable: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            conns: Mutex::new(Vec::new()),
            epoch: Instant::now(),
        });
        let (tx, rx) = mpsc::sync_channel::<FrameBatch>(WRITER_QUEUE);
        let cleanup = |socket_file: &Option<(PathBuf, u64)>| {
            if let Some((p, ino)) = socket_file {
                remove_socket_file(p, *ino);
            }
        };
        let writer = {
            let shared = shared.clone();
            thread::Builder::new()
                .name("qs-collect-writer".into())
                .spawn(move || writer_loop(writer, rx, &shared))
                .map_err(|e| {
                    cleanup(&socket_file);
                    CollectError::Thread(e)
                })?
        };
        let acceptor = {
            let shared = shared.clone();
            thread::Builder::new()
                .name("qs-collect-accept".into())
                .spawn(move || accept_loop(listener, tx, &shared))
        };
        let acceptor = match acceptor {
            Ok(a) => a,
            Err(e) => {
                // The writer exits once its channel's only sender (moved into the failed
                // closure, now dropped) is gone.
                let _ = writer.join();
                cleanup(&socket_file);
                return Err(CollectError::Thread(e));
            }
        };
        Ok(Collector {
            shared,
            local,
            out: out.to_path_buf(),
            recovery,
            started: Instant::now(),
            acceptor: Some(acceptor),
            writer: Some(writer),
            socket_file,
        })
    }

    /// The address clients should use (the real port for `tcp:...:0`).
    pub fn local_address(&self) -> &Address {
        &self.local
    }

    /// What was found in the run file at startup.
    pub fn recovery(&self) -> &Recovery {
        &self.recovery
    }

    pub fn stats(&self) -> CollectStats {
        let s = &*self.shared;
        let (sessions, sites, failing) = {
            let c = s.catalog.lock().unwrap_or_else(|e| e.into_inner());
            (c.sessions.len() as u64, c.sites.len() as u64, c.failing.len() as u64)
        };
        CollectStats {
            records: s.appended.load(Ordering::Relaxed).saturating_sub(s.lost.load(Ordering::Relaxed)),
            bytes: s.bytes.load(Ordering::Relaxed),
            sessions,
            sites,
            failing_sites: failing,
            clients: s.clients.load(Ordering::Relaxed),
            active_clients: s.active.load(Ordering::Relaxed),
            bad_clients: s.bad.load(Ordering::Relaxed),
            unreadable_records: s.unreadable.load(Ordering::Relaxed),
            refused_clients: s.refused.load(Ordering::Relaxed),
            evicted_clients: s.evicted.load(Ordering::Relaxed),
            lost_records: s.lost.load(Ordering::Relaxed),
        }
    }

    /// Stops accepting, reads what connected clients already sent (until each goes quiet, at
    /// most about a second), writes and fsyncs the run file, removes the socket file.
    pub fn shutdown(mut self) -> CollectSummary {
        self.stop()
    }

    fn stop(&mut self) -> CollectSummary {
        let s = &*self.shared;
        *s.stop_at.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        s.stop.store(true, Ordering::SeqCst);
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        // The acceptor has exited, so no connection thread is added after this.
        let conns = std::mem::take(&mut *s.conns.lock().unwrap_or_else(|e| e.into_inner()));
        for c in conns {
            let _ = c.thread.join();
        }
        let error = match self.writer.take().map(|w| w.join()) {
            Some(Ok(Ok(()))) | None => None,
            Some(Ok(Err(e))) => Some(e.to_string()),
            Some(Err(_)) => Some("the writer thread panicked; the run file may lack the last records".into()),
        };
        if let Some((p, ino)) = self.socket_file.take() {
            remove_socket_file(&p, ino);
        }
        CollectSummary {
            stats: self.stats(),
            recovery: self.recovery.clone(),
            out: self.out.clone(),
            elapsed: self.started.elapsed(),
            error,
        }
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        if self.acceptor.is_some() || self.writer.is_some() {
            self.stop();
        }
    }
}

/// Serialises the umask change around `bind`: umask is per process, and two threads swapping
/// it concurrently could leave it changed for good.
static UMASK_LOCK: Mutex<()> = Mutex::new(());

/// A listening socket, the address clients use, and the socket file to remove at shutdown.
type Bound = (Listener, Address, Option<(PathBuf, u64)>);

fn bind(listen: &Address) -> Result<Bound, CollectError> {
    let listen_err = |source| CollectError::Listen { address: listen.to_string(), source };
    match listen {
        Address::Unix(path) => {
            let name = path.display().to_string();
            match std::fs::symlink_metadata(path) {
                Ok(m) if m.file_type().is_socket() => match UnixStream::connect(path) {
                    Ok(_) => return Err(CollectError::InUse(listen.to_string())),
                    Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                        tracing::info!("removing stale socket {name}");
                        std::fs::remove_file(path).map_err(listen_err)?;
                    }
                    Err(e) => return Err(listen_err(e)),
                },
                Ok(_) => return Err(CollectError::NotASocket(name)),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(listen_err(e)),
            }
            let listener = {
                let _guard = UMASK_LOCK.lock().unwrap_or_else(|e| e.into_inner());
                // SAFETY: umask has no preconditions; the old mask is restored right after.
                let old = unsafe { libc::umask(0o177) };
                let r = UnixListener::bind(path);
                // SAFETY: as above.
                unsafe { libc::umask(old) };
                r.map_err(listen_err)?
            };
            // Records reveal model structure: only the owner may connect (also set explicitly
            // in case the file system ignores the umask).
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(listen_err)?;
            let ino = std::fs::symlink_metadata(path).map_err(listen_err)?.ino();
            listener.set_nonblocking(true).map_err(listen_err)?;
            Ok((Listener::Unix(listener), listen.clone(), Some((path.clone(), ino))))
        }
        Address::Tcp { host, port } => {
            let listener = TcpListener::bind((host.as_str(), *port)).map_err(listen_err)?;
            let local = listener.local_addr().map_err(listen_err)?;
            listener.set_nonblocking(true).map_err(listen_err)?;
            if !local.ip().is_loopback() {
                // The collector has no authentication: anyone who can reach the port can add
                // records to the run (and so to the report).
                tracing::warn!("listening on {local}, which is not a loopback address: any host that can reach it can send records");
            }
            let local = Address::Tcp { host: local.ip().to_string(), port: local.port() };
            Ok((Listener::Tcp(listener), local, None))
        }
        Address::File(p) => Err(CollectError::FileAddress(p.display().to_string())),
    }
}

fn remove_socket_file(path: &Path, ino: u64) {
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.ino() == ino && m.file_type().is_socket()) {
        let _ = std::fs::remove_file(path);
    }
}

/// Waits until `fd` is readable or `timeout` passes.
fn wait_readable(fd: RawFd, timeout: Duration) {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd; EINTR just ends the wait early.
    unsafe { libc::poll(&mut p, 1, timeout.as_millis() as libc::c_int) };
}

fn accept_loop(listener: Listener, tx: SyncSender<FrameBatch>, shared: &Arc<Shared>) {
    let fd = match &listener {
        Listener::Unix(l) => l.as_raw_fd(),
        Listener::Tcp(l) => l.as_raw_fd(),
    };
    let mut next_id = 0u64;
    while !shared.stop.load(Ordering::SeqCst) {
        wait_readable(fd, POLL_INTERVAL);
        let accepted = match &listener {
            Listener::Unix(l) => l.accept().map(|(s, _)| {
                let peer = peer_pid(&s).map_or_else(|| "unix peer".to_string(), |pid| format!("pid {pid}"));
                (Stream::Unix(s), peer)
            }),
            Listener::Tcp(l) => l.accept().map(|(s, a)| (Stream::Tcp(s), a.to_string())),
        };
        let (stream, peer) = match accepted {
            Ok(x) => x,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => continue,
            Err(e) => {
                // EMFILE and friends: keep serving the connections we have.
                tracing::warn!("accept failed: {e}");
                thread::sleep(POLL_INTERVAL);
                continue;
            }
        };
        let mut conns = shared.conns.lock().unwrap_or_else(|e| e.into_inner());
        conns.retain(|c| !c.thread.is_finished());
        if let Err(why) = make_room(&conns, &peer, shared) {
            shared.refused.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("refusing connection from {peer}: {why}");
            continue;
        }
        next_id += 1;
        let state = Arc::new(ConnState {
            id: next_id,
            label: format!("client {next_id} ({peer})"),
            last_frame_ns: AtomicU64::new(shared.now_ns()),
            frames: AtomicU64::new(0),
            evict: AtomicBool::new(false),
        });
        let (tx, sh, st) = (tx.clone(), shared.clone(), state.clone());
        shared.clients.fetch_add(1, Ordering::Relaxed);
        shared.active.fetch_add(1, Ordering::Relaxed);
        match thread::Builder::new().name(format!("qs-collect-{next_id}")).spawn(move || {
            serve(stream, &st, &tx, &sh);
            sh.active.fetch_sub(1, Ordering::Relaxed);
        }) {
            Ok(thread) => conns.push(Conn { thread, state }),
            Err(e) => {
                shared.active.fetch_sub(1, Ordering::Relaxed);
                shared.refused.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("refusing connection from {peer}: cannot start a thread: {e}");
            }
        }
    }
}

/// Frees a slot for a new connection from `peer` if every one is taken, by asking the
/// connection idle longest (at least `evict_idle_after`; one that never sent a frame first) to
/// close; `Err(why)` when the new one must be refused. Never waits: the evicted connection's
/// thread reads what its client already sent and closes on its own, within about a second.
fn make_room(conns: &[Conn], peer: &str, shared: &Shared) -> Result<(), String> {
    let max = shared.options.max_clients;
    let open = conns.iter().filter(|c| !c.state.evict.load(Ordering::Relaxed)).count();
    if open < max {
        return Ok(());
    }
    // Connections still closing hold memory too: bound them as well.
    if conns.len() >= 2 * max {
        return Err(format!("{open} clients connected and {} still closing", conns.len() - open));
    }
    let now = shared.now_ns();
    let min_idle = shared.options.evict_idle_after.as_nanos() as u64;
    let victim = conns
        .iter()
        .filter(|c| !c.state.evict.load(Ordering::Relaxed))
        .map(|c| {
            let idle = now.saturating_sub(c.state.last_frame_ns.load(Ordering::Relaxed));
            (c.state.frames.load(Ordering::Relaxed), idle, c)
        })
        .filter(|&(_, idle, _)| idle >= min_idle)
        // Never sent a frame before sent some; then idle longest; then oldest.
        .max_by_key(|&(frames, idle, c)| (frames == 0, idle, std::cmp::Reverse(c.state.id)));
    let Some((frames, idle, c)) = victim else {
        return Err(format!(
            "{open} clients connected, none idle for {:.1} s or more",
            shared.options.evict_idle_after.as_secs_f64()
        ));
    };
    c.state.evict.store(true, Ordering::Relaxed);
    shared.evicted.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(
        "{}: idle for {:.1} s after {frames} records; closing it to make room for {peer} ({open} clients connected)",
        c.state.label,
        idle as f64 / 1e9
    );
    Ok(())
}

fn peer_pid(s: &UnixStream) -> Option<i32> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes and `len` holds the buffer size.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (rc == 0 && cred.pid > 0).then_some(cred.pid)
}

/// Per-connection view of the catalog: new keys are merged into the shared one once per batch,
/// so the shared lock is taken per batch, not per record.
#[derive(Default)]
struct LocalCatalog {
    seen: Catalog,
    new_sessions: Vec<u64>,
    new_sites: Vec<(u64, u64)>,
    new_failing: Vec<(u64, u64)>,
}

impl LocalCatalog {
    fn note(&mut self, rec: &Record, thresholds: &Thresholds) {
        let session = rec.session_id();
        if insert_capped(&mut self.seen.sessions, session, CATALOG_MAX_KEYS) {
            self.new_sessions.push(session);
        }
        if let Record::Observation(o) = rec {
            let key = (o.session_id, o.site_id);
            if insert_capped(&mut self.seen.sites, key, CATALOG_MAX_KEYS) {
                self.new_sites.push(key);
            }
            // The report's rules: the metrics, and the logits of an LM head.
            let class = o.problem.class();
            let failing = o.metrics.as_ref().is_some_and(|m| !thresholds.judge(class, m).is_empty())
                || o.logits.as_ref().is_some_and(|l| thresholds.judge_logits(class, l).is_some());
            if failing && insert_capped(&mut self.seen.failing, key, CATALOG_MAX_KEYS) {
                self.new_failing.push(key);
            }
        }
    }

    fn merge_into(&mut self, shared: &Mutex<Catalog>) {
        if self.new_sessions.is_empty() && self.new_sites.is_empty() && self.new_failing.is_empty() {
            return;
        }
        let mut c = shared.lock().unwrap_or_else(|e| e.into_inner());
        for v in self.new_sessions.drain(..) {
            insert_capped(&mut c.sessions, v, CATALOG_MAX_KEYS);
        }
        for v in self.new_sites.drain(..) {
            insert_capped(&mut c.sites, v, CATALOG_MAX_KEYS);
        }
        for v in self.new_failing.drain(..) {
            insert_capped(&mut c.failing, v, CATALOG_MAX_KEYS);
        }
    }
}

/// Why a connection ended.
enum End {
    /// Clean end of stream, or stopped.
    Done,
    /// Lost mid-frame or by an I/O error: a client that died, not a bad one.
    Lost(String),
    /// Protocol violation: counted as a bad client.
    Bad(String),
    /// The writer is gone; nothing more can be stored.
    WriterGone,
}

fn serve(stream: Stream, conn: &ConnState, tx: &SyncSender<FrameBatch>, shared: &Shared) {
    let label = conn.label.as_str();
    let end = serve_frames(stream, conn, tx, shared);
    match end {
        End::Done | End::WriterGone => tracing::debug!("{label}: disconnected"),
        End::Lost(why) => tracing::debug!("{label}: connection lost: {why}"),
        End::Bad(why) => {
            shared.bad.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("{label}: {why}; disconnecting it");
        }
    }
}

fn serve_frames(stream: Stream, conn: &ConnState, tx: &SyncSender<FrameBatch>, shared: &Shared) -> End {
    let label = conn.label.as_str();
    if let Err(e) = stream.set_read_timeout(POLL_INTERVAL) {
        return End::Lost(format!("cannot set a read timeout: {e}"));
    }
    let mut reader = FrameReader::new(stream);
    let mut batch = FrameBatch::with_capacity(BATCH_BYTES + 4096);
    let mut catalog = LocalCatalog::default();
    let mut draining_until: Option<Instant> = None;
    let mut received = 0u64;
    // Frames already reported in `conn` (activity is noted once per buffer-full, not per frame).
    let mut noted = 0u64;
    let mut unreadable = 0u64;
    let validate = shared.options.validate;
    let hand_over = |batch: &mut FrameBatch, catalog: &mut LocalCatalog| -> bool {
        catalog.merge_into(&shared.catalog);
        if batch.is_empty() {
            return true;
        }
        let full = std::mem::replace(batch, FrameBatch::with_capacity(BATCH_BYTES + 4096));
        tx.send(full).is_ok()
    };
    let mut end = loop {
        // About to read from the socket (which may wait): pass on what we have first, so a
        // quiet client's records reach the file promptly.
        if !reader.has_buffered_frame() {
            if received != noted {
                noted = received;
                conn.frames.store(received, Ordering::Relaxed);
                conn.last_frame_ns.store(shared.now_ns(), Ordering::Relaxed);
            }
            if !hand_over(&mut batch, &mut catalog) {
                break End::WriterGone;
            }
            // The read timeout does not end a read while bytes keep coming (a client trickling
            // a large frame): bound the read so that the stop flag is still seen.
            if draining_until.is_none() {
                reader.set_deadline(Some(Instant::now() + POLL_INTERVAL));
            }
        }
        let evicted = conn.evict.load(Ordering::Relaxed);
        if draining_until.is_none() && (evicted || shared.stop.load(Ordering::Relaxed)) {
            // Evicted: what the client sent before the close is read and kept, as at shutdown.
            let stop_at = if evicted {
                Instant::now()
            } else {
                shared.stop_at.lock().unwrap_or_else(|e| e.into_inner()).unwrap_or_else(Instant::now)
            };
            draining_until = Some(stop_at + DRAIN_MAX);
            reader.set_deadline(draining_until);
            let _ = reader.get_ref().set_read_timeout(DRAIN_READ_TIMEOUT);
            if evicted {
                // Told first, so the client keeps (and sends elsewhere) what it has not
                // written yet instead of writing into a socket about to close; what it wrote
                // before is read below.
                reader.get_ref().shutdown_write();
            }
        }
        if draining_until.is_some_and(|t| Instant::now() >= t) {
            break End::Done;
        }
        let payload = match reader.next_frame() {
            Ok(Some(p)) => p,
            Ok(None) => break End::Done,
            Err(e) if e.is_timeout() => {
                if draining_until.is_some() {
                    // Quiet after stop: everything it sent before has been read.
                    break End::Done;
                }
                continue;
            }
            Err(e @ (FrameError::Oversize { .. } | FrameError::Empty)) => {
                break End::Bad(format!("malformed frame after {received} records: {e}"))
            }
            Err(e @ (FrameError::Truncated { .. } | FrameError::Io(_))) => break End::Lost(e.to_string()),
        };
        if validate {
            match record::decode(payload) {
                Ok(rec) => catalog.note(&rec, &shared.options.thresholds),
                // A newer minor's record (the schema lets a minor add enum values and record
                // kinds): well-formed, so kept as received for a report that can read it. A
                // record of another major is not: this build's report refuses a file holding
                // one, which would cost every other record of the run.
                Err(e @ RecordError::UnknownEnum { .. }) => {
                    unreadable += 1;
                    shared.unreadable.fetch_add(1, Ordering::Relaxed);
                    if unreadable == 1 {
                        tracing::warn!(
                            "{label}: record {received} cannot be read by this build ({e}); storing it \
                             as received, and any more like it from this client without a warning (a \
                             newer quantshadow report reads them)"
                        );
                    }
                }
                Err(e @ (RecordError::Malformed(_) | RecordError::UnsupportedVersion { .. })) => {
                    break End::Bad(format!("record {received} is not a valid quantshadow record: {e}"))
                }
            }
        }
        // Cannot fail: socket frames are smaller than run-file frames and never empty.
        if let Err(e) = batch.push(payload) {
            break End::Bad(format!("record {received}: {e}"));
        }
        received += 1;
        if batch.len_bytes() >= BATCH_BYTES && !hand_over(&mut batch, &mut catalog) {
            break End::WriterGone;
        }
    };
    if let End::Bad(why) = &mut end {
        why.push_str(&format!(" ({} buffered bytes discarded)", reader.buffered()));
    }
    // Records before a bad one are valid: keep them.
    if !matches!(end, End::WriterGone) {
        hand_over(&mut batch, &mut catalog);
    }
    end
}

fn writer_loop(mut w: RunWriter, rx: Receiver<FrameBatch>, shared: &Shared) -> Result<(), RunFileError> {
    let mut failures = 0u64;
    // Records handed to `RunWriter` count as appended; a failed write reports how many
    // buffered records it lost, which `CollectStats::records` then excludes.
    let mut fail = |e: &RunFileError| {
        let RunFileError::WriteFailed { lost_records, .. } = e else { return };
        shared.lost.fetch_add(*lost_records, Ordering::Relaxed);
        failures += 1;
        // A full disk fails every write: say it once, then every thousandth time.
        if failures == 1 || failures.is_multiple_of(1000) {
            tracing::error!("{e} (write failure {failures})");
        }
    };
    loop {
        match rx.recv_timeout(POLL_INTERVAL) {
            Ok(batch) => {
                shared.appended.fetch_add(batch.records(), Ordering::Relaxed);
                shared.bytes.fetch_add(batch.len_bytes() as u64, Ordering::Relaxed);
                if let Err(e) = w.append_batch(&batch) {
                    fail(&e);
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                if let Err(e) = w.flush_if_due() {
                    fail(&e);
                }
            }
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    let result = w.finish();
    if let Err(e) = &result {
        fail(e);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_sets_stop_growing_at_their_cap() {
        let mut set = HashSet::new();
        assert!(insert_capped(&mut set, 1u64, 3));
        assert!(!insert_capped(&mut set, 1u64, 3), "already there");
        assert!(insert_capped(&mut set, 2u64, 3));
        assert!(insert_capped(&mut set, 3u64, 3));
        assert!(!insert_capped(&mut set, 4u64, 3), "full");
        assert_eq!(set.len(), 3);
    }
}
