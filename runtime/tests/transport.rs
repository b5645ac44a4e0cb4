//! Transport: address parsing, socket framing, and the client's queue, drops, reconnects,
//! spool and close. Payloads here are opaque bytes; no record codec is involved.

use quantshadow_runtime::runfile::read_run_file;
use quantshadow_runtime::transport::{
    push_frame, write_frame, Address, AddressError, Client, ClientOptions, FrameError, FrameReader,
    MAX_FRAME_BYTES,
};
use std::io::{self, Read};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------------
// Helpers

/// Polls `cond` every few ms until it holds or `limit` passes.
fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if cond() {
            return true;
        }
        thread::sleep(Duration::from_millis(5));
    }
    cond()
}

fn fast_options() -> ClientOptions {
    ClientOptions {
        backoff_initial: Duration::from_millis(5),
        backoff_max: Duration::from_millis(40),
        write_timeout: Duration::from_millis(500),
        ..ClientOptions::default()
    }
}

fn rec(i: usize) -> Vec<u8> {
    format!("record {i:06}").into_bytes()
}

/// A minimal collector: records the payloads of each connection, in order.
struct TestServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<Vec<Vec<u8>>>>>,
    thread: Option<JoinHandle<()>>,
}

impl TestServer {
    fn start(path: &Path) -> TestServer {
        Self::start_with(path, true)
    }

