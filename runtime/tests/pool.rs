//! The device pool against a fake runtime that counts driver calls: one allocation at
//! reservation, none afterwards; aligned, disjoint blocks; exhaustion is an error; released
//! blocks merge back; the region is freed once.

use quantshadow_runtime::device::fake::FakeRuntime;
use quantshadow_runtime::device::pool::{DevicePool, PoolError, POOL_ALIGN};
use quantshadow_runtime::rng::SplitMix64;
use std::sync::atomic::Ordering;
use std::sync::Arc;

#[test]
fn blocks_are_aligned_disjoint_and_never_allocate() {
    let rt = Arc::new(FakeRuntime::default());
    let pool = DevicePool::reserve(rt.clone(), 1 << 20).unwrap();
    let mut rng = SplitMix64::new(3);
    let mut blocks = Vec::new();
    while let Ok(b) = pool.take(1 + rng.below(20_000) as usize) {
        blocks.push(b);
    }
    assert_eq!(rt.mallocs.load(Ordering::SeqCst), 1, "only the reservation calls the driver");
    let mut spans: Vec<(u64, u64)> = blocks.iter().map(|b| (b.ptr(), b.ptr() + b.bytes as u64)).collect();
    spans.sort();
    for (start, end) in &spans {
        assert_eq!(start % POOL_ALIGN as u64, 0);
        let base = rt.first_malloc.load(Ordering::SeqCst);
        assert!(*start >= base && *end <= base + (1 << 20));
    }
    for pair in spans.windows(2) {
        assert!(pair[0].1 <= pair[1].0, "blocks overlap: {pair:?}");
    }
    assert!(pool.stats().refused >= 1);
}

#[test]
fn exhaustion_is_an_error_and_released_blocks_merge_back() {
    let rt = Arc::new(FakeRuntime::default());
    let pool = DevicePool::reserve(rt.clone(), 64 * POOL_ALIGN).unwrap();
    let mut blocks: Vec<_> = (0..64).map(|_| pool.take(POOL_ALIGN).unwrap()).collect();
    match pool.take(1) {
        Err(PoolError::Exhausted { requested: 1, free: 0, .. }) => {}
        other => panic!("expected exhaustion, got {other:?}"),
    }
    assert!(matches!(pool.take(0), Err(PoolError::Empty)));
    // Free every other block: 32 free fragments, none large enough for 2 x POOL_ALIGN.
    let mut kept = Vec::new();
    for (i, b) in blocks.drain(..).enumerate() {
        if i % 2 == 0 {
            kept.push(b);
        }
    }
    match pool.take(2 * POOL_ALIGN) {
        Err(PoolError::Exhausted { fragments: 32, .. }) => {}
        other => panic!("expected fragmentation, got {other:?}"),
    }
    // Freeing the rest merges everything back into one region that serves the whole pool.
    drop(kept);
    assert_eq!(pool.stats().in_use, 0);
    let all = pool.take(64 * POOL_ALIGN).unwrap();
    assert_eq!(all.ptr(), rt.first_malloc.load(Ordering::SeqCst));
    assert_eq!(pool.stats().peak_in_use, 64 * POOL_ALIGN);
    assert_eq!(rt.mallocs.load(Ordering::SeqCst), 1);
}

#[test]
fn concurrent_use_returns_every_byte_and_the_region_is_freed_once() {
    let rt = Arc::new(FakeRuntime::default());
    let pool = DevicePool::reserve(rt.clone(), 4 << 20).unwrap();
    std::thread::scope(|scope| {
        for t in 0..4u64 {
            let pool = pool.clone();
            scope.spawn(move || {
                let mut rng = SplitMix64::new(t);
                let mut held = Vec::new();
                for _ in 0..2000 {
                    if rng.below(2) == 0 || held.is_empty() {
                        if let Ok(b) = pool.take(1 + rng.below(50_000) as usize) {
                            held.push(b);
                        }
                    } else {
                        let i = rng.below(held.len() as u64) as usize;
                        held.swap_remove(i);
                    }
                }
            });
        }
    });
    let stats = pool.stats();
    assert_eq!((stats.in_use, stats.blocks), (0, 0), "{stats:?}");
    assert_eq!(rt.frees.load(Ordering::SeqCst), 0);
    drop(pool);
    assert_eq!(rt.frees.load(Ordering::SeqCst), 1);
    assert_eq!(rt.freed.load(Ordering::SeqCst), rt.first_malloc.load(Ordering::SeqCst));
}
