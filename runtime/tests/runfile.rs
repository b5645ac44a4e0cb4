//! Run file: round trips, every kind of torn tail, recovery and append after recovery.

use quantshadow_runtime::runfile::{
    read_run_file, FlushPolicy, FrameBatch, RunFileError, RunReader, RunWriter, FORMAT_VERSION,
    FRAME_HEADER_LEN, HEADER_LEN, MAGIC, MAX_PAYLOAD_BYTES,
};
use std::path::Path;
use std::time::Duration;

/// Distinct, varied payloads: lengths 1..=`max_len`, contents tied to the index.
fn payload(i: usize, max_len: usize) -> Vec<u8> {
    let len = 1 + (i * 37 + 11) % max_len;
    (0..len).map(|j| (i * 131 + j * 7) as u8).collect()
}

fn write_run(path: &Path, payloads: &[Vec<u8>]) {
    let (mut w, rec) = RunWriter::open_append(path).unwrap();
    assert_eq!(rec.records_intact, 0);
    for p in payloads {
        w.append(p).unwrap();
    }
    w.finish().unwrap();
}

/// Offsets where each frame starts, plus the file end.
fn frame_starts(payloads: &[Vec<u8>]) -> Vec<u64> {
    let mut out = vec![HEADER_LEN];
    for p in payloads {
        out.push(out.last().unwrap() + (FRAME_HEADER_LEN + p.len()) as u64);
    }
    out
}

#[test]
fn round_trip_single_and_batched_appends() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.qsr");
    let payloads: Vec<Vec<u8>> = (0..500).map(|i| payload(i, 400)).collect();
    let (mut w, _) = RunWriter::open_append(&path).unwrap();
    let mut batch = FrameBatch::new();
    for (i, p) in payloads.iter().enumerate() {
        if i % 3 == 0 {
            w.append(p).unwrap();
        } else {
            // Batches must keep file order with the single appends around them.
            batch.push(p).unwrap();
            if i % 3 == 2 {
                w.append_batch(&batch).unwrap();
                batch.clear();
            }
        }
    }
    w.append_batch(&batch).unwrap();
    assert_eq!(w.records(), 500);
    w.finish().unwrap();

    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(&bytes[..8], &MAGIC);
    assert_eq!(u32::from_le_bytes(bytes[8..12].try_into().unwrap()), FORMAT_VERSION);
    assert_eq!(bytes.len() as u64, *frame_starts(&payloads).last().unwrap());

    let contents = read_run_file(&path).unwrap();
    assert_eq!(contents.payloads, payloads);
    assert_eq!(contents.torn_tail, None);

    // The streaming reader yields the same, reusing one buffer.
    let mut r = RunReader::open(&path).unwrap();
    let mut buf = Vec::new();
    let mut i = 0;
    while r.read_into(&mut buf).unwrap() {
        assert_eq!(buf, payloads[i]);
        i += 1;
    }
    assert_eq!(i, 500);
    assert_eq!(r.records(), 500);
    assert_eq!(r.offset(), bytes.len() as u64);
    assert!(r.torn_tail().is_none());
}

#[test]
fn reopen_appends_after_existing_records() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.qsr");
    let first: Vec<Vec<u8>> = (0..3).map(|i| payload(i, 50)).collect();
    write_run(&path, &first);
    let (mut w, rec) = RunWriter::open_append(&path).unwrap();
    assert_eq!(rec.records_intact, 3);
    assert_eq!(rec.torn_tail, None);
    assert_eq!(rec.bytes_truncated, 0);
    assert_eq!(w.records(), 3);
    w.append(b"fourth").unwrap();
    drop(w); // Drop flushes.
    let c = read_run_file(&path).unwrap();
    assert_eq!(c.payloads.len(), 4);
    assert_eq!(c.payloads[..3], first[..]);
    assert_eq!(c.payloads[3], b"fourth");
}