    /// `read == false`: accept connections but never read them (a stuck collector).
    fn start_with(path: &Path, read: bool) -> TestServer {
        let listener = UnixListener::bind(path).unwrap();
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let conns = Arc::new(Mutex::new(Vec::new()));
        let (stop2, conns2) = (stop.clone(), conns.clone());
        let thread = thread::spawn(move || {
            let mut readers = Vec::new();
            let mut held = Vec::new();
            while !stop2.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((s, _)) if read => {
                        let idx = {
                            let mut c = conns2.lock().unwrap();
                            c.push(Vec::new());
                            c.len() - 1
                        };
                        let (stop3, conns3) = (stop2.clone(), conns2.clone());
                        readers.push(thread::spawn(move || read_conn(s, idx, &stop3, &conns3)));
                    }
                    Ok((s, _)) => held.push(s),
                    Err(_) => thread::sleep(Duration::from_millis(2)),
                }
            }
            for r in readers {
                let _ = r.join();
            }
        });
        TestServer { path: path.to_path_buf(), stop, conns, thread: Some(thread) }
    }

    fn connections(&self) -> Vec<Vec<Vec<u8>>> {
        self.conns.lock().unwrap().clone()
    }

    fn received(&self) -> usize {
        self.conns.lock().unwrap().iter().map(|c| c.len()).sum()
    }

    /// Waits (bounded) until the newest connection's last payload starts with `prefix`: what a
    /// client wrote may still be in the socket when its `close` returns.
    fn wait_for_last(&self, prefix: &[u8]) -> bool {
        wait_until(Duration::from_secs(5), || {
            self.conns.lock().unwrap().last().and_then(|c| c.last()).is_some_and(|p| p.starts_with(prefix))
        })
    }

    /// Stops, closes every connection and removes the socket file.
    fn stop(mut self) -> Vec<Vec<Vec<u8>>> {
        self.shutdown();
        self.connections()
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn read_conn(s: UnixStream, idx: usize, stop: &AtomicBool, conns: &Mutex<Vec<Vec<Vec<u8>>>>) {
    s.set_read_timeout(Some(Duration::from_millis(10))).unwrap();
    let mut r = FrameReader::new(s);
    while !stop.load(Ordering::SeqCst) {
        match r.next_frame() {
            Ok(Some(p)) => conns.lock().unwrap()[idx].push(p.to_vec()),
            Ok(None) => return,
            Err(e) if e.is_timeout() => {}
            Err(_) => return,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Addresses

#[test]
fn addresses_parse_and_print() {
    let tcp = |h: &str, p| Address::Tcp { host: h.into(), port: p };
    let cases: Vec<(&str, Address, &str)> = vec![
        ("unix:/run/q.sock", Address::Unix("/run/q.sock".into()), "unix:/run/q.sock"),
        ("/run/q.sock", Address::Unix("/run/q.sock".into()), "unix:/run/q.sock"),
        ("q.sock", Address::Unix("q.sock".into()), "unix:q.sock"),
        ("./dir:x/q.sock", Address::Unix("./dir:x/q.sock".into()), "unix:./dir:x/q.sock"),
        ("tcp:127.0.0.1:7000", tcp("127.0.0.1", 7000), "tcp:127.0.0.1:7000"),
        ("tcp:localhost:0", tcp("localhost", 0), "tcp:localhost:0"),
        ("tcp:[::1]:7000", tcp("::1", 7000), "tcp:[::1]:7000"),
        ("tcp:7000", tcp("127.0.0.1", 7000), "tcp:127.0.0.1:7000"),
        ("file:/tmp/run.qsr", Address::File("/tmp/run.qsr".into()), "file:/tmp/run.qsr"),
    ];
    for (text, want, shown) in cases {
        let got: Address = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(got, want, "{text}");
        assert_eq!(got.to_string(), shown, "{text}");
        assert_eq!(shown.parse::<Address>().unwrap(), want, "{shown} does not round-trip");
    }
}

#[test]
fn bad_addresses_say_what_is_wrong() {
    let cases: Vec<(&str, &str)> = vec![
        ("", "empty address"),
        ("udp:1.2.3.4:5", "unknown address scheme `udp:`"),
        ("http://collector:80", "unknown address scheme `http:`"),
        ("unix:", "without a path"),
        ("file:", "without a path"),
        ("tcp:", "missing port"),
        ("tcp::7000", "missing host"),
        ("tcp:host:", "port `` is not a number"),
        ("tcp:host:99999", "port `99999` is not a number"),
        ("tcp:host:http", "port `http` is not a number"),
    ];
    for (text, want) in cases {
        let err: AddressError = text.parse::<Address>().err().unwrap_or_else(|| panic!("{text} parsed"));
        let msg = err.to_string();
        assert!(msg.contains(want), "{text}: `{msg}` lacks `{want}`");
        // Every message shows the accepted forms.
        assert!(msg.contains("PATH") || msg.contains("HOST:PORT"), "{text}: `{msg}`");
    }
}

// ---------------------------------------------------------------------------------------------
// Framing

/// Hands out at most `chunk` bytes per read, and a WouldBlock before every other read.
struct Trickle {
    data: Vec<u8>,
    pos: usize,
    chunk: usize,
    hiccup: bool,
    reads: usize,
}

impl Read for Trickle {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.reads += 1;
        if self.hiccup && self.reads.is_multiple_of(2) {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = self.chunk.min(buf.len()).min(self.data.len() - self.pos);
        buf[..n].copy_from_slice(&self.data[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

fn read_all_frames(r: &mut FrameReader<Trickle>) -> Result<Vec<Vec<u8>>, FrameError> {
    let mut out = Vec::new();
    let mut timeouts = 0;
    loop {
        match r.next_frame() {
            Ok(Some(p)) => out.push(p.to_vec()),
            Ok(None) => return Ok(out),
            Err(e) if e.is_timeout() => {
                timeouts += 1;
                assert!(timeouts < 100_000, "no progress");
            }
            Err(e) => return Err(e),
        }
    }
}

#[test]
fn frames_survive_any_read_split_and_timeouts() {
    let payloads: Vec<Vec<u8>> = (0..40).map(|i| vec![i as u8; 1 + i * 13]).collect();
    let mut wire = Vec::new();
    for p in &payloads {
        push_frame(&mut wire, p).unwrap();
    }
    for chunk in 1..=9 {
        for hiccup in [false, true] {
            let mut r = FrameReader::new(Trickle { data: wire.clone(), pos: 0, chunk, hiccup, reads: 0 });
            assert_eq!(read_all_frames(&mut r).unwrap(), payloads, "chunk {chunk} hiccup {hiccup}");
        }
    }
    // write_frame and push_frame agree.
    let mut w = Vec::new();
    for p in &payloads {
        write_frame(&mut w, p).unwrap();
    }
    assert_eq!(w, wire);
}

#[test]
fn frames_larger_than_the_buffer_and_the_size_limit() {
    let big = vec![7u8; MAX_FRAME_BYTES];
    let mut wire = Vec::new();
    push_frame(&mut wire, &big).unwrap();
    push_frame(&mut wire, b"after").unwrap();
    let mut r = FrameReader::new(Trickle { data: wire, pos: 0, chunk: 100_000, hiccup: false, reads: 0 });
    assert_eq!(read_all_frames(&mut r).unwrap(), vec![big, b"after".to_vec()]);

    assert!(matches!(
        push_frame(&mut Vec::new(), &vec![0; MAX_FRAME_BYTES + 1]),
        Err(FrameError::Oversize { .. })
    ));
    assert!(matches!(push_frame(&mut Vec::new(), b""), Err(FrameError::Empty)));
}

#[test]
fn malformed_frames_are_rejected() {
    let reader =
        |data: Vec<u8>| FrameReader::new(Trickle { data, pos: 0, chunk: 64, hiccup: false, reads: 0 });
    // A length over the limit is rejected from the 4 length bytes alone: nothing is allocated.
    let mut wire = Vec::new();
    push_frame(&mut wire, b"good").unwrap();
    wire.extend_from_slice(&((MAX_FRAME_BYTES + 1) as u32).to_le_bytes());
    let mut r = reader(wire);
    assert_eq!(r.next_frame().unwrap().unwrap(), b"good");
    match r.next_frame() {
        Err(FrameError::Oversize { len, max }) => {
            assert_eq!((len, max), (MAX_FRAME_BYTES + 1, MAX_FRAME_BYTES))
        }
        other => panic!("expected Oversize, got {other:?}"),
    }
    assert!(matches!(reader(vec![0, 0, 0, 0]).next_frame(), Err(FrameError::Empty)));
    assert!(matches!(reader(vec![u8::MAX; 4]).next_frame(), Err(FrameError::Oversize { .. })));
    // Cut inside a payload and inside a length.
    let mut cut = Vec::new();
    push_frame(&mut cut, b"0123456789").unwrap();
    cut.truncate(9);
    assert!(matches!(reader(cut).next_frame(), Err(FrameError::Truncated { have: 9, need: 14 })));
    assert!(matches!(reader(vec![5, 0]).next_frame(), Err(FrameError::Truncated { have: 2, need: 4 })));
    assert!(reader(Vec::new()).next_frame().unwrap().is_none());
}

/// Hands out one byte per read, each after `delay`: a peer trickling a frame, which no read
/// timeout catches.
struct Slow {
    data: Vec<u8>,
    pos: usize,
    delay: Duration,
}

impl Read for Slow {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        thread::sleep(self.delay);
        let n = 1.min(buf.len()).min(self.data.len() - self.pos);
        buf[..n].copy_from_slice(&self.data[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

#[test]
fn a_deadline_ends_a_read_that_keeps_receiving_bytes_and_keeps_the_partial_frame() {
    let payload = vec![3u8; 5000];
    let mut wire = Vec::new();
    push_frame(&mut wire, b"first").unwrap();
    push_frame(&mut wire, &payload).unwrap();
    let mut r = FrameReader::new(Slow { data: wire, pos: 0, delay: Duration::from_millis(1) });
    assert_eq!(r.next_frame().unwrap().unwrap(), b"first");

    // Reading the whole second frame a byte per millisecond would take over 5 s.
    r.set_deadline(Some(Instant::now() + Duration::from_millis(30)));
    let started = Instant::now();
    let err = r.next_frame().unwrap_err();
    assert!(err.is_timeout(), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
    let partial = r.buffered();
    assert!(partial > 0 && partial < 4 + payload.len(), "{partial}");
    // Past the deadline nothing more is read.
    assert!(r.next_frame().unwrap_err().is_timeout());
    assert_eq!(r.buffered(), partial);

    r.set_deadline(None);
    r.get_mut().delay = Duration::ZERO;
    assert_eq!(r.next_frame().unwrap().unwrap(), &payload[..]);
    assert!(r.next_frame().unwrap().is_none());
}

// ---------------------------------------------------------------------------------------------
// Client

#[test]
fn without_a_collector_send_never_blocks_and_drops_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let addr = Address::Unix(dir.path().join("nobody.sock"));
    let client = Client::start(addr, ClientOptions { queue_capacity: 64, ..fast_options() });
    let t = Instant::now();
    let mut accepted = 0u64;
    for i in 0..20_000 {
        accepted += client.send(rec(i)) as u64;
    }
    // 20k sends do not wait for anything (generous bound for a loaded 2-core machine).
    assert!(t.elapsed() < Duration::from_secs(1), "sends took {:?}", t.elapsed());
    let s = client.stats();
    assert!(accepted <= 64, "accepted {accepted} with a 64-record queue");
    assert_eq!(s.dropped, 20_000 - accepted);
    assert_eq!(s.sent, 0);
    assert_eq!(s.queued, accepted);

    let seen = Arc::new(Mutex::new(None));
    let seen2 = seen.clone();
    let t = Instant::now();
    let s = client.close(
        move |dropped| {
            *seen2.lock().unwrap() = Some(dropped);
            b"closing".to_vec()
        },
        Duration::from_millis(500),
    );
    assert!(t.elapsed() < Duration::from_millis(700), "close took {:?}", t.elapsed());
    // The closing record was told about every record, queued ones included; it was then
    // dropped itself.
    assert_eq!(*seen.lock().unwrap(), Some(20_000));
    assert_eq!(s.dropped, 20_001);
    assert_eq!(s.queued, 0);
    assert!(!client.send(rec(0)), "send after close must be refused");
}

#[test]
fn records_queued_while_the_collector_starts_are_delivered() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("late.sock");
    let opts = ClientOptions { preamble: Some(b"session".to_vec()), ..fast_options() };
    let client = Client::start(Address::Unix(path.clone()), opts);
    for i in 0..100 {
        assert!(client.send(rec(i)));
    }
    thread::sleep(Duration::from_millis(30));
    let server = TestServer::start(&path);
    assert!(wait_until(Duration::from_secs(5), || server.received() == 101), "got {}", server.received());
    let s = client.close(|d| format!("closing dropped={d}").into_bytes(), Duration::from_secs(2));
    assert_eq!((s.sent, s.dropped), (101, 0));
    assert!(server.wait_for_last(b"closing"));
    let conns = server.stop();
    assert_eq!(conns.len(), 1);
    let c = &conns[0];
    assert_eq!(c[0], b"session");
    assert_eq!(c[1..101], (0..100).map(rec).collect::<Vec<_>>()[..]);
    assert_eq!(c[101], b"closing dropped=0");
}

#[test]
fn delivers_everything_in_order_over_tcp() {
    use std::net::TcpListener;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut r = FrameReader::new(s);
        let mut got = Vec::new();
        while let Ok(Some(p)) = r.next_frame() {
            got.push(p.to_vec());
        }
        got
    });
    let addr: Address = format!("tcp:127.0.0.1:{port}").parse().unwrap();
    let opts =
        ClientOptions { preamble: Some(b"session".to_vec()), queue_capacity: 20_000, ..fast_options() };
    let client = Client::start(addr, opts);
    for i in 0..10_000 {
        assert!(client.send(rec(i)));
    }
    let s = client.close(|d| format!("closing {d}").into_bytes(), Duration::from_secs(5));
    drop(client); // closes the socket: the server sees the end of the stream
    assert_eq!((s.sent, s.dropped, s.reconnects), (10_001, 0, 0));
    let got = server.join().unwrap();
    assert_eq!(got.len(), 10_002);
    assert_eq!(got[0], b"session");
    assert!(got[1..10_001].iter().enumerate().all(|(i, p)| *p == rec(i)));
    assert_eq!(got[10_001], b"closing 0");
}

#[test]
fn spools_to_a_run_file_while_no_collector_is_reachable() {
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("spool.qsr");
    let opts = ClientOptions {
        preamble: Some(b"session".to_vec()),
        spool: Some(spool.clone()),
        queue_capacity: 1000,
        ..fast_options()
    };
    let client = Client::start(Address::Unix(dir.path().join("nobody.sock")), opts);
    for i in 0..500 {
        assert!(client.send(rec(i)));
    }
    assert!(wait_until(Duration::from_secs(5), || client.stats().spooled == 500));
    let s = client.close(|d| format!("closing {d}").into_bytes(), Duration::from_secs(2));
    assert_eq!((s.spooled, s.sent, s.dropped), (501, 0, 0));
    let c = read_run_file(&spool).unwrap();
    assert_eq!(c.torn_tail, None);
    assert_eq!(c.payloads.len(), 502);
    assert_eq!(c.payloads[0], b"session");
    assert!(c.payloads[1..501].iter().enumerate().all(|(i, p)| *p == rec(i)));
    assert_eq!(c.payloads[501], b"closing 0");
}

#[test]
fn file_address_writes_a_run_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("direct.qsr");
    let opts = ClientOptions { preamble: Some(b"session".to_vec()), ..fast_options() };
    let client = Client::start(Address::File(path.clone()), opts);
    for i in 0..300 {
        assert!(client.send(rec(i)));
    }
    let s = client.close(|d| format!("closing {d}").into_bytes(), Duration::from_secs(2));
    assert_eq!((s.sent, s.dropped), (301, 0));
    let c = read_run_file(&path).unwrap();
    assert_eq!(c.payloads.len(), 302);
    assert_eq!(c.payloads[0], b"session");
    assert_eq!(c.payloads[301], b"closing 0");
}

#[test]
fn run_files_stop_growing_at_their_limit_and_count_what_they_drop() {
    // A `file:` run file and a spool: records past `max_file_bytes` are dropped and counted;
    // the closing record is written whatever the size (the report needs it).
    let dir = tempfile::tempdir().unwrap();
    let limit = 1000u64;
    for spool in [false, true] {
        let path = dir.path().join(if spool { "spool.qsr" } else { "direct.qsr" });
        let opts = ClientOptions {
            preamble: Some(b"session".to_vec()),
            spool: spool.then(|| path.clone()),
            max_file_bytes: limit,
            queue_capacity: 1000,
            ..fast_options()
        };
        let address = match spool {
            true => Address::Unix(dir.path().join("nobody.sock")),
            false => Address::File(path.clone()),
        };
        let client = Client::start(address, opts);
        for i in 0..300 {
            assert!(client.send(rec(i)));
        }
        let s = client.close(|d| format!("closing {d}").into_bytes(), Duration::from_secs(2));
        let written = if spool { s.spooled } else { s.sent };
        assert_eq!(written + s.dropped, 301, "every record written or counted (spool {spool}): {s:?}");
        assert!(s.dropped > 250, "{s:?}");
        let c = read_run_file(&path).unwrap();
        assert_eq!(c.payloads.len() as u64, written + 1, "the preamble, then what was written");
        assert!(c.payloads[1..c.payloads.len() - 1].iter().enumerate().all(|(i, p)| *p == rec(i)));
        assert!(c.payloads.last().unwrap().starts_with(b"closing "), "the closing record, past the limit");
        let size = std::fs::metadata(&path).unwrap().len();
        assert!(size <= limit + 8 + 16, "{size} bytes");
    }
}

#[test]
fn reconnects_after_a_collector_restart_and_resends_the_preamble() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("restart.sock");
    let server = TestServer::start(&path);
    let opts =
        ClientOptions { preamble: Some(b"session".to_vec()), queue_capacity: 10_000, ..fast_options() };
    let client = Client::start(Address::Unix(path.clone()), opts);
    for i in 0..50 {
        assert!(client.send(rec(i)));
    }
    assert!(wait_until(Duration::from_secs(5), || server.received() == 51));
    let first = server.stop();

    // While the collector is down, records are either held or dropped, never blocking.
    for i in 50..60 {
        client.send(rec(i));
    }
    thread::sleep(Duration::from_millis(20));
    let server = TestServer::start(&path);
    // Keep sending until something arrives on the new connection (bounded).
    let mut i = 60;
    let ok = wait_until(Duration::from_secs(5), || {
        client.send(rec(i));
        i += 1;
        server.received() >= 2
    });
    assert!(ok, "no records after the restart");
    let s = client.close(|d| format!("closing {d}").into_bytes(), Duration::from_secs(2));
    assert!(s.reconnects >= 1, "{s:?}");
    assert!(server.wait_for_last(b"closing"), "closing record not received");
    let second = server.stop();
    assert_eq!(first.len(), 1);
    assert_eq!(first[0][0], b"session");
    let last = second.last().unwrap();
    assert_eq!(last[0], b"session", "preamble must open every connection");
    let closing = last.last().unwrap();
    assert!(closing.starts_with(b"closing "), "{}", String::from_utf8_lossy(closing));
    // Every record is accounted for exactly once: delivered (first or second server) or dropped.
    let delivered: usize = first
        .iter()
        .chain(second.iter())
        .map(|c| c.iter().filter(|p| p.starts_with(b"record")).count())
        .sum();
    assert!(
        delivered as u64 <= s.sent && s.sent + s.dropped == i as u64 + 1,
        "{s:?}, delivered {delivered}, sent {i}"
    );
}

#[test]
fn close_returns_by_its_deadline_when_the_collector_is_stuck() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("stuck.sock");
    let _server = TestServer::start_with(&path, false);
    let opts =
        ClientOptions { queue_capacity: 256, write_timeout: Duration::from_secs(30), ..fast_options() };
    let client = Client::start(Address::Unix(path.clone()), opts);
    // Far more than the socket buffers hold: the sender ends up blocked in a write.
    let big = vec![1u8; 64 << 10];
    let t = Instant::now();
    for _ in 0..2000 {
        client.send(big.clone());
    }
    assert!(t.elapsed() < Duration::from_secs(2), "sends blocked: {:?}", t.elapsed());
    let t = Instant::now();
    let s = client.close(|_| b"closing".to_vec(), Duration::from_millis(300));
    let took = t.elapsed();
    assert!(took < Duration::from_millis(600), "close took {took:?}");
    assert!(s.dropped > 0);
    assert_eq!(s.queued, 0);
}

#[test]
fn drop_without_close_does_not_wait() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("stuck.sock");
    let _server = TestServer::start_with(&path, false);
    let client = Client::start(Address::Unix(path.clone()), fast_options());
    let big = vec![1u8; 64 << 10];
    for _ in 0..500 {
        client.send(big.clone());
    }
    let t = Instant::now();
    drop(client);
    assert!(t.elapsed() < Duration::from_millis(100), "drop took {:?}", t.elapsed());
}

#[test]
fn queued_bytes_are_bounded_too() {
    let dir = tempfile::tempdir().unwrap();
    let opts = ClientOptions { queue_capacity: 1000, max_queued_bytes: 10_000, ..fast_options() };
    let client = Client::start(Address::Unix(dir.path().join("nobody.sock")), opts);
    let accepted = (0..1000).filter(|_| client.send(vec![0; 100])).count();
    assert_eq!(accepted, 100);
    assert_eq!(client.stats().dropped, 900);
}

#[test]
fn empty_and_oversize_payloads_are_refused_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let client = Client::start(Address::Unix(dir.path().join("x.sock")), fast_options());
    assert!(!client.send(Vec::new()));
    assert!(!client.send(vec![0; MAX_FRAME_BYTES + 1]));
    assert!(client.send(vec![0; MAX_FRAME_BYTES]));
    let s = client.stats();
    assert_eq!((s.dropped, s.queued), (2, 1));
}

#[test]
fn a_collector_that_goes_away_falls_back_to_the_spool() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.sock");
    let spool = dir.path().join("spool.qsr");
    let server = TestServer::start(&path);
    let opts = ClientOptions {
        preamble: Some(b"session".to_vec()),
        spool: Some(spool.clone()),
        queue_capacity: 1000,
        ..fast_options()
    };
    let client = Client::start(Address::Unix(path), opts);
    for i in 0..10 {
        client.send(rec(i));
    }
    assert!(wait_until(Duration::from_secs(5), || server.received() == 11));
    server.stop();
    let mut i = 10;
    assert!(wait_until(Duration::from_secs(5), || {
        client.send(rec(i));
        i += 1;
        client.stats().spooled > 0
    }));
    let s = client.close(|_| b"closing".to_vec(), Duration::from_secs(2));
    let c = read_run_file(&spool).unwrap();
    assert_eq!(c.payloads[0], b"session");
    assert_eq!(c.payloads.last().unwrap(), b"closing");
    assert_eq!(c.payloads.len() as u64, s.spooled + 1);
    assert_eq!(s.sent + s.spooled + s.dropped, i as u64 + 1, "{s:?}");
}

#[test]
fn close_with_an_unrepresentable_deadline_does_not_panic() {
    let dir = tempfile::tempdir().unwrap();
    let client = Client::start(Address::Unix(dir.path().join("absent.sock")), ClientOptions::default());
    assert!(client.send(b"record".to_vec()));
    let started = std::time::Instant::now();
    let stats = client.close(|_| b"closing".to_vec(), Duration::MAX);
    assert!(started.elapsed() < Duration::from_secs(30), "close returned");
    assert!(stats.dropped >= 1, "undeliverable records are counted: {stats:?}");
}

#[test]
fn a_file_address_held_by_another_writer_goes_to_a_per_process_file() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared.qsr");
    let first = Client::start(Address::File(shared.clone()), ClientOptions::default());
    assert!(first.send(b"from the first".to_vec()));
    // Let the first sender open (and lock) the file before the second starts.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !shared.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(50));
    let second = Client::start(Address::File(shared.clone()), ClientOptions::default());
    assert!(second.send(b"from the second".to_vec()));
    let s2 = second.close(|_| b"second closing".to_vec(), Duration::from_secs(5));
    let s1 = first.close(|_| b"first closing".to_vec(), Duration::from_secs(5));
    assert_eq!((s1.dropped, s2.dropped), (0, 0), "{s1:?} {s2:?}");
    let own = quantshadow_runtime::transport::per_process_path(&shared);
    assert_eq!(
        read_run_file(&shared).unwrap().payloads,
        vec![b"from the first".to_vec(), b"first closing".to_vec()]
    );
    assert_eq!(
        read_run_file(&own).unwrap().payloads,
        vec![b"from the second".to_vec(), b"second closing".to_vec()]
    );
}

#[test]
fn close_against_a_stuck_collector_accounts_for_every_record() {
    // A collector that accepts and never reads: the socket buffer fills, the sender blocks in a
    // write, and close gives up at its deadline. Every record must be counted as sent or
    // dropped in the stats close returns, including those stuck in the sender's buffer.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("stuck.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let holder = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        std::thread::sleep(Duration::from_millis(1200));
        drop(stream);
    });
    let client = Client::start(Address::Unix(path), ClientOptions::default());
    // Sends refused because the queue was full count as dropped at once.
    for i in 0..200_000u64 {
        client.send(i.to_le_bytes().repeat(8));
    }
    std::thread::sleep(Duration::from_millis(300));
    let stats = client.close(|_| b"closing".to_vec(), Duration::from_millis(300));
    assert_eq!(stats.queued, 0, "{stats:?}");
    assert_eq!(stats.sent + stats.dropped, 200_000 + 1, "every record and the closing one: {stats:?}");
    holder.join().unwrap();
}

