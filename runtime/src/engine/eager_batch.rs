//! Detached eager sketch checks run in batches (`QUANTSHADOW_SKETCH_BATCH`).
//!
//! A lean sketch check costs about the same whatever the GEMM: ~15 us on an H100 for 256 rows,
//! mostly latency (the launch, one round of loads, the serial finishing), while its 64 blocks
//! hold only half of the SMs (docs/measurements/2026-11-26-h100-lean-sketch.md). So a batched
//! call has its sampled rows copied into a snapshot on its stream right after the GEMM, as a
//! detached check does, and its check waits. When `size` checks of one stream wait (or the
//! oldest has waited [`MAX_WAIT`]), they run as one `qs_sketch_lean_batch` launch on that
//! stream, sharing the waves. The stream's order is the only synchronisation: the checks read
//! only their snapshots, copied before the launch; the next copies into the same slots are
//! enqueued after it. No event, no side stream, no skip because a check is still running.
//!
//! Each waiting check of a stream holds a slot (its snapshot buffer, and check scratch per
//! shape) that no other waiting check of that stream holds. Checks still waiting when the
//! process exits are launched by [`super::Backend::flush`] from the exit handler, or counted as
//! skipped when that cannot be done.

use crate::device::abi::LEAN_BATCH;
use crate::device::gpu::{DeviceBuffer, LeanBatch, SketchScratch};
use crate::device::{Event, Stream};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Streams with checks gathered at once; calls on further streams take the side-stream path.
pub(super) const MAX_STREAMS: usize = 8;
/// A batch is launched with the call that finds its oldest check waiting this long, full or
/// not: results of a stream that checks rarely (sparse sampling) are not held back.
pub(super) const MAX_WAIT: Duration = Duration::from_millis(20);

/// (sampled rows, K, N, probes), as `gpu::ShapeKey`: checks of one shape share scratch sizes.
pub(super) type ShapeKey = (u64, u64, u64, u32);

/// The waiting checks of one stream and the slots they use.
pub(super) struct StreamBatch {
    pub stream: Stream,
    /// Created for the first lean check; replaced (when empty) for a check of another program.
    pub batch: Option<LeanBatch>,
    /// Slot of each waiting check, in batch order.
    held: Vec<usize>,
    /// When the oldest waiting check was added.
    oldest: Option<Instant>,
    buffers: [Option<DeviceBuffer>; LEAN_BATCH],
    scratch: HashMap<(ShapeKey, usize), SketchScratch>,
    /// Recorded on the stream after each batched launch: a slot's buffer goes back to the pool
    /// (to grow) only once the launches that may read it have run, since the pool may hand the
    /// memory to work on another stream at once.
    pub launched: Option<Event>,
    /// The event could not be made or recorded: whether old launches have run is unknown, so
    /// no buffer of this stream is replaced any more.
    pub never_regrow: bool,
}

impl StreamBatch {
    fn new(stream: Stream) -> StreamBatch {
        StreamBatch {
            stream,
            batch: None,
            held: Vec::new(),
            oldest: None,
            buffers: Default::default(),
            scratch: HashMap::new(),
            launched: None,
            never_regrow: false,
        }
    }

    /// Checks waiting.
    pub fn waiting(&self) -> usize {
        self.held.len()
    }

    /// The lowest slot no waiting check holds (None: all are held).
    pub fn free_slot(&self) -> Option<usize> {
        (0..LEAN_BATCH).find(|s| !self.held.contains(s))
    }

    /// Bytes of slot `slot`'s snapshot buffer (0: none yet).
    pub fn buffer_bytes(&self, slot: usize) -> u64 {
        self.buffers[slot].as_ref().map_or(0, |b| b.bytes as u64)
    }

    /// Bytes a slot's buffer is given when it must hold `bytes`: the largest of this stream's.
    pub fn grow_size(&self, bytes: u64) -> u64 {
        (0..LEAN_BATCH).map(|s| self.buffer_bytes(s)).max().unwrap_or(0).max(bytes)
    }

    /// Slot `slot`'s snapshot buffer, replaced by `grow(size)` when it holds fewer than
    /// `bytes` (size: the largest snapshot this stream has needed, so that a slot grows
    /// rarely). The caller makes sure no launch still reads the old one.
    pub fn buffer(
        &mut self,
        slot: usize,
        bytes: u64,
        grow: impl FnOnce(u64) -> Result<DeviceBuffer, crate::device::DeviceError>,
    ) -> Result<u64, crate::device::DeviceError> {
        let size = self.grow_size(bytes);
        if self.buffer_bytes(slot) < bytes {
            self.buffers[slot] = None; // back to the pool first, so that growing can reuse it
            self.buffers[slot] = Some(grow(size)?);
        }
        Ok(self.buffers[slot].as_ref().expect("set above").ptr)
    }

