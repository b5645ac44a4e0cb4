//! Sketch projections a site replaced, kept until no check can still read them.
//!
//! A site re-projects its weight when B changed under the same pointer (the device reported
//! `WEIGHT_CHANGED`) and, for a transient site (a shape whose B pointer is new at every call),
//! at every call. Checks hold raw device pointers into the old projection (W_R, its fragments,
//! the probe signs, B's samples): a detached check enqueued on the side stream runs later, a
//! check behind the call on the caller's stream may not have run yet, and the nodes of an
//! instantiated CUDA graph read them at every replay. Dropped at once, the projection's memory
//! would go back to the pool, whose next allocation may be written before those checks read it:
//! a false result. So a replaced projection waits here until events recorded when it was
//! replaced (on the caller's stream and the side stream) have completed; one of a site with
//! captured checks is kept for as long as the backend lives (its graphs may replay), up to
//! [`KEPT_MAX`].

use std::collections::VecDeque;

/// Replaced projections waiting for their events; a site finding no room skips its call.
pub(super) const WAITING_MAX: usize = 64;
/// Replaced projections of sites with captured checks kept for the graphs; beyond it the oldest
/// goes (its graphs, if still replayed, may then read recycled memory: logged).
pub(super) const KEPT_MAX: usize = 256;

pub(super) struct Retired<W, E> {
    /// Each with the events that must complete before it can go.
    waiting: VecDeque<(W, Vec<E>)>,
    kept: VecDeque<W>,
    /// Events of projections that went, to record again (events are never destroyed).
    pub spare: Vec<E>,
}

impl<W, E> Default for Retired<W, E> {
    fn default() -> Self {
        Retired { waiting: VecDeque::new(), kept: VecDeque::new(), spare: Vec::new() }
    }
}

impl<W, E: Copy> Retired<W, E> {
    /// Drops the waiting projections whose events are all done (their events become spare).
    pub fn collect(&mut self, done: impl Fn(E) -> bool) {
        let mut still = VecDeque::with_capacity(self.waiting.len());
        for (w, events) in self.waiting.drain(..) {
            if events.iter().all(|&e| done(e)) {
                self.spare.extend(events);
                drop(w);
            } else {
                still.push_back((w, events));
            }
        }
        self.waiting = still;
    }

    /// Whether another projection can wait (after [`Self::collect`]).
    pub fn has_room(&self) -> bool {
        self.waiting.len() < WAITING_MAX
    }

    /// A replaced projection that goes once `events` have completed.
    pub fn wait(&mut self, w: W, events: Vec<E>) {
        self.waiting.push_back((w, events));
    }

    /// A replaced projection of a site with captured checks. Returns true when the oldest kept
    /// one had to go to make room.
    pub fn keep(&mut self, w: W) -> bool {
        self.kept.push_back(w);
        if self.kept.len() > KEPT_MAX {
            self.kept.pop_front();
            return true;
        }
        false
    }

    #[cfg(test)]
    pub fn waiting_len(&self) -> usize {
        self.waiting.len()
    }

    #[cfg(test)]
    pub fn kept_len(&self) -> usize {
        self.kept.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::rc::Rc;

    /// A projection that records when it is dropped.
    struct Tracked(u32, Rc<RefCell<Vec<u32>>>);
    impl Drop for Tracked {
        fn drop(&mut self) {
            self.1.borrow_mut().push(self.0);
        }
    }

    #[test]
    fn a_projection_goes_only_when_all_its_events_are_done() {
        let dropped = Rc::new(RefCell::new(Vec::new()));
        let mut r: Retired<Tracked, u32> = Retired::default();
        r.wait(Tracked(1, dropped.clone()), vec![10, 11]);
        r.wait(Tracked(2, dropped.clone()), vec![12]);
        r.collect(|e| e == 10 || e == 12); // 11 still running
        assert_eq!(*dropped.borrow(), vec![2]);
        assert_eq!(r.waiting_len(), 1);
        assert_eq!(r.spare, vec![12]);
        r.collect(|_| true);
        assert_eq!(*dropped.borrow(), vec![2, 1]);
        assert_eq!(r.spare, vec![12, 10, 11]);
        assert_eq!(r.waiting_len(), 0);
    }

    #[test]
    fn waiting_is_bounded_and_kept_ones_never_wait_for_events() {
        let dropped = Rc::new(RefCell::new(Vec::new()));
        let mut r: Retired<Tracked, u32> = Retired::default();
        for i in 0..WAITING_MAX as u32 {
            assert!(r.has_room());
            r.wait(Tracked(i, dropped.clone()), vec![i]);
        }
        assert!(!r.has_room(), "the caller skips instead of dropping one that may be in use");
        r.collect(|_| false);
        assert!(!r.has_room());
        assert!(dropped.borrow().is_empty());
        for i in 0..KEPT_MAX as u32 {
            assert!(!r.keep(Tracked(1000 + i, dropped.clone())));
        }
        r.collect(|_| true);
        assert_eq!(r.kept_len(), KEPT_MAX, "collect never drops a kept projection");
        assert!(r.keep(Tracked(5000, dropped.clone())), "the oldest kept one goes past KEPT_MAX");
        assert!(dropped.borrow().contains(&1000));
        assert_eq!(r.kept_len(), KEPT_MAX);
    }
}
