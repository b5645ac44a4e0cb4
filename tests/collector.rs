//! Collector end to end: real encoded records from concurrent clients, misbehaving clients,
//! socket hygiene, and the `quantshadow collect` binary killed and restarted on one file.

use quantshadow_cli::collect::{CollectError, CollectOptions, Collector};
use quantshadow_runtime::formats::Format;
use quantshadow_runtime::metrics::compare_matrix;
use quantshadow_runtime::problem::{Activation, ComputeType, Order, Transpose};
use quantshadow_runtime::record::{
    self, CheckMode, ClosingRecord, GemmObservation, ProblemSummary, Record, RecordError, SessionRecord,
    SCHEMA_MAJOR,
};
use quantshadow_runtime::runfile::{read_run_file, FRAME_HEADER_LEN};
use quantshadow_runtime::transport::{push_frame, Address, Client, ClientOptions, MAX_FRAME_BYTES};
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------------
// Records

fn session(id: u64) -> Record {
    Record::Session(SessionRecord {
        session_id: id,
        host: "testhost".into(),
        pid: 1000 + id as u32,
        rank: -1,
        device_name: "host".into(),
        device_arch: "x86_64".into(),
        library_versions: vec![],
        label: format!("client {id}"),
        start_time_ns: 1,
        settings: vec![],
    })
}

fn observation(session_id: u64, site: u64, seq: u64, failing: bool) -> Record {
    let r: Vec<f64> = (0..64).map(|i| (i as f64 * 0.37).sin()).collect();
    // Half the magnitude: cosine 1, but NMSE and norm ratio fail (the fn/fnuz bug shape).
    // Passing: a tiny relative error, as a real low-precision GEMM has (and a finite SQNR).
    let scale = if failing { 0.5 } else { 1.0 + 1e-6 };
    let p: Vec<f64> = r.iter().enumerate().map(|(i, v)| v * scale + 1e-7 * (i % 3) as f64).collect();
    Record::Observation(GemmObservation {
        session_id,
        site_id: site,
        site_ordinal: site as u32,
        site_name: Some(format!("model.layers.{site}.mlp.down_proj")),
        call_seq: seq,
        entry_point: "cublasLtMatmul".into(),
        backend: None,
        problem: ProblemSummary {
            m: 8,
            n: 8,
            k: 64,
            batch: 1,
            trans_a: Transpose::T,
            trans_b: Transpose::N,
            a_format: Format::E4m3fn,
            b_format: Format::E4m3fn,
            d_format: Format::Bf16,
            a_order: Order::ColMajor,
            b_order: Order::ColMajor,
            d_order: Order::ColMajor,
            a_scale: None,
            b_scale: None,
            has_bias: false,
            activation: Activation::None,
            compute: ComputeType::F32,
            fast_accum: false,
            has_d_scale: false,
        },
        mode: CheckMode::Sketch,
        metrics: Some(compare_matrix(&p, &r, 8, 8)),
        rows_checked: 8,
        sketch_seed: 42,
        sketch_prod: vec![0.5; 8],
        sketch_ref: vec![0.5; 8],
        logits: None,
        logits_rows: vec![],
        flags: 0,
        timestamp_ns: seq,
    })
}

fn closing(session_id: u64, dropped: u64) -> Record {
    Record::Closing(ClosingRecord {
        session_id,
        calls_seen: 0,
        sampled: 0,
        checked: 0,
        skipped: vec![],
        dropped,
        end_time_ns: 2,
    })
}

fn enc(r: &Record) -> Vec<u8> {
    record::encode(r)
}

/// An observation whose check mode is a value this build does not know, as a newer minor may
/// add. Built from two encodings that differ only in the mode, so only in the mode's byte.
fn observation_with_unknown_mode(session_id: u64) -> Vec<u8> {
    let with_mode = |mode| {
        let mut r = observation(session_id, 1, 0, false);
        if let Record::Observation(o) = &mut r {
            o.mode = mode;
        }
        enc(&r)
    };
    let (rows, mut bytes) = (with_mode(CheckMode::Rows), with_mode(CheckMode::Full));
    let differ: Vec<usize> = (0..rows.len()).filter(|&i| rows.get(i) != bytes.get(i)).collect();
    assert_eq!((rows.len(), differ.len()), (bytes.len(), 1));
    bytes[differ[0]] = 200;
    assert_eq!(record::decode(&bytes), Err(RecordError::UnknownEnum { what: "CheckMode", value: 200 }));
    bytes
}

