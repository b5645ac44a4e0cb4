//! Snapshot copies of captured checks run beside the next captured GEMM instead of in front of it.
//!
//! A deferred captured check reads a snapshot that a copy node takes right after its GEMM. On
//! the captured stream that copy delays every later kernel by ~2.5 us per checked GEMM (H100,
//! `docs/measurements/2026-11-25-h100-llama-graph-decode.md`). It only has to come before work
//! that may overwrite what it reads. So the copy is left pending after its GEMM, as work to add
//! after the GEMM's nodes, and the next event on that stream settles it:
//! - **Next intercepted GEMM, nothing captured since.** If the GEMM writes none of the copy's
//!   source ranges, it runs beside the copy ([`Settle::Beside`]). The copy is added after that
//!   GEMM has been captured, as a second dependent of the first GEMM's nodes (so the graph
//!   executor keeps the production chain on one stream), and joins the stream, so the work
//!   after the second GEMM waits for it.
//! - **Anything else.** Other work was captured since, a range overlaps, or the capture is
//!   ending. The copy is added and put in front of everything captured after its GEMM: an edge
//!   to every dependent of the GEMM's nodes ([`Settle::Join`]). A capture is only recorded,
//!   never run, until it is instantiated, so the edges still take effect.
//!
//! A copy that cannot be added and ordered takes its check with it (counted, never judged on a
//! snapshot that may be torn).
//!
//! An event recorded on the stream while a copy is pending settles it too (a join): another
//! stream that waits for that event later depends on what the stream had captured up to then,
//! and that must include the copy, or its work could overwrite what the copy reads.

use crate::device::GraphNode;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Byte ranges `[start, end)`.
pub(crate) type Span = (u64, u64);

/// A copy waiting to be added after its GEMM's nodes and ordered before later work of its
/// stream; `W` is what the backend needs to add it (the prepared copy and its check).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PendingCopy<W> {
    pub capture: u64,
    pub stream: u64,
    /// The stream's capture dependencies right after its GEMM (the GEMM's nodes).
    pub after: Vec<GraphNode>,
    /// What the copy reads.
    pub reads: Vec<Span>,
    /// The next GEMM was let run beside the copy; it is added after that GEMM.
    pub beside: bool,
    /// The thread that captured its GEMM: only that thread adds nodes to the capture's graph
    /// (graphs are not thread-safe).
    pub thread: std::thread::ThreadId,
    pub work: W,
}

/// How a pending copy is settled when the next GEMM of its stream is about to be captured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settle {
    /// The GEMM comes straight after the copy's GEMM and writes nothing it reads.
    Beside,
    /// Added now, ordered before everything captured after its GEMM.
    Join,
}

fn overlaps(a: Span, b: Span) -> bool {
    a.0 < b.1 && b.0 < a.1
}

fn same_nodes(a: &[GraphNode], b: &[GraphNode]) -> bool {
    a.len() == b.len() && a.iter().all(|n| b.contains(n))
}

impl<W> PendingCopy<W> {
    /// Whether the copy may be added from a call in capture `current` (None: not capturing).
    /// Only within its own capture: another capture's graph may belong to another thread (graphs
    /// are not thread-safe) or be freed already (a capture ended or invalidated unseen), and its
    /// nodes then name nothing. Such a copy is dropped with its check, counted.
    pub fn settles_in(&self, current: Option<u64>) -> bool {
        current == Some(self.capture)
    }

    /// `frontier`: the stream's capture dependencies now; `writes`: what the next GEMM writes
    /// (D, and its workspace where it has one; None: unknown).
    pub fn settle(&self, frontier: &[GraphNode], writes: Option<&[Span]>) -> Settle {
        match writes {
            Some(w)
                if same_nodes(frontier, &self.after)
                    && !self.reads.iter().any(|&r| w.iter().any(|&w| overlaps(r, w))) =>
            {
                Settle::Beside
            }
            _ => Settle::Join,
        }
    }
}