// ---------------------------------------------------------------------------------------------
// A collector that closes connections: eviction of an idle client, refusal when full, a write
// cut short. These fake collectors act on their own sockets step by step, so each ordering is
// forced rather than waited for.

/// The next connection on a non-blocking `listener` (bounded wait: the client connects on its
/// own schedule), as a blocking stream with a read timeout that fails a stuck test.
fn accept_next(listener: &UnixListener) -> UnixStream {
    let mut got = None;
    let ok = wait_until(Duration::from_secs(10), || {
        got = got.take().or_else(|| listener.accept().ok().map(|(s, _)| s));
        got.is_some()
    });
    assert!(ok, "the client did not connect");
    let s = got.unwrap();
    s.set_nonblocking(false).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

fn read_frames(r: &mut FrameReader<UnixStream>, n: usize) -> Vec<Vec<u8>> {
    (0..n).map(|i| r.next_frame().unwrap_or_else(|e| panic!("frame {i}: {e}")).unwrap().to_vec()).collect()
}

/// Bytes waiting to be read on `s` (FIONREAD).
fn unread(s: &UnixStream) -> usize {
    use std::os::fd::AsRawFd;
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int; the fd is open while `s` lives.
    assert_eq!(unsafe { libc::ioctl(s.as_raw_fd(), libc::FIONREAD, &mut n) }, 0);
    n as usize
}

fn session_options() -> ClientOptions {
    ClientOptions {
        preamble: Some(b"session".to_vec()),
        write_timeout: Duration::from_secs(30),
        ..fast_options()
    }
}

/// Accepts the client's connection and reads its preamble and `records`; returns the reader
/// once the client has written (and counted as sent) all of them, i.e. is idle.
fn serve_until_idle(
    listener: &UnixListener,
    client: &Client,
    records: &[Vec<u8>],
) -> FrameReader<UnixStream> {
    let mut r = FrameReader::new(accept_next(listener));
    let before = client.stats().sent;
    for p in records {
        assert!(client.send(p.clone()));
    }
    let mut want = vec![b"session".to_vec()];
    want.extend(records.iter().cloned());
    assert_eq!(read_frames(&mut r, want.len()), want);
    assert!(wait_until(Duration::from_secs(5), || client.stats().sent == before + records.len() as u64));
    r
}

#[test]
fn an_idle_client_whose_connection_was_closed_loses_nothing_and_resends_its_session_first() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("evict.sock");
    let listener = UnixListener::bind(&path).unwrap();
    listener.set_nonblocking(true).unwrap();
    let client = Client::start(Address::Unix(path), session_options());
    let first: Vec<Vec<u8>> = (0..10).map(rec).collect();
    // The collector closes the idle client's connection (eviction: what it received is kept).
    drop(serve_until_idle(&listener, &client, &first));

    // The next batch finds the hang-up before it is written: kept, not dropped, and sent on
    // the next connection right after the session record.
    for i in 10..40 {
        assert!(client.send(rec(i)));
    }
    let mut r = FrameReader::new(accept_next(&listener));
    let mut want = vec![b"session".to_vec()];
    want.extend((10..40).map(rec));
    assert_eq!(read_frames(&mut r, want.len()), want);
    let s = client.close(|d| format!("closing dropped={d}").into_bytes(), Duration::from_secs(5));
    assert_eq!(read_frames(&mut r, 1), vec![b"closing dropped=0".to_vec()]);
    assert_eq!((s.sent, s.dropped, s.queued, s.reconnects, s.refused), (41, 0, 0, 1, 0), "{s:?}");
}