    /// Slot `slot`'s check scratch for `shape`, made by `make()` the first time.
    pub fn scratch(
        &mut self,
        shape: ShapeKey,
        slot: usize,
        make: impl FnOnce() -> Result<SketchScratch, crate::device::DeviceError>,
    ) -> Result<&SketchScratch, crate::device::DeviceError> {
        use std::collections::hash_map::Entry;
        Ok(match self.scratch.entry((shape, slot)) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => e.insert(make()?),
        })
    }

    /// Records that the check just added to `batch` holds `slot`.
    pub fn hold(&mut self, slot: usize, now: Instant) {
        self.held.push(slot);
        self.oldest.get_or_insert(now);
    }

    /// Whether the waiting checks should be launched now: `size` of them, or the oldest has
    /// waited [`MAX_WAIT`].
    pub fn due(&self, size: usize, now: Instant) -> bool {
        !self.held.is_empty()
            && (self.held.len() >= size || self.oldest.is_some_and(|t| now.duration_since(t) >= MAX_WAIT))
    }

    /// After the waiting checks were launched, or given up: every slot is free again.
    pub fn release(&mut self) {
        self.held.clear();
        self.oldest = None;
    }
}

/// The batches of one device's streams.
#[derive(Default)]
pub(super) struct EagerBatches {
    streams: Vec<StreamBatch>,
}

impl EagerBatches {
    /// The batch of `stream`, made if there is room for another stream (None: there is not).
    pub fn for_stream(&mut self, stream: Stream) -> Option<&mut StreamBatch> {
        match self.streams.iter().position(|b| b.stream == stream) {
            Some(i) => Some(&mut self.streams[i]),
            None if self.streams.len() < MAX_STREAMS => {
                self.streams.push(StreamBatch::new(stream));
                self.streams.last_mut()
            }
            None => None,
        }
    }

    /// Bytes of every snapshot buffer held (bounded by the caller: a quarter of the pool).
    pub fn buffer_bytes(&self) -> u64 {
        self.streams.iter().map(|b| (0..LEAN_BATCH).map(|s| b.buffer_bytes(s)).sum::<u64>()).sum()
    }

    /// Every stream's batch with checks waiting.
    pub fn waiting(&mut self) -> impl Iterator<Item = &mut StreamBatch> {
        self.streams.iter_mut().filter(|b| b.waiting() > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_is_never_given_to_two_waiting_checks() {
        let mut b = StreamBatch::new(Stream(7));
        let t = Instant::now();
        for expected in 0..LEAN_BATCH {
            assert_eq!(b.free_slot(), Some(expected));
            b.hold(expected, t);
        }
        assert_eq!(b.free_slot(), None, "all held");
        b.release();
        assert_eq!(b.free_slot(), Some(0));
        // A check prepared in slot 2 ahead of a launch that emptied the batch keeps slot 2; the
        // next check must not get it.
        b.hold(2, t);
        assert_eq!(b.free_slot(), Some(0));
        b.hold(0, t);
        assert_eq!(b.free_slot(), Some(1));
        assert_eq!(b.waiting(), 2);
    }

    #[test]
    fn due_when_full_or_when_the_oldest_waited_long_enough() {
        let mut b = StreamBatch::new(Stream(1));
        let t0 = Instant::now();
        assert!(!b.due(3, t0), "nothing waiting");
        b.hold(0, t0);
        b.hold(1, t0 + Duration::from_millis(1));
        assert!(!b.due(3, t0 + Duration::from_millis(2)));
        assert!(b.due(2, t0 + Duration::from_millis(2)), "full");
        assert!(b.due(3, t0 + MAX_WAIT), "the oldest waited MAX_WAIT");
        b.release();
        assert!(!b.due(1, t0 + MAX_WAIT * 2), "released");
        b.hold(0, t0 + MAX_WAIT * 2);
        assert!(!b.due(3, t0 + MAX_WAIT * 2 + Duration::from_millis(5)), "the clock restarts");
    }

    #[test]
    fn streams_are_bounded_and_kept_apart() {
        let mut all = EagerBatches::default();
        let t = Instant::now();
        for s in 0..MAX_STREAMS as u64 {
            all.for_stream(Stream(s)).expect("room").hold(0, t);
        }
        assert!(all.for_stream(Stream(99)).is_none(), "one stream too many");
        assert_eq!(all.for_stream(Stream(3)).expect("known").waiting(), 1);
        assert_eq!(all.waiting().count(), MAX_STREAMS);
        all.for_stream(Stream(3)).expect("known").release();
        assert_eq!(all.waiting().count(), MAX_STREAMS - 1);
    }
}