/// A record of the next schema major: an envelope holding only its two version fields, the
/// part every major keeps readable.
fn record_of_the_next_major() -> Vec<u8> {
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&16u32.to_le_bytes()); // root table at byte 16
    bytes.extend_from_slice(b"QSR1");
    // vtable at byte 8: its size, the table's size, where version_major and version_minor sit.
    for v in [8u16, 8, 4, 6] {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    bytes.extend_from_slice(&8i32.to_le_bytes()); // table to vtable: 16 - 8
    bytes.extend_from_slice(&(SCHEMA_MAJOR + 1).to_le_bytes());
    bytes.extend_from_slice(&0u16.to_le_bytes());
    match record::decode(&bytes) {
        Err(RecordError::UnsupportedVersion { found_major, .. }) => assert_eq!(found_major, SCHEMA_MAJOR + 1),
        other => panic!("expected UnsupportedVersion, got {other:?}"),
    }
    bytes
}

// ---------------------------------------------------------------------------------------------
// Helpers

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

fn client_options(session_id: u64) -> ClientOptions {
    ClientOptions {
        preamble: Some(enc(&session(session_id))),
        queue_capacity: 8192,
        backoff_initial: Duration::from_millis(5),
        backoff_max: Duration::from_millis(50),
        ..ClientOptions::default()
    }
}

/// Sends a session of `n` observations (site = seq % sites) and closes it.
fn run_session(addr: &Address, id: u64, n: u64, sites: u64, failing_site: Option<u64>) -> u64 {
    let client = Client::start(addr.clone(), client_options(id));
    for seq in 0..n {
        let site = seq % sites;
        assert!(client.send(enc(&observation(id, site, seq, Some(site) == failing_site))), "queue full");
    }
    let s = client.close(|dropped| enc(&closing(id, dropped)), Duration::from_secs(10));
    assert_eq!(s.dropped, 0, "session {id}: {s:?}");
    s.sent
}

fn decode_all(payloads: &[Vec<u8>]) -> Vec<Record> {
    payloads
        .iter()
        .map(|p| record::decode(p).expect("run file holds a record that does not decode"))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// In-process collector

#[test]
fn eight_concurrent_clients_over_a_unix_socket() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run.qsr");
    let listen = Address::Unix(dir.path().join("c.sock"));
    let collector = Collector::start(&listen, &out).unwrap();
    let addr = collector.local_address().clone();
    let per_client = 2000u64;
    let handles: Vec<_> = (0..8u64)
        .map(|id| {
            let addr = addr.clone();
            // Session 0 has one failing site.
            thread::spawn(move || run_session(&addr, id, per_client, 10, (id == 0).then_some(3)))
        })
        .collect();
    let sent: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(sent, 8 * (per_client + 1));
    let expected = 8 * (per_client + 2); // + the preamble of each connection
    assert!(
        wait_until(Duration::from_secs(10), || collector.stats().records == expected),
        "{:?}",
        collector.stats()
    );
    let summary = collector.shutdown();
    let st = &summary.stats;
    assert_eq!((st.records, st.sessions, st.sites, st.failing_sites), (expected, 8, 80, 1), "{st:?}");
    assert_eq!((st.clients, st.bad_clients, st.lost_records), (8, 0, 0));
    assert!(summary.error.is_none());

    let contents = read_run_file(&out).unwrap();
    assert_eq!(contents.torn_tail, None);
    let records = decode_all(&contents.payloads);
    assert_eq!(records.len() as u64, expected);
    // Within a session the order is the client's: session, observations by call_seq, closing.
    for id in 0..8u64 {
        let mine: Vec<&Record> = records.iter().filter(|r| r.session_id() == id).collect();
        assert!(matches!(mine[0], Record::Session(_)));
        assert!(matches!(mine.last().unwrap(), Record::Closing(c) if c.dropped == 0));
        let seqs: Vec<u64> = mine
            .iter()
            .filter_map(|r| if let Record::Observation(o) = r { Some(o.call_seq) } else { None })
            .collect();
        assert_eq!(seqs, (0..per_client).collect::<Vec<_>>(), "session {id}");
    }
}