#[test]
fn truncation_at_every_offset_of_the_last_frames() {
    let dir = tempfile::tempdir().unwrap();
    let full_path = dir.path().join("full.qsr");
    // Small last frames keep the number of cuts modest while covering every byte of them.
    let payloads: Vec<Vec<u8>> = (0..6).map(|i| payload(i, if i < 3 { 200 } else { 40 })).collect();
    write_run(&full_path, &payloads);
    let full = std::fs::read(&full_path).unwrap();
    let starts = frame_starts(&payloads);
    let cut_from = starts[3] as usize;
    let path = dir.path().join("cut.qsr");
    for cut in cut_from..full.len() {
        std::fs::write(&path, &full[..cut]).unwrap();
        // Frames that end at or before the cut are intact.
        let intact = starts[1..].iter().take_while(|&&end| end as usize <= cut).count();
        let boundary = starts[intact];
        let c = read_run_file(&path).unwrap();
        assert_eq!(c.payloads[..], payloads[..intact], "cut at {cut}");
        match &c.torn_tail {
            None => assert_eq!(boundary as usize, cut, "cut at {cut}: torn tail not reported"),
            Some(t) => {
                assert_eq!(t.offset, boundary, "cut at {cut}");
                let in_header = cut - (boundary as usize) < FRAME_HEADER_LEN;
                let expected = if in_header { "incomplete frame header" } else { "runs past the end" };
                assert!(t.reason.contains(expected), "cut at {cut}: {}", t.reason);
            }
        }
        // Recovery cuts the tail and appends right after the last good frame.
        let (mut w, rec) = RunWriter::open_append(&path).unwrap();
        assert_eq!(rec.records_intact, intact as u64, "cut at {cut}");
        assert_eq!(rec.torn_tail, c.torn_tail, "cut at {cut}");
        assert_eq!(rec.bytes_truncated, cut as u64 - boundary, "cut at {cut}");
        w.append(b"after recovery").unwrap();
        w.finish().unwrap();
        let c = read_run_file(&path).unwrap();
        assert_eq!(c.torn_tail, None, "cut at {cut}");
        assert_eq!(c.payloads.len(), intact + 1, "cut at {cut}");
        assert_eq!(c.payloads[..intact], payloads[..intact]);
        assert_eq!(c.payloads[intact], b"after recovery");
    }
}

/// A file with one byte changed at `at`.
fn corrupt(path: &Path, at: u64, xor: u8) {
    let mut b = std::fs::read(path).unwrap();
    b[at as usize] ^= xor;
    std::fs::write(path, b).unwrap();
}

#[test]
fn damage_in_the_middle_loses_only_the_damaged_frame() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.qsr");
    let payloads: Vec<Vec<u8>> = (0..5).map(|i| payload(i, 100)).collect();
    let starts = frame_starts(&payloads);
    // A flipped payload byte, a flipped CRC byte, an absurd length, and a length still under
    // the maximum that runs past the end of the file: each damages frame 2 only; frames 3 and 4
    // are good and must be kept by readers and by recovery.
    for (at, xor) in [
        (starts[2] + FRAME_HEADER_LEN as u64 + 1, 0x40),
        (starts[2] + 5, 0x40),
        (starts[2] + 3, 0x40),
        (starts[2] + 1, 0x40),
    ] {
        write_run(&path, &payloads);
        corrupt(&path, at, xor);
        let c = read_run_file(&path).unwrap();
        let mut expect = payloads[..2].to_vec();
        expect.extend_from_slice(&payloads[3..]);
        assert_eq!(c.payloads, expect, "damage at {at}");
        assert!(c.torn_tail.is_none());
        assert_eq!(c.damaged.len(), 1);
        assert_eq!(c.damaged[0].offset, starts[2]);
        assert!(
            c.damaged[0].reason.contains(&format!("{} bytes skipped", starts[3] - starts[2])),
            "{}",
            c.damaged[0].reason
        );
        // Recovery keeps everything (the damaged bytes stay; readers skip them) and appends.
        let len_before = std::fs::metadata(&path).unwrap().len();
        let (mut w, rec) = RunWriter::open_append(&path).unwrap();
        assert_eq!(rec.records_intact, 4);
        assert_eq!(rec.bytes_truncated, 0);
        assert_eq!(rec.damaged.len(), 1);
        w.append(b"after recovery").unwrap();
        w.flush().unwrap();
        drop(w);
        assert!(std::fs::metadata(&path).unwrap().len() > len_before);
        let again = read_run_file(&path).unwrap();
        assert_eq!(again.payloads.len(), 5);
        assert_eq!(again.payloads[4], b"after recovery");
        std::fs::remove_file(&path).unwrap();
    }
}

