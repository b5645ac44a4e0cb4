//! Run file: finding the good frames after large damaged regions, at a cost proportional to
//! the bytes looked at (a direct search costs a payload hash per plausible length: quadratic).

use quantshadow_runtime::runfile::{
    read_run_file, ResyncStats, RunReader, RunWriter, FORMAT_VERSION, FRAME_HEADER_LEN, MAGIC,
    MAX_PAYLOAD_BYTES,
};
use std::path::Path;

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

/// A run file assembled piece by piece, remembering where each piece starts.
struct Builder {
    bytes: Vec<u8>,
    payloads: Vec<Vec<u8>>,
}

impl Builder {
    fn new() -> Builder {
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        Builder { bytes, payloads: Vec::new() }
    }

    fn frame(&mut self, payload: Vec<u8>) {
        self.bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        self.bytes.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
        self.bytes.extend_from_slice(&payload);
        self.payloads.push(payload);
    }

    /// `n` varied small frames tagged with `tag`.
    fn frames(&mut self, tag: u8, n: usize) {
        for i in 0..n {
            let len = 1 + (i * 37 + 11) % 300;
            self.frame((0..len).map(|j| tag ^ (i * 131 + j * 7) as u8).collect());
        }
    }

    /// Appends garbage; returns its offset.
    fn garbage(&mut self, bytes: &[u8]) -> u64 {
        let at = self.bytes.len() as u64;
        self.bytes.extend_from_slice(bytes);
        at
    }

    fn write(&self, path: &Path) {
        std::fs::write(path, &self.bytes).unwrap();
    }
}

/// Garbage in which every position holds a plausible length: 1, 2^24, 2^16 and 2^8 in turn.
fn plausible_lengths_everywhere(len: usize) -> Vec<u8> {
    [1u8, 0, 0, 0].repeat(len / 4)
}

/// The plausible lengths a search from the damaged frame at `offset` meets before the good
/// frame at `found`, and that frame's: (position in the window, length, fits in the file).
fn lengths_met(file: &[u8], offset: u64, found: u64) -> Vec<(usize, usize, bool)> {
    let window = &file[offset as usize + 1..];
    (0..=(found - offset - 1) as usize)
        .filter_map(|p| {
            let len = u32::from_le_bytes(window[p..p + 4].try_into().unwrap()) as usize;
            let fits = p + FRAME_HEADER_LEN + len <= window.len();
            (1..=MAX_PAYLOAD_BYTES as usize).contains(&len).then_some((p, len, fits))
        })
        .collect()
}

/// What the direct search hashes for that: every plausible length that fits.
fn direct_search_cost(file: &[u8], offset: u64, found: u64) -> u64 {
    let met = lengths_met(file, offset, found);
    met[..met.len() - 1].iter().filter(|m| m.2).map(|m| m.1 as u64).sum()
}

/// How far into the file that search must look: up to the end of the furthest payload it
/// checks, or to the end of the file to learn that one does not fit.
fn must_examine(file: &[u8], offset: u64, found: u64) -> u64 {
    let rest = file.len() - offset as usize - 1;
    let reach = lengths_met(file, offset, found).iter().map(|m| m.0 + FRAME_HEADER_LEN + m.1).max();
    reach.unwrap_or(0).min(rest) as u64
}

/// Reads the file with the streaming reader: payloads and the search work.
fn read_with_stats(path: &Path) -> (Vec<Vec<u8>>, ResyncStats) {
    let mut r = RunReader::open(path).unwrap();
    let mut out = Vec::new();
    let mut buf = Vec::new();
    while r.read_into(&mut buf).unwrap() {
        out.push(buf.clone());
    }
    assert!(r.torn_tail().is_none(), "{:?}", r.torn_tail());
    (out, r.resync_stats())
}

#[test]
fn a_large_random_garbage_region_is_skipped_with_work_linear_in_its_size() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.qsr");
    let mut b = Builder::new();
    b.frames(0x11, 20);
    let garbage = noise(42, 4 << 20);
    let at = b.garbage(&garbage);
    b.frames(0x22, 30);
    b.write(&path);

    let c = read_run_file(&path).unwrap();
    assert_eq!(c.payloads, b.payloads, "every good frame, in order");
    assert_eq!(c.torn_tail, None);
    assert_eq!(c.damaged.len(), 1, "{:?}", c.damaged);
    assert_eq!(c.damaged[0].offset, at);
    assert!(
        c.damaged[0].reason.contains(&format!("{} bytes skipped", garbage.len())),
        "{}",
        c.damaged[0].reason
    );

    let (payloads, st) = read_with_stats(&path);
    assert_eq!(payloads, b.payloads);
    assert_eq!(st.searches, 1);
    let found = at + garbage.len() as u64;
    assert_eq!(st.bytes_examined, must_examine(&b.bytes, at, found), "{st:?}");
    assert!(st.bytes_hashed <= 2 * st.bytes_examined, "{st:?}");
    // The input is the expensive kind: the direct search hashes gigabytes here.
    let direct = direct_search_cost(&b.bytes, at, found);
    assert!(direct > 100 * st.bytes_hashed, "direct search {direct} bytes, {st:?}");

    // Recovery keeps everything and appends after it.
    let (mut w, rec) = RunWriter::open_append(&path).unwrap();
    assert_eq!(rec.records_intact, 50);
    assert_eq!((rec.bytes_truncated, rec.damaged.len()), (0, 1));
    w.append(b"after recovery").unwrap();
    w.finish().unwrap();
    let again = read_run_file(&path).unwrap();
    assert_eq!(again.payloads.len(), 51);
    assert_eq!(again.payloads[50], b"after recovery");
}