#[test]
fn garbage_clients_are_disconnected_and_the_others_unaffected() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run.qsr");
    let sock = dir.path().join("c.sock");
    let collector = Collector::start(&Address::Unix(sock.clone()), &out).unwrap();
    let addr = collector.local_address().clone();
    let good = {
        let addr = addr.clone();
        thread::spawn(move || run_session(&addr, 1, 3000, 5, None))
    };
    // 1: an absurd frame length. 2: a well-framed payload that is not a record. 3: good records,
    // then garbage (the good ones are kept).
    let mut oversize = UnixStream::connect(&sock).unwrap();
    oversize.write_all(&u32::MAX.to_le_bytes()).unwrap();
    let mut not_a_record = UnixStream::connect(&sock).unwrap();
    let mut wire = Vec::new();
    push_frame(&mut wire, b"this is not a flatbuffer").unwrap();
    not_a_record.write_all(&wire).unwrap();
    let mut late_garbage = UnixStream::connect(&sock).unwrap();
    let mut wire = Vec::new();
    push_frame(&mut wire, &enc(&session(77))).unwrap();
    push_frame(&mut wire, &enc(&observation(77, 1, 0, false))).unwrap();
    push_frame(&mut wire, &[0xff; 40]).unwrap();
    late_garbage.write_all(&wire).unwrap();

    // Each bad connection is closed by the collector: reads see the end of the stream.
    for s in [&mut oversize, &mut not_a_record, &mut late_garbage] {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut b = [0u8; 1];
        assert_eq!(s.read(&mut b).unwrap(), 0, "collector must close a bad client");
    }
    assert_eq!(good.join().unwrap(), 3001);
    let expected = 3002 + 2;
    assert!(
        wait_until(Duration::from_secs(10), || collector.stats().records == expected),
        "{:?}",
        collector.stats()
    );
    let summary = collector.shutdown();
    assert_eq!(summary.stats.bad_clients, 3);
    assert_eq!(summary.stats.clients, 4);
    let records = decode_all(&read_run_file(&out).unwrap().payloads);
    assert_eq!(records.iter().filter(|r| r.session_id() == 1).count(), 3002);
    assert_eq!(records.iter().filter(|r| r.session_id() == 77).count(), 2);
}

#[test]
fn records_of_a_newer_minor_are_stored_as_received_and_another_major_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run.qsr");
    let sock = dir.path().join("c.sock");
    let collector = Collector::start(&Address::Unix(sock.clone()), &out).unwrap();
    let sent = vec![
        enc(&session(4)),
        enc(&observation(4, 0, 0, false)),
        observation_with_unknown_mode(4),
        enc(&observation(4, 2, 1, false)),
        enc(&closing(4, 0)),
    ];
    let mut wire = Vec::new();
    for payload in &sent {
        push_frame(&mut wire, payload).unwrap();
    }
    let mut client = UnixStream::connect(&sock).unwrap();
    client.write_all(&wire).unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || collector.stats().records == sent.len() as u64),
        "{:?}",
        collector.stats()
    );
    // Still connected: a bad client would have been closed.
    client.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let still_open = client.read(&mut [0u8; 1]).unwrap_err();
    assert_eq!(still_open.kind(), std::io::ErrorKind::WouldBlock, "{still_open}");
    // A record of the next major is not stored: this build's report would refuse the file.
    let mut other = UnixStream::connect(&sock).unwrap();
    let mut wire = Vec::new();
    push_frame(&mut wire, &record_of_the_next_major()).unwrap();
    other.write_all(&wire).unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || collector.stats().bad_clients == 1),
        "{:?}",
        collector.stats()
    );
    let summary = collector.shutdown();
    let st = &summary.stats;
    assert_eq!((st.records, st.unreadable_records, st.bad_clients), (5, 1, 1), "{st:?}");
    assert_eq!((st.sessions, st.sites), (1, 2), "{st:?}");
    assert_eq!(read_run_file(&out).unwrap().payloads, sent);
}

#[test]
fn shutdown_is_not_held_up_by_a_client_trickling_a_large_frame() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("c.sock");
    let collector = Collector::start(&Address::Unix(sock.clone()), &dir.path().join("run.qsr")).unwrap();
    let mut client = UnixStream::connect(&sock).unwrap();
    // A byte every few ms is well inside any read timeout, and the frame takes hours to finish.
    client.write_all(&(MAX_FRAME_BYTES as u32).to_le_bytes()).unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let trickler = {
        let done = done.clone();
        thread::spawn(move || {
            while !done.load(Ordering::Relaxed) && client.write_all(&[0]).is_ok() {
                thread::sleep(Duration::from_millis(5));
            }
        })
    };
    assert!(wait_until(Duration::from_secs(5), || collector.stats().active_clients == 1));
    thread::sleep(Duration::from_millis(200)); // well inside the frame by now
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || tx.send(collector.shutdown()).unwrap());
    // The drain limit is about a second; a hang is what this catches, not the exact time.
    let summary = rx.recv_timeout(Duration::from_secs(10));
    done.store(true, Ordering::Relaxed);
    let summary = summary.expect("shutdown waited for a client that trickles");
    trickler.join().unwrap();
    assert_eq!((summary.stats.records, summary.stats.bad_clients), (0, 0), "{:?}", summary.stats);
}