/// Most copies pending at once (one per capturing stream); a copy pushed out is settled by a
/// join first.
pub(crate) const MAX_PENDING: usize = 64;

#[derive(Debug)]
pub(crate) struct PendingCopies<W> {
    pending: Vec<PendingCopy<W>>,
}

/// Copies pending in every backend of the process: an event record looks further only when
/// some are (one atomic load on the host's every `cuEventRecord`).
static PENDING_ANYWHERE: AtomicUsize = AtomicUsize::new(0);

/// Whether any backend of the process has a copy pending.
pub(crate) fn any_pending() -> bool {
    PENDING_ANYWHERE.load(Ordering::Acquire) != 0
}

impl<W> Default for PendingCopies<W> {
    fn default() -> Self {
        PendingCopies { pending: Vec::new() }
    }
}

impl<W> PendingCopies<W> {
    /// The copy pending on `stream`, removed.
    pub fn take(&mut self, stream: u64) -> Option<PendingCopy<W>> {
        let i = self.pending.iter().position(|p| p.stream == stream)?;
        self.note_removed(1);
        Some(self.pending.remove(i))
    }

    /// Puts back a copy left beside the next GEMM.
    pub fn put_back(&mut self, copy: PendingCopy<W>) {
        self.pending.push(copy);
        PENDING_ANYWHERE.fetch_add(1, Ordering::AcqRel);
    }

    /// Adds a copy; returns the one pushed out to make room, to be settled by the caller.
    /// A stream has one pending copy at a time (the caller settles the previous one first).
    pub fn push(&mut self, copy: PendingCopy<W>) -> Option<PendingCopy<W>> {
        let out = (self.pending.len() >= MAX_PENDING).then(|| self.pending.remove(0));
        self.note_removed(out.is_some() as usize);
        self.put_back(copy);
        out
    }

    /// Every copy pending in capture `capture`, removed.
    pub fn take_capture(&mut self, capture: u64) -> Vec<PendingCopy<W>> {
        let (mine, rest): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.pending).into_iter().partition(|p| p.capture == capture);
        self.pending = rest;
        self.note_removed(mine.len());
        mine
    }

    fn note_removed(&self, n: usize) {
        if n > 0 {
            PENDING_ANYWHERE.fetch_sub(n, Ordering::AcqRel);
        }
    }
}

impl<W> Drop for PendingCopies<W> {
    fn drop(&mut self) {
        self.note_removed(self.pending.len());
    }
}

/// Tests that leave copies pending hold this (here and in the backend's capture tests): the
/// count of pending copies is the process's.
#[cfg(test)]
pub(crate) static PENDING_COUNT: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[cfg(test)]
mod tests {
    use super::*;

    fn copy(stream: u64, after: &[u64], reads: &[Span]) -> PendingCopy<u64> {
        PendingCopy {
            capture: 7,
            stream,
            after: after.iter().map(|&n| GraphNode(n)).collect(),
            reads: reads.to_vec(),
            beside: false,
            thread: std::thread::current().id(),
            work: 100 + stream,
        }
    }

    fn nodes(n: &[u64]) -> Vec<GraphNode> {
        n.iter().map(|&n| GraphNode(n)).collect()
    }