/// Damage full of plausible lengths, then the largest legitimate frame, small frames, a second
/// damaged region right after a good frame, and more frames: all good frames are kept.
#[test]
fn plausible_lengths_everywhere_and_the_largest_frame_after_damage() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.qsr");
    let mut b = Builder::new();
    b.frames(0x33, 10);
    let crafted = plausible_lengths_everywhere(1 << 20);
    let first = b.garbage(&crafted);
    b.frame(noise(7, MAX_PAYLOAD_BYTES as usize));
    b.frames(0x44, 10);
    // A good frame followed by garbage: found by the search like any other.
    let random = noise(8, 64 << 10);
    let second = b.garbage(&random);
    b.frames(0x55, 10);
    b.write(&path);

    let c = read_run_file(&path).unwrap();
    assert_eq!(c.payloads.len(), b.payloads.len());
    assert!(c.payloads == b.payloads, "every good frame, in order");
    assert_eq!(c.torn_tail, None);
    let regions: Vec<(u64, &str)> = c.damaged.iter().map(|d| (d.offset, d.reason.as_str())).collect();
    assert_eq!(regions.len(), 2, "{regions:?}");
    assert_eq!(regions[0].0, first);
    assert!(regions[0].1.contains(&format!("{} bytes skipped", crafted.len())), "{}", regions[0].1);
    assert_eq!(regions[1].0, second);
    assert!(regions[1].1.contains(&format!("{} bytes skipped", random.len())), "{}", regions[1].1);

    let (_, st) = read_with_stats(&path);
    assert_eq!(st.searches, 2);
    // Three of every four crafted positions are checked (2^24 fits: the large frame follows).
    assert!(st.candidates >= 3 * crafted.len() as u64 / 4, "{st:?}");
    // One pass over what was looked at (the large frame included) plus a few bytes a candidate.
    let found = [first + crafted.len() as u64, second + random.len() as u64];
    let examine = must_examine(&b.bytes, first, found[0]) + must_examine(&b.bytes, second, found[1]);
    assert_eq!(st.bytes_examined, examine, "{st:?}");
    assert!(st.bytes_examined >= (crafted.len() + MAX_PAYLOAD_BYTES as usize) as u64, "{st:?}");
    assert!(st.bytes_hashed <= st.bytes_examined + 32 * st.candidates, "{st:?}");
    assert!(st.bytes_hashed <= 2 * st.bytes_examined, "{st:?}");
    let direct = direct_search_cost(&b.bytes, first, found[0]);
    assert!(direct > 10_000 * st.bytes_hashed, "direct search {direct} bytes, {st:?}");
}

/// A damaged frame near the start of a large file: the search reads on only as far as the next
/// good frame, not a fixed window.
#[test]
fn the_search_looks_only_as_far_as_the_next_good_frame() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.qsr");
    let mut b = Builder::new();
    // Text payloads: their bytes never make a plausible length.
    let text = |i: usize| format!("record {i:06} ").repeat(600).into_bytes();
    b.frame(text(0));
    let damaged_at = b.bytes.len();
    b.frame(text(1));
    for i in 2..2500 {
        b.frame(text(i));
    }
    // A flipped payload byte in frame 1.
    b.bytes[damaged_at + FRAME_HEADER_LEN + 100] ^= 0x20;
    b.write(&path);
    assert!(b.bytes.len() > 20 << 20);

    let (payloads, st) = read_with_stats(&path);
    assert_eq!(payloads.len(), 2499);
    assert_eq!(payloads[0], b.payloads[0]);
    assert_eq!(payloads[1..], b.payloads[2..]);
    assert_eq!(st.searches, 1);
    let found = (damaged_at + FRAME_HEADER_LEN + b.payloads[1].len()) as u64;
    let examine = must_examine(&b.bytes, damaged_at as u64, found);
    assert_eq!(st.bytes_examined, examine, "{st:?}");
    // Only a plausible length in the damaged frame's own header can make it look further.
    assert!(examine < b.bytes.len() as u64 / 4, "{examine}");
    assert!(st.bytes_hashed <= 2 * st.bytes_examined, "{st:?}");
}