#[test]
fn tcp_port_zero_reports_the_real_port() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run.qsr");
    let collector = Collector::start(&"tcp:127.0.0.1:0".parse().unwrap(), &out).unwrap();
    let addr = collector.local_address().clone();
    assert!(matches!(&addr, Address::Tcp { host, port } if host == "127.0.0.1" && *port != 0), "{addr}");
    assert_eq!(run_session(&addr, 5, 100, 3, None), 101);
    assert!(wait_until(Duration::from_secs(10), || collector.stats().records == 102));
    let summary = collector.shutdown();
    assert_eq!((summary.stats.sessions, summary.stats.sites), (1, 3));
}

#[test]
fn unix_socket_is_private_live_ones_are_kept_stale_ones_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("c.sock");
    let listen = Address::Unix(sock.clone());
    let a = Collector::start(&listen, &dir.path().join("a.qsr")).unwrap();
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    // A live collector is never displaced.
    match Collector::start(&listen, &dir.path().join("b.qsr")) {
        Err(CollectError::InUse(_)) => {}
        Err(e) => panic!("expected InUse, got {e}"),
        Ok(_) => panic!("a second collector took over a live socket"),
    }
    a.shutdown();
    assert!(!sock.exists(), "shutdown must remove its socket file");

    // A socket file nobody listens on (a collector killed earlier) is replaced.
    drop(UnixListener::bind(&sock).unwrap());
    assert!(sock.exists());
    let c = Collector::start(&listen, &dir.path().join("c.qsr")).unwrap();
    c.shutdown();

    // A regular file is never deleted.
    std::fs::write(&sock, b"precious").unwrap();
    assert!(matches!(Collector::start(&listen, &dir.path().join("d.qsr")), Err(CollectError::NotASocket(_))));
    assert_eq!(std::fs::read(&sock).unwrap(), b"precious");

    // Nor can two collectors write one run file.
    let out = dir.path().join("shared.qsr");
    let first = Collector::start(&Address::Unix(dir.path().join("1.sock")), &out).unwrap();
    let second = Collector::start(&Address::Unix(dir.path().join("2.sock")), &out);
    assert!(second.is_err());
    assert!(!dir.path().join("2.sock").exists(), "a failed start must not leave a socket");
    first.shutdown();
}

#[test]
fn max_clients_refuses_extra_connections() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("c.sock");
    let options = CollectOptions { max_clients: 1, ..CollectOptions::default() };
    let collector =
        Collector::start_with(&Address::Unix(sock.clone()), &dir.path().join("run.qsr"), options).unwrap();
    let _first = UnixStream::connect(&sock).unwrap();
    assert!(wait_until(Duration::from_secs(5), || collector.stats().active_clients == 1));
    let mut second = UnixStream::connect(&sock).unwrap();
    second.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(second.read(&mut [0u8; 1]).unwrap(), 0, "the extra connection must be closed");
    assert_eq!(collector.stats().refused_clients, 1);
}

/// Writes `records` as socket frames.
fn send_records(s: &mut UnixStream, records: &[Record]) {
    let mut wire = Vec::new();
    for r in records {
        push_frame(&mut wire, &enc(r)).unwrap();
    }
    s.write_all(&wire).unwrap();
}

/// Whether the collector closed `s` (reads see the end of the stream) rather than keeping it.
fn closed_by_collector(s: &mut UnixStream) -> bool {
    s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    match s.read(&mut [0u8; 1]) {
        Ok(0) => true,
        Ok(_) => panic!("the collector never writes"),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
        Err(e) => panic!("{e}"),
    }
}

fn wait_closed(s: &mut UnixStream) -> bool {
    wait_until(Duration::from_secs(5), || closed_by_collector(s))
}

#[test]
fn silent_clients_in_every_slot_do_not_lock_out_a_real_client() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run.qsr");
    let sock = dir.path().join("c.sock");
    // No minimum idle time: the test does not wait for one (the next test covers it).
    let options =
        CollectOptions { max_clients: 4, evict_idle_after: Duration::ZERO, ..CollectOptions::default() };
    let collector = Collector::start_with(&Address::Unix(sock.clone()), &out, options).unwrap();
    let addr = collector.local_address().clone();
    let mut silent: Vec<UnixStream> = (0..4).map(|_| UnixStream::connect(&sock).unwrap()).collect();
    assert!(wait_until(Duration::from_secs(5), || collector.stats().active_clients == 4));

    // A real client, as the shim sends: session, observations, closing record.
    assert_eq!(run_session(&addr, 9, 500, 5, None), 501);
    assert!(
        wait_until(Duration::from_secs(10), || collector.stats().records == 502),
        "{:?}",
        collector.stats()
    );
    let st = collector.stats();
    assert_eq!((st.evicted_clients, st.refused_clients, st.bad_clients), (1, 0, 0), "{st:?}");
    // The one idle longest made room; the others still have their slots.
    assert!(wait_closed(&mut silent[0]), "the oldest silent connection must be closed");
    for s in &mut silent[1..] {
        assert!(!closed_by_collector(s));
    }
    let summary = collector.shutdown();
    assert_eq!(summary.stats.evicted_clients, 1);
    let records = decode_all(&read_run_file(&out).unwrap().payloads);
    assert_eq!(records.len(), 502);
    assert!(records.iter().all(|r| r.session_id() == 9));
}