#[test]
fn a_full_collector_refusing_connections_grows_the_backoff_and_loses_nothing_within_the_bounds() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("full.sock");
    let listener = UnixListener::bind(&path).unwrap();
    listener.set_nonblocking(true).unwrap();
    let initial = Duration::from_millis(2);
    let capacity = 64;
    let opts = ClientOptions {
        queue_capacity: capacity,
        backoff_initial: initial,
        backoff_max: Duration::from_secs(1),
        ..session_options()
    };
    let client = Client::start(Address::Unix(path), opts);
    drop(serve_until_idle(&listener, &client, &(0..5).map(rec).collect::<Vec<_>>()));

    // Evicted, then refused a few times: accepted and closed without a byte read, as a full
    // collector does. Records keep coming meanwhile; the first of them find the hang-up and
    // are kept.
    let mut next = 5;
    const REFUSALS: u32 = 5;
    for k in 1..=REFUSALS {
        for _ in 0..8 {
            assert!(client.send(rec(next)));
            next += 1;
        }
        let s = accept_next(&listener);
        // Only the session record goes out on a connection on trial.
        assert!(wait_until(Duration::from_secs(5), || unread(&s) >= 4 + 7));
        assert_eq!(unread(&s), 4 + 7, "records were written to a connection on trial");
        drop(s);
        assert!(wait_until(Duration::from_secs(5), || client.stats().refused == u64::from(k)));
        let st = client.stats();
        // The backoff grows per refusal: a connection closed right after it was made is no success.
        assert_eq!(st.retry_delay, initial * 2u32.pow(k - 1), "after refusal {k}: {st:?}");
        assert_eq!((st.sent, st.dropped, st.queued, st.reconnects), (5, 0, next as u64 - 5, 0), "{st:?}");
    }
    // The kept batch counts against the queue bound: the queue takes only what is left of it.
    let mut refused_by_send = 0u64;
    for _ in 0..2 * capacity {
        if client.send(rec(next)) {
            next += 1;
        } else {
            refused_by_send += 1;
        }
    }
    let st = client.stats();
    assert_eq!(st.queued, capacity as u64, "{st:?}");
    assert_eq!(st.dropped, refused_by_send, "{st:?}");

    // The collector has room again: every record it was not refused arrives, once, in order.
    let mut r = FrameReader::new(accept_next(&listener));
    let mut want = vec![b"session".to_vec()];
    want.extend((5..next).map(rec));
    assert_eq!(read_frames(&mut r, want.len()), want);
    let s = client.close(|d| format!("closing dropped={d}").into_bytes(), Duration::from_secs(5));
    assert_eq!(read_frames(&mut r, 1), vec![format!("closing dropped={refused_by_send}").into_bytes()]);
    assert_eq!(
        (s.sent, s.dropped, s.reconnects, s.refused),
        (next as u64 + 1, refused_by_send, 1, 5),
        "{s:?}"
    );
    assert_eq!(s.retry_delay, Duration::ZERO, "an accepted connection resets the backoff");
}