    #[test]
    fn the_next_gemm_runs_beside_only_straight_after_and_writing_elsewhere() {
        let p = copy(1, &[10, 11], &[(0x1000, 0x3000), (0x8000, 0x8100)]);
        // Same frontier in another order, output elsewhere (touching the end is not overlap).
        assert_eq!(p.settle(&nodes(&[11, 10]), Some(&[(0x3000, 0x4000)])), Settle::Beside);
        // Writes into a source: A, D or a scale of the copied call.
        assert_eq!(p.settle(&nodes(&[10, 11]), Some(&[(0x2fff, 0x4000)])), Settle::Join);
        assert_eq!(p.settle(&nodes(&[10, 11]), Some(&[(0x80f0, 0x80f8)])), Settle::Join);
        // Something else was captured since (the frontier moved), or a node was added to it.
        assert_eq!(p.settle(&nodes(&[12]), Some(&[(0x9000, 0xa000)])), Settle::Join);
        assert_eq!(p.settle(&nodes(&[10, 11, 12]), Some(&[(0x9000, 0xa000)])), Settle::Join);
        assert_eq!(p.settle(&nodes(&[10]), Some(&[(0x9000, 0xa000)])), Settle::Join);
        // The call's workspace (a second range it writes) over a source.
        assert_eq!(p.settle(&nodes(&[10, 11]), Some(&[(0x9000, 0xa000), (0x1800, 0x1900)])), Settle::Join);
        assert_eq!(p.settle(&nodes(&[10, 11]), Some(&[(0x9000, 0xa000), (0xb000, 0xc000)])), Settle::Beside);
        // Unknown output: never beside.
        assert_eq!(p.settle(&nodes(&[10, 11]), None), Settle::Join);
    }

    #[test]
    fn a_copy_is_only_added_within_its_own_capture() {
        let p = copy(1, &[10], &[]); // capture 7
        assert!(p.settles_in(Some(7)));
        assert!(!p.settles_in(Some(8)), "another capture: maybe another thread's graph");
        assert!(!p.settles_in(None), "the stream no longer captures");
    }

    use super::PENDING_COUNT;

    #[test]
    fn pending_copies_are_one_per_stream_bounded_and_taken_per_capture() {
        let _count = PENDING_COUNT.lock().unwrap_or_else(|e| e.into_inner());
        let mut pc = PendingCopies::<u64>::default();
        assert!(pc.push(copy(1, &[1], &[])).is_none());
        assert!(pc.push(PendingCopy { capture: 8, ..copy(2, &[2], &[]) }).is_none());
        assert!(pc.take(3).is_none());
        let one = pc.take(1).expect("pending on stream 1");
        assert!(pc.take(1).is_none(), "taken once");
        pc.put_back(PendingCopy { beside: true, ..one });
        let seven = pc.take_capture(7);
        assert_eq!((seven.len(), seven[0].beside), (1, true));
        assert!(pc.take_capture(7).is_empty());
        let two = pc.take(2).expect("capture 8's copy stays");
        pc.put_back(two);
        for s in 10..10 + MAX_PENDING as u64 - 1 {
            assert!(pc.push(copy(s, &[s], &[])).is_none());
        }
        // Full: the oldest (stream 2, capture 8) comes back to be joined by the caller.
        let out = pc.push(copy(99, &[99], &[])).expect("one pushed out");
        assert_eq!(out.stream, 2);
        assert_eq!(pc.take_capture(7).len(), MAX_PENDING);
    }

    #[test]
    fn event_records_look_further_only_while_a_copy_is_pending_somewhere() {
        let _count = PENDING_COUNT.lock().unwrap_or_else(|e| e.into_inner());
        assert!(!any_pending());
        let mut a = PendingCopies::<u64>::default();
        let mut b = PendingCopies::<u64>::default();
        a.push(copy(1, &[1], &[]));
        b.push(copy(2, &[2], &[]));
        let one = a.take(1).unwrap();
        assert!(any_pending(), "another backend's copy is still pending");
        a.put_back(one);
        assert_eq!(b.take_capture(7).len(), 1);
        assert!(any_pending());
        assert!(a.take(1).is_some());
        assert!(!any_pending());
        // A backend dropped with copies pending leaves nothing counted.
        a.push(copy(3, &[3], &[]));
        drop(a);
        assert!(!any_pending());
        for s in 0..MAX_PENDING as u64 + 2 {
            b.push(copy(s, &[s], &[]));
        }
        drop(b);
        assert!(!any_pending(), "copies pushed out are not counted twice");
    }
}