#[test]
fn eviction_takes_silent_connections_first_and_keeps_what_an_evicted_client_sent() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run.qsr");
    let sock = dir.path().join("c.sock");
    let options =
        CollectOptions { max_clients: 2, evict_idle_after: Duration::ZERO, ..CollectOptions::default() };
    let collector = Collector::start_with(&Address::Unix(sock.clone()), &out, options).unwrap();
    let batch = |id: u64| -> Vec<Record> {
        let mut v = vec![session(id)];
        v.extend((0..3).map(|seq| observation(id, seq, seq, false)));
        v
    };
    // A client that sent records and went quiet without closing, then a silent one.
    let mut quiet = UnixStream::connect(&sock).unwrap();
    send_records(&mut quiet, &batch(21));
    assert!(wait_until(Duration::from_secs(10), || collector.stats().records == 4));
    let mut silent = UnixStream::connect(&sock).unwrap();
    assert!(wait_until(Duration::from_secs(5), || collector.stats().active_clients == 2));

    // A newcomer: the silent connection goes, though the quiet one is older.
    let mut first = UnixStream::connect(&sock).unwrap();
    send_records(&mut first, &batch(22));
    assert!(
        wait_until(Duration::from_secs(10), || collector.stats().records == 8),
        "{:?}",
        collector.stats()
    );
    assert!(wait_closed(&mut silent));
    assert!(!closed_by_collector(&mut quiet));

    // Every slot holds a client that sent records: the one idle longest goes, and what it sent
    // stays in the run file.
    let mut second = UnixStream::connect(&sock).unwrap();
    send_records(&mut second, &batch(23));
    assert!(
        wait_until(Duration::from_secs(10), || collector.stats().records == 12),
        "{:?}",
        collector.stats()
    );
    assert!(wait_closed(&mut quiet));
    assert!(!closed_by_collector(&mut first));
    assert!(!closed_by_collector(&mut second));

    let summary = collector.shutdown();
    let st = &summary.stats;
    assert_eq!((st.evicted_clients, st.refused_clients, st.bad_clients, st.clients), (2, 0, 0, 4), "{st:?}");
    let records = decode_all(&read_run_file(&out).unwrap().payloads);
    for id in [21, 22, 23] {
        assert_eq!(records.iter().filter(|r| r.session_id() == id).count(), 4, "session {id}");
    }
}

/// What eviction costs a real shim client: nothing. Its next write finds the connection closed
/// before writing, so it keeps that batch, reconnects at once, resends its session record and
/// then the batch; every record arrives.
#[test]
fn an_evicted_shim_client_reconnects_and_resends_its_session() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run.qsr");
    let sock = dir.path().join("c.sock");
    let options =
        CollectOptions { max_clients: 1, evict_idle_after: Duration::ZERO, ..CollectOptions::default() };
    let collector = Collector::start_with(&Address::Unix(sock.clone()), &out, options).unwrap();
    let client = Client::start(collector.local_address().clone(), client_options(41));
    for seq in 0..5 {
        assert!(client.send(enc(&observation(41, 0, seq, false))));
    }
    assert!(
        wait_until(Duration::from_secs(10), || collector.stats().records == 6),
        "{:?}",
        collector.stats()
    );

    // A newcomer takes the only slot; the shim's connection is read to its end and closed.
    let mut newcomer = UnixStream::connect(&sock).unwrap();
    send_records(&mut newcomer, &[session(42)]);
    assert!(wait_until(Duration::from_secs(10), || {
        let st = collector.stats();
        st.records == 7 && st.active_clients == 1
    }));
    assert_eq!(collector.stats().evicted_clients, 1);

    // The shim goes on: its reconnection takes the slot back from the (now idle) newcomer.
    for seq in 5..25 {
        assert!(client.send(enc(&observation(41, 0, seq, false))));
    }
    let cs = client.close(|dropped| enc(&closing(41, dropped)), Duration::from_secs(10));
    assert_eq!(cs.reconnects, 1, "{cs:?}");
    assert_eq!((cs.sent, cs.dropped), (26, 0), "the write that found the close is kept: {cs:?}");
    let expected = 7 + 1 + 20 + 1;
    assert!(
        wait_until(Duration::from_secs(10), || collector.stats().records == expected),
        "{:?}",
        collector.stats()
    );
    let summary = collector.shutdown();
    assert_eq!(summary.stats.evicted_clients, 2);
    let records = decode_all(&read_run_file(&out).unwrap().payloads);
    let mine: Vec<&Record> = records.iter().filter(|r| r.session_id() == 41).collect();
    assert_eq!(mine.iter().filter(|r| matches!(r, Record::Session(_))).count(), 2, "session resent");
    assert!(matches!(mine.last().unwrap(), Record::Closing(c) if c.dropped == 0));
    let seqs: Vec<u64> = mine
        .iter()
        .filter_map(|r| match r {
            Record::Observation(o) => Some(o.call_seq),
            _ => None,
        })
        .collect();
    assert_eq!(seqs, (0..25).collect::<Vec<_>>(), "every observation once, in order");
    assert_eq!(records.iter().filter(|r| r.session_id() == 42).count(), 1, "the newcomer's record is kept");
}