#[test]
fn a_write_cut_short_by_the_collector_counts_its_records_as_dropped() {
    // Part of the write reached the collector, which may have stored its complete frames:
    // sending the batch again could store them twice, so its records are dropped and counted.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cut.sock");
    let listener = UnixListener::bind(&path).unwrap();
    listener.set_nonblocking(true).unwrap();
    let client = Client::start(Address::Unix(path), session_options());
    // Queued while the connection is on trial, so that they go out in one write: larger than
    // any socket buffer (212992 bytes by default), it cannot be transferred in full while the
    // collector does not read.
    let big = vec![7u8; MAX_FRAME_BYTES];
    let batch = 4 + rec(0).len() + 4 + rec(1).len() + 4 + big.len();
    for p in [rec(0), rec(1), big] {
        assert!(client.send(p));
    }
    let mut s = accept_next(&listener);
    let mut preamble = [0u8; 4 + 7];
    s.read_exact(&mut preamble).unwrap();
    assert_eq!(&preamble[4..], b"session");
    // The write has started; the collector closes while it is blocked part way.
    assert!(wait_until(Duration::from_secs(5), || unread(&s) > 0));
    let transferred = unread(&s);
    assert!(transferred < batch, "the whole write fit in the socket ({transferred} bytes): cannot cut it");
    drop(s);
    assert!(wait_until(Duration::from_secs(5), || client.stats().dropped == 3), "{:?}", client.stats());

    // The client reconnects at once (that connection had worked) and goes on.
    let mut r = FrameReader::new(accept_next(&listener));
    assert!(client.send(rec(2)));
    assert_eq!(read_frames(&mut r, 2), vec![b"session".to_vec(), rec(2)]);
    let st = client.close(|d| format!("closing dropped={d}").into_bytes(), Duration::from_secs(5));
    assert_eq!(read_frames(&mut r, 1), vec![b"closing dropped=3".to_vec()]);
    assert_eq!((st.sent, st.dropped, st.reconnects, st.refused), (2, 3, 1, 0), "{st:?}");
}

