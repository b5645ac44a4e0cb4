//! Eager calls whose one check result has not arrived yet, for the exit to wait on: bounded,
//! and O(1) per call amortised even when results stop coming back (a full ring drops them),
//! where letting go of stale entries once scanned the whole set at every call (35 us a call
//! at 8192 entries, `bench_engine_eager_sketch`).

use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

pub(super) struct Outstanding {
    /// call_seq -> when its check was enqueued.
    since: FxHashMap<u64, Instant>,
    /// (call_seq, when) in the order tracked; entries already settled are dropped lazily.
    order: VecDeque<(u64, Instant)>,
    cap: usize,
    stale: Duration,
}

impl Outstanding {
    pub(super) fn new(cap: usize, stale: Duration) -> Outstanding {
        Outstanding { since: FxHashMap::default(), order: VecDeque::new(), cap, stale }
    }

    /// Starts waiting for `call_seq`; false when `cap` calls younger than `stale` are still
    /// waited for (the call is then not waited for at exit).
    pub(super) fn track(&mut self, call_seq: u64, now: Instant) -> bool {
        self.let_go_of_stale(now);
        if self.since.len() >= self.cap {
            return false;
        }
        self.since.insert(call_seq, now);
        self.order.push_back((call_seq, now));
        if self.order.len() > 2 * self.cap {
            // Entries behind a long-waiting oldest one that settled meanwhile.
            let since = &self.since;
            self.order.retain(|(seq, t)| since.get(seq) == Some(t));
        }
        true
    }

    /// The result (or failure) of `call_seq`'s check arrived.
    pub(super) fn settle(&mut self, call_seq: u64) {
        self.since.remove(&call_seq);
    }

    /// Calls still waited for and not stale.
    pub(super) fn live(&self, now: Instant) -> usize {
        self.since.values().filter(|t| now.duration_since(**t) < self.stale).count()
    }

    /// Drops the oldest entries while they are settled or stale (their results were dropped).
    fn let_go_of_stale(&mut self, now: Instant) {
        while let Some(&(seq, t)) = self.order.front() {
            match self.since.get(&seq) {
                Some(&since) if since == t => {
                    if now.duration_since(t) < self.stale {
                        break;
                    }
                    self.since.remove(&seq);
                }
                _ => {}
            }
            self.order.pop_front();
        }
    }

    #[cfg(test)]
    fn order_len(&self) -> usize {
        self.order.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_set_refuses_until_its_oldest_entries_are_stale() {
        let t0 = Instant::now();
        let mut o = Outstanding::new(3, Duration::from_secs(10));
        assert!(o.track(1, t0) && o.track(2, t0) && o.track(3, t0 + Duration::from_secs(5)));
        assert!(!o.track(4, t0 + Duration::from_secs(9)), "full of fresh entries");
        assert_eq!(o.live(t0 + Duration::from_secs(9)), 3);
        // 1 and 2 are stale at 10 s: let go of, 4 taken.
        assert!(o.track(4, t0 + Duration::from_secs(10)));
        assert_eq!(o.live(t0 + Duration::from_secs(10)), 2);
        o.settle(3);
        o.settle(4);
        assert_eq!(o.live(t0 + Duration::from_secs(10)), 0);
        // Settling a call never tracked (or twice) changes nothing.
        o.settle(3);
        o.settle(99);
        assert!(o.track(5, t0 + Duration::from_secs(11)));
    }

    #[test]
    fn settled_entries_behind_a_waiting_oldest_do_not_accumulate() {
        // One call never settles (not stale yet); a million later ones settle at once: the
        // order queue stays within twice the cap, and tracking stays possible.
        let t0 = Instant::now();
        let mut o = Outstanding::new(8, Duration::from_secs(10));
        assert!(o.track(0, t0));
        for seq in 1..1_000_000 {
            assert!(o.track(seq, t0), "call {seq}");
            o.settle(seq);
            assert!(o.order_len() <= 16);
        }
        assert_eq!(o.live(t0), 1);
    }

    #[test]
    fn a_call_settled_and_tracked_again_is_waited_for_once() {
        let t0 = Instant::now();
        let mut o = Outstanding::new(2, Duration::from_secs(10));
        assert!(o.track(7, t0));
        o.settle(7);
        assert!(o.track(7, t0 + Duration::from_secs(1)));
        // Its first entry in the order queue is no longer its live one: not let go of at 10 s.
        assert!(o.track(8, t0 + Duration::from_secs(10)));
        assert_eq!(o.live(t0 + Duration::from_secs(10)), 2);
    }
}