#[test]
fn clients_idle_for_less_than_the_minimum_are_not_evicted() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run.qsr");
    let sock = dir.path().join("c.sock");
    // As long as a real shim may stay quiet between bursts in this test: never reached.
    let options = CollectOptions {
        max_clients: 2,
        evict_idle_after: Duration::from_secs(3600),
        ..CollectOptions::default()
    };
    let collector = Collector::start_with(&Address::Unix(sock.clone()), &out, options).unwrap();
    let mut quiet = UnixStream::connect(&sock).unwrap();
    send_records(&mut quiet, &[session(31)]);
    let mut silent = UnixStream::connect(&sock).unwrap();
    assert!(wait_until(Duration::from_secs(10), || {
        let st = collector.stats();
        st.records == 1 && st.active_clients == 2
    }));

    // The newcomer is refused: neither connection has been idle long enough.
    let mut extra = UnixStream::connect(&sock).unwrap();
    assert!(wait_closed(&mut extra), "the extra connection must be closed");
    let st = collector.stats();
    assert_eq!((st.refused_clients, st.evicted_clients), (1, 0), "{st:?}");
    assert!(!closed_by_collector(&mut quiet));
    assert!(!closed_by_collector(&mut silent));

    // After its quiet spell the client is still served.
    send_records(&mut quiet, &[observation(31, 0, 0, false), closing(31, 0)]);
    assert!(
        wait_until(Duration::from_secs(10), || collector.stats().records == 3),
        "{:?}",
        collector.stats()
    );
    let summary = collector.shutdown();
    assert_eq!((summary.stats.refused_clients, summary.stats.evicted_clients), (1, 0));
    assert_eq!(decode_all(&read_run_file(&out).unwrap().payloads).len(), 3);
}

#[test]
fn restart_on_an_existing_file_appends_after_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run.qsr");
    let listen = Address::Unix(dir.path().join("c.sock"));
    let c = Collector::start(&listen, &out).unwrap();
    let addr = c.local_address().clone();
    run_session(&addr, 1, 50, 2, None);
    assert!(wait_until(Duration::from_secs(10), || c.stats().records == 52));
    c.shutdown();
    let before = read_run_file(&out).unwrap().payloads;
    // Half a frame, as a crash in the middle of a write leaves it.
    let mut f = std::fs::OpenOptions::new().append(true).open(&out).unwrap();
    f.write_all(&[200, 0, 0, 0, 1, 2, 3, 4, 5, 6]).unwrap();
    drop(f);

    let c = Collector::start(&listen, &out).unwrap();
    assert_eq!(c.recovery().records_intact, 52);
    assert_eq!(c.recovery().bytes_truncated, 10);
    assert!(c.recovery().torn_tail.is_some());
    run_session(&addr, 2, 10, 2, None);
    assert!(wait_until(Duration::from_secs(10), || c.stats().records == 12));
    c.shutdown();
    let after = read_run_file(&out).unwrap();
    assert_eq!(after.torn_tail, None);
    assert_eq!(after.payloads.len(), 64);
    assert_eq!(after.payloads[..52], before[..]);
    decode_all(&after.payloads);
}