#[test]
fn records_kept_for_a_connection_that_never_comes_are_in_the_closing_count() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gone.sock");
    let listener = UnixListener::bind(&path).unwrap();
    listener.set_nonblocking(true).unwrap();
    let client = Client::start(Address::Unix(path.clone()), session_options());
    drop(serve_until_idle(&listener, &client, &[rec(0)]));
    // The collector goes away after closing the connection: the next batch is kept, and no
    // connection will take it.
    drop(listener);
    std::fs::remove_file(&path).unwrap();
    for i in 1..=20 {
        assert!(client.send(rec(i)));
    }
    assert!(wait_until(Duration::from_secs(5), || client.stats().retry_delay > Duration::ZERO));
    let st = client.stats();
    assert_eq!((st.queued, st.dropped), (20, 0), "{st:?}");
    let told = Arc::new(Mutex::new(None));
    let told2 = told.clone();
    let st = client.close(
        move |d| {
            *told2.lock().unwrap() = Some(d);
            b"closing".to_vec()
        },
        Duration::from_secs(2),
    );
    assert_eq!(*told.lock().unwrap(), Some(20), "the closing record counts the kept records");
    assert_eq!((st.sent, st.dropped, st.queued), (1, 21, 0), "{st:?}");
}

#[test]
fn a_client_closing_after_its_idle_connection_was_closed_delivers_everything_on_a_new_one() {
    // Closing right after the eviction: the hang-up is found while draining (records queued)
    // or by the closing record itself (nothing queued). Either way nothing is lost.
    for queued in [0, 20] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("exit.sock");
        let listener = UnixListener::bind(&path).unwrap();
        listener.set_nonblocking(true).unwrap();
        let client = Client::start(Address::Unix(path), session_options());
        drop(serve_until_idle(&listener, &client, &[rec(0)]));
        for i in 1..=queued {
            assert!(client.send(rec(i)));
        }
        // `close` waits for the delivery: the collector serves the new connection meanwhile.
        let server = thread::spawn(move || {
            let mut r = FrameReader::new(accept_next(&listener));
            read_frames(&mut r, 1 + queued + 1)
        });
        let s = client.close(|d| format!("closing dropped={d}").into_bytes(), Duration::from_secs(5));
        let mut want = vec![b"session".to_vec()];
        want.extend((1..=queued).map(rec));
        want.push(b"closing dropped=0".to_vec());
        assert_eq!(server.join().unwrap(), want, "{queued} queued");
        assert_eq!((s.sent, s.dropped, s.reconnects), (queued as u64 + 2, 0, 1), "{queued} queued: {s:?}");
    }
}