#[test]
fn damage_in_the_last_frame_is_a_torn_tail_and_is_cut() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.qsr");
    let payloads: Vec<Vec<u8>> = (0..5).map(|i| payload(i, 100)).collect();
    let starts = frame_starts(&payloads);
    write_run(&path, &payloads);
    corrupt(&path, starts[4] + FRAME_HEADER_LEN as u64 + 1, 0x40);
    let c = read_run_file(&path).unwrap();
    assert_eq!(c.payloads[..], payloads[..4]);
    let t = c.torn_tail.expect("torn tail");
    assert_eq!(t.offset, starts[4]);
    assert!(t.reason.contains("CRC mismatch"), "{}", t.reason);
    let (w, rec) = RunWriter::open_append(&path).unwrap();
    assert_eq!(rec.records_intact, 4);
    assert_eq!(rec.bytes_truncated, starts[5] - starts[4]);
    drop(w);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), starts[4]);
}

#[test]
fn absurd_length_is_a_torn_tail_not_an_allocation() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.qsr");
    let payloads: Vec<Vec<u8>> = (0..3).map(|i| payload(i, 100)).collect();
    write_run(&path, &payloads);
    let starts = frame_starts(&payloads);
    let mut b = std::fs::read(&path).unwrap();
    b[starts[2] as usize..starts[2] as usize + 4].copy_from_slice(&(MAX_PAYLOAD_BYTES + 1).to_le_bytes());
    std::fs::write(&path, &b).unwrap();
    let c = read_run_file(&path).unwrap();
    assert_eq!(c.payloads[..], payloads[..2]);
    let t = c.torn_tail.unwrap();
    assert_eq!(t.offset, starts[2]);
    assert!(t.reason.contains("exceeds the maximum"), "{}", t.reason);
}

#[test]
fn zero_filled_tail_is_torn() {
    // What a file system may leave after a crash: the size grew, the data never landed.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.qsr");
    let payloads: Vec<Vec<u8>> = (0..2).map(|i| payload(i, 100)).collect();
    write_run(&path, &payloads);
    let mut b = std::fs::read(&path).unwrap();
    let good = b.len() as u64;
    b.extend_from_slice(&[0u8; 4096]);
    std::fs::write(&path, &b).unwrap();
    let c = read_run_file(&path).unwrap();
    assert_eq!(c.payloads, payloads);
    let t = c.torn_tail.unwrap();
    assert_eq!(t.offset, good);
    assert!(t.reason.contains("zero-length"), "{}", t.reason);
}

#[test]
fn wrong_magic_and_short_files_are_not_run_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.qsr");
    std::fs::write(&path, b"PK\x03\x04 definitely a zip file, not a run").unwrap();
    assert!(matches!(read_run_file(&path), Err(RunFileError::NotARunFile { .. })));
    // The writer refuses it too, and leaves it alone.
    assert!(matches!(RunWriter::open_append(&path), Err(RunFileError::NotARunFile { .. })));
    assert_eq!(std::fs::read(&path).unwrap(), b"PK\x03\x04 definitely a zip file, not a run");

    for len in [0usize, 1, 7, 11] {
        let mut h = MAGIC.to_vec();
        h.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        std::fs::write(&path, &h[..len]).unwrap();
        let err = read_run_file(&path).err().expect("short file must not read");
        assert!(matches!(err, RunFileError::NotARunFile { .. }), "{len} bytes: {err}");
    }
    // A short foreign file is not clobbered by the writer either.
    std::fs::write(&path, b"hello").unwrap();
    assert!(matches!(RunWriter::open_append(&path), Err(RunFileError::NotARunFile { .. })));
    assert_eq!(std::fs::read(&path).unwrap(), b"hello");
}

#[test]
fn header_cut_short_by_a_crash_is_rewritten() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.qsr");
    std::fs::write(&path, &MAGIC[..5]).unwrap();
    let (mut w, rec) = RunWriter::open_append(&path).unwrap();
    assert_eq!(rec.records_intact, 0);
    assert_eq!(rec.bytes_truncated, 5);
    assert!(rec.torn_tail.unwrap().reason.contains("incomplete file header"));
    w.append(b"x").unwrap();
    w.finish().unwrap();
    assert_eq!(read_run_file(&path).unwrap().payloads, vec![b"x".to_vec()]);

    // An existing empty file is simply initialised.
    let empty = dir.path().join("empty.qsr");
    std::fs::write(&empty, b"").unwrap();
    let (w, rec) = RunWriter::open_append(&empty).unwrap();
    assert_eq!(rec, Default::default());
    drop(w);
    assert_eq!(std::fs::metadata(&empty).unwrap().len(), HEADER_LEN);
}