#[test]
fn a_run_file_cut_mid_frame_reads_up_to_the_cut() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run.qsr");
    let c = Collector::start(&Address::Unix(dir.path().join("c.sock")), &out).unwrap();
    let addr = c.local_address().clone();
    run_session(&addr, 3, 20, 4, None);
    assert!(wait_until(Duration::from_secs(10), || c.stats().records == 22));
    c.shutdown();
    let full = read_run_file(&out).unwrap().payloads;
    let len = std::fs::metadata(&out).unwrap().len();
    let last = full.last().unwrap().len() as u64;
    // Cut in the middle of the last payload.
    std::fs::OpenOptions::new().write(true).open(&out).unwrap().set_len(len - last / 2).unwrap();
    let cut = read_run_file(&out).unwrap();
    assert_eq!(cut.payloads[..], full[..21]);
    let torn = cut.torn_tail.expect("torn tail");
    assert_eq!(torn.offset, len - last - FRAME_HEADER_LEN as u64);
    let records = decode_all(&cut.payloads);
    assert!(matches!(records[0], Record::Session(_)));
}

// ---------------------------------------------------------------------------------------------
// The binary

struct Collect {
    child: Child,
}

impl Collect {
    fn spawn(sock: &Path, out: &Path) -> Collect {
        let child = Command::new(env!("CARGO_BIN_EXE_quantshadow"))
            .args(["collect", "--listen"])
            .arg(format!("unix:{}", sock.display()))
            .arg("--out")
            .arg(out)
            .env("QUANTSHADOW_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let c = Collect { child };
        assert!(
            wait_until(Duration::from_secs(10), || UnixStream::connect(sock).is_ok()),
            "collector did not start listening"
        );
        c
    }

    fn stderr(&mut self) -> String {
        let mut s = String::new();
        self.child.stderr.take().unwrap().read_to_string(&mut s).unwrap();
        s
    }
}

impl Drop for Collect {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn binary_killed_mid_stream_then_restarted_on_the_same_file() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("c.sock");
    let out = dir.path().join("run.qsr");
    let addr = Address::Unix(sock.clone());

    let mut first = Collect::spawn(&sock, &out);
    let client = Client::start(addr.clone(), client_options(1));
    let mut seq = 0u64;
    // Stream until records are on disk, then SIGKILL while the stream goes on.
    let flowing = wait_until(Duration::from_secs(10), || {
        for _ in 0..200 {
            client.send(enc(&observation(1, seq % 7, seq, false)));
            seq += 1;
        }
        read_run_file(&out).is_ok_and(|c| c.payloads.len() > 1000)
    });
    assert!(flowing, "records did not reach the run file");
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    for _ in 0..200 {
        client.send(enc(&observation(1, seq % 7, seq, false)));
        seq += 1;
    }
    let killed = read_run_file(&out).unwrap();
    // Whatever was on disk is whole records in order; any damage is confined to the tail.
    let records = decode_all(&killed.payloads);
    assert!(matches!(records[0], Record::Session(_)));
    let seqs: Vec<u64> = records[1..]
        .iter()
        .map(|r| match r {
            Record::Observation(o) => o.call_seq,
            other => panic!("unexpected record {other:?}"),
        })
        .collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "records out of order");
    // Make sure the restart meets a torn tail even if the kill landed between writes.
    std::fs::OpenOptions::new().append(true).open(&out).unwrap().write_all(&[64, 0, 0, 0, 9, 9]).unwrap();

    let mut second = Collect::spawn(&sock, &out);
    // The client reconnects on its own and opens the new connection with its preamble.
    let delivered = wait_until(Duration::from_secs(10), || {
        client.send(enc(&observation(1, seq % 7, seq, false)));
        seq += 1;
        read_run_file(&out).is_ok_and(|c| c.payloads.len() > killed.payloads.len() + 1)
    });
    assert!(delivered, "no records after the restart");
    let s = client.close(|d| enc(&closing(1, d)), Duration::from_secs(5));
    assert!(s.reconnects >= 1, "{s:?}");
    // SIGTERM: clean shutdown, everything flushed, exit 0.
    // SAFETY: signalling a child we spawned and have not reaped.
    assert_eq!(unsafe { libc::kill(second.child.id() as i32, libc::SIGTERM) }, 0);
    let status = second.child.wait().unwrap();
    assert!(status.success(), "collect exited with {status:?}");
    let log = second.stderr();
    assert!(log.contains("torn tail"), "restart must report the torn tail:\n{log}");

    let after = read_run_file(&out).unwrap();
    assert_eq!(after.torn_tail, None);
    assert_eq!(after.payloads[..killed.payloads.len()], killed.payloads[..], "earlier records changed");
    let records = decode_all(&after.payloads);
    let tail = &records[killed.payloads.len()..];
    assert!(matches!(tail[0], Record::Session(_)), "new connection must start with the preamble");
    assert!(matches!(tail.last().unwrap(), Record::Closing(_)));
    assert!(!sock.exists(), "clean shutdown removes the socket");
}