/// For 700 ms, sends record after record (from number `first`) while `listener` (non-blocking)
/// accepts each connection, reads its preamble and hangs up. Returns (connections, the next
/// record's number).
fn hang_up_after_each_preamble(client: &Client, listener: &UnixListener, first: usize) -> (usize, usize) {
    let (mut connections, mut next) = (0, first);
    let end = Instant::now() + Duration::from_millis(700);
    while Instant::now() < end {
        client.send(rec(next));
        next += 1;
        match listener.accept() {
            Ok((s, _)) => {
                connections += 1;
                s.set_nonblocking(false).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let mut r = FrameReader::new(s);
                assert_eq!(read_frames(&mut r, 1), vec![b"session".to_vec()]);
                // The client sees the preamble read (its trial passes) before the hang-up.
                thread::sleep(Duration::from_millis(3));
                drop(r);
            }
            Err(_) => thread::sleep(Duration::from_millis(2)),
        }
    }
    (connections, next)
}

#[test]
fn a_collector_that_hangs_up_while_a_spool_is_open_leaves_the_sender_resting() {
    // The spool is opened by a first failed connect (no collector yet). Then each connection
    // is accepted and closed soon after, while the host keeps sending: records kept from the
    // lost connection wait for the next one, which waits out the backoff. The sender must
    // rest until then, not go round its loop (the spool is a destination, but kept records go
    // first, to the next connection).
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hangup-spool.sock");
    let opts = ClientOptions {
        backoff_initial: Duration::from_millis(20),
        backoff_max: Duration::from_secs(2),
        spool: Some(dir.path().join("spool.qsr")),
        ..session_options()
    };
    let client = Client::start(Address::Unix(path.clone()), opts);
    client.send(rec(0));
    assert!(wait_until(Duration::from_secs(5), || client.stats().spooled == 1), "{:?}", client.stats());
    let listener = UnixListener::bind(&path).unwrap();
    listener.set_nonblocking(true).unwrap();
    let (connections, next) = hang_up_after_each_preamble(&client, &listener, 1);
    let st = client.stats();
    assert!(connections >= 2, "{connections} connections: {st:?}");
    // A few rounds per record sent and per connection; a spinning sender makes millions.
    assert!(st.sender_rounds < 20 * next as u64, "{} rounds for {next} records: {st:?}", st.sender_rounds);
    drop(listener);
    let s = client.close(|d| format!("closing dropped={d}").into_bytes(), Duration::from_secs(1));
    assert_eq!(
        s.sent + s.spooled + s.dropped + s.queued,
        next as u64 + 1,
        "every record accounted for: {s:?}"
    );
}