#[test]
fn future_version_is_refused_naming_both_versions() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.qsr");
    write_run(&path, &[b"a".to_vec()]);
    let mut b = std::fs::read(&path).unwrap();
    b[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
    std::fs::write(&path, &b).unwrap();
    let err = read_run_file(&path).err().unwrap();
    match &err {
        RunFileError::UnsupportedVersion { found, supported, .. } => {
            assert_eq!((*found, *supported), (FORMAT_VERSION + 1, FORMAT_VERSION));
        }
        other => panic!("expected UnsupportedVersion, got {other}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("{}", FORMAT_VERSION + 1)) && msg.contains(&format!("{FORMAT_VERSION}")),
        "{msg}"
    );
    // Never appended to: an old writer would corrupt a newer format.
    assert!(matches!(RunWriter::open_append(&path), Err(RunFileError::UnsupportedVersion { .. })));
    assert_eq!(std::fs::read(&path).unwrap(), b);
}

#[test]
fn payload_sizes_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let (mut w, _) = RunWriter::open_append(&dir.path().join("run.qsr")).unwrap();
    assert!(matches!(w.append(b""), Err(RunFileError::BadPayloadSize { len: 0, .. })));
    let huge = vec![0u8; MAX_PAYLOAD_BYTES as usize + 1];
    assert!(matches!(w.append(&huge), Err(RunFileError::BadPayloadSize { .. })));
    assert!(FrameBatch::new().push(b"").is_err());
    assert_eq!(w.records(), 0);
}

#[test]
fn a_second_writer_is_refused_while_the_first_is_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.qsr");
    let (w, _) = RunWriter::open_append(&path).unwrap();
    assert!(matches!(RunWriter::open_append(&path), Err(RunFileError::Locked { .. })));
    // Readers are not blocked by the writer.
    assert!(read_run_file(&path).is_ok());
    drop(w);
    assert!(RunWriter::open_append(&path).is_ok());
}

#[test]
fn flush_policy_bounds_what_a_kill_loses() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.qsr");
    let policy = FlushPolicy { max_bytes: 1 << 20, max_records: 10, max_delay: Duration::from_millis(20) };
    let (mut w, _) = RunWriter::open_append_with(&path, policy).unwrap();
    for i in 0..25 {
        w.append(&payload(i, 30)).unwrap();
    }
    // Written in groups of 10; the last 5 wait in the buffer.
    assert_eq!(read_run_file(&path).unwrap().payloads.len(), 20);
    std::thread::sleep(Duration::from_millis(30));
    assert!(w.flush_if_due().unwrap(), "a record older than max_delay must be flushed");
    assert_eq!(read_run_file(&path).unwrap().payloads.len(), 25);
    assert!(!w.flush_if_due().unwrap());

    // kill -9 with records buffered: simulated by never running the writer's Drop. What was
    // written is intact and the file ends cleanly.
    for i in 25..28 {
        w.append(&payload(i, 30)).unwrap();
    }
    std::mem::forget(w);
    let c = read_run_file(&path).unwrap();
    assert_eq!(c.payloads.len(), 25);
    assert_eq!(c.torn_tail, None);
}

#[test]
fn streaming_reader_handles_many_records() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.qsr");
    let (mut w, _) = RunWriter::open_append(&path).unwrap();
    let mut batch = FrameBatch::with_capacity(1 << 20);
    for i in 0..50_000usize {
        batch.push(&(i as u64).to_le_bytes()).unwrap();
    }
    w.append_batch(&batch).unwrap();
    w.finish().unwrap();
    let mut r = RunReader::open(&path).unwrap();
    let mut buf = Vec::new();
    let mut n = 0u64;
    while r.read_into(&mut buf).unwrap() {
        assert_eq!(u64::from_le_bytes(buf[..].try_into().unwrap()), n);
        n += 1;
    }
    assert_eq!(n, 50_000);
}