// ---------------------------------------------------------------------------------------------
// Throughput (informal; run with `cargo test --release --test collector -- --ignored --nocapture`)

/// 8 clients over a unix socket, producers retrying when their queue is full so that the
/// collector, not the producers, sets the pace. Prints records/s; asserts nothing about speed
/// (machines differ), only that every record arrived.
fn measure(validate: bool, payload: Vec<u8>, per_client: u64) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run.qsr");
    let options = CollectOptions { validate, ..CollectOptions::default() };
    let collector = Collector::start_with(&Address::Unix(dir.path().join("c.sock")), &out, options).unwrap();
    let addr = collector.local_address().clone();
    let t = Instant::now();
    let handles: Vec<_> = (0..8u64)
        .map(|id| {
            let (addr, payload) = (addr.clone(), payload.clone());
            thread::spawn(move || {
                let client = Client::start(addr, client_options(id));
                for _ in 0..per_client {
                    // A full queue means the collector is behind: wait a little instead of
                    // spinning, which would steal the CPU the collector needs.
                    while !client.send(payload.clone()) {
                        thread::sleep(Duration::from_micros(100));
                    }
                }
                client.close(|d| enc(&closing(id, d)), Duration::from_secs(30))
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let total = 8 * (per_client + 2);
    assert!(
        wait_until(Duration::from_secs(60), || collector.stats().records == total),
        "{:?}",
        collector.stats()
    );
    let secs = t.elapsed().as_secs_f64();
    let summary = collector.shutdown();
    println!(
        "validate={validate} payload={}B: {} records in {secs:.2} s = {:.0} records/s ({:.0} MB/s)",
        payload.len(),
        summary.stats.records,
        summary.stats.records as f64 / secs,
        summary.stats.bytes as f64 / secs / 1e6
    );
}

#[test]
#[ignore = "benchmark"]
fn throughput_8_clients_unix_socket() {
    measure(false, vec![0x5a; 300], 250_000);
    measure(true, enc(&observation(1, 3, 12345, false)), 100_000);
}

/// A full collector refuses a shim client by accepting and closing at once. The client sees
/// each refusal before writing any record (it writes only its session record until the
/// collector reads it), backs off, and delivers everything once a slot frees up.
#[test]
fn a_shim_client_refused_by_a_full_collector_backs_off_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run.qsr");
    let sock = dir.path().join("c.sock");
    // Nobody is ever idle long enough to be evicted: a newcomer is refused while the slot is taken.
    let options = CollectOptions {
        max_clients: 1,
        evict_idle_after: Duration::from_secs(3600),
        ..CollectOptions::default()
    };
    let collector = Collector::start_with(&Address::Unix(sock.clone()), &out, options).unwrap();
    let mut holder = UnixStream::connect(&sock).unwrap();
    send_records(&mut holder, &[session(51)]);
    assert!(wait_until(Duration::from_secs(10), || collector.stats().records == 1));

    let client = Client::start(collector.local_address().clone(), client_options(52));
    for seq in 0..30 {
        assert!(client.send(enc(&observation(52, seq % 3, seq, false))));
    }
    assert!(
        wait_until(Duration::from_secs(10), || client.stats().refused >= 3),
        "{:?} {:?}",
        client.stats(),
        collector.stats()
    );
    let st = client.stats();
    assert_eq!((st.sent, st.dropped, st.queued), (0, 0, 30), "{st:?}");
    assert!(st.retry_delay >= Duration::from_millis(20), "the backoff grows per refusal: {st:?}");
    assert!(collector.stats().refused_clients >= 3);

    // The slot frees up: the client's next attempt is served.
    drop(holder);
    assert!(
        wait_until(Duration::from_secs(10), || collector.stats().records == 1 + 1 + 30),
        "{:?} {:?}",
        client.stats(),
        collector.stats()
    );
    let cs = client.close(|dropped| enc(&closing(52, dropped)), Duration::from_secs(10));
    assert_eq!((cs.sent, cs.dropped, cs.reconnects), (31, 0, 0), "{cs:?}");
    assert!(
        wait_until(Duration::from_secs(10), || collector.stats().records == 1 + 1 + 30 + 1),
        "{:?}",
        collector.stats()
    );
    let summary = collector.shutdown();
    assert_eq!(summary.stats.evicted_clients, 0);
    let records = decode_all(&read_run_file(&out).unwrap().payloads);
    let mine: Vec<&Record> = records.iter().filter(|r| r.session_id() == 52).collect();
    assert_eq!(mine.len(), 32, "session, 30 observations, closing");
    assert!(matches!(mine[0], Record::Session(_)), "one connection, opened by the session record");
    assert!(matches!(mine[31], Record::Closing(c) if c.dropped == 0));
}