#[test]
fn a_collector_that_hangs_up_after_each_preamble_is_not_redialled_in_a_loop() {
    // Each connection is accepted (its preamble read: the trial passes) and closed soon after,
    // while the host keeps sending. A connection lost that soon counts as a failed attempt, so
    // the backoff grows (20 ms, 40 ms, 80 ms, ...): a handful of connections in 700 ms, where
    // redialling at once after each loss made one per write.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hangup.sock");
    let listener = UnixListener::bind(&path).unwrap();
    listener.set_nonblocking(true).unwrap();
    let opts = ClientOptions {
        backoff_initial: Duration::from_millis(20),
        backoff_max: Duration::from_secs(2),
        ..session_options()
    };
    let client = Client::start(Address::Unix(path), opts);
    let (connections, next) = hang_up_after_each_preamble(&client, &listener, 0);
    let st = client.stats();
    assert!((2..=12).contains(&connections), "{connections} connections in 700 ms: {st:?}");
    assert!(st.retry_delay >= Duration::from_millis(40), "the backoff grew: {st:?}");
    // No collector any more: what was not sent is dropped and counted at close.
    drop(listener);
    let s = client.close(|d| format!("closing dropped={d}").into_bytes(), Duration::from_secs(1));
    // The records and the closing one, each sent or counted as dropped.
    assert_eq!(s.sent + s.dropped + s.queued, next as u64 + 1, "every record accounted for: {s:?}");
}
