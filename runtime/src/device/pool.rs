//! Device memory reserved up front and handed out without calling the driver.
//!
//! The shadow engine must not allocate while a stream is capturing (an allocation can
//! invalidate someone else's CUDA graph capture) and must keep its footprint bounded inside
//! someone else's process. So one region is reserved when a device is first used, and checks
//! take blocks from it: first fit over an address-ordered free list, blocks aligned to
//! [`POOL_ALIGN`], neighbours merged on release. When the pool cannot serve a request the
//! caller gets [`PoolError::Exhausted`] and skips the check (counted), never a driver call.

use super::{DeviceError, DevicePtr, GpuRuntime};
use std::sync::{Arc, Mutex};

/// Alignment of every block: enough for vector loads of any element or scale format.
pub const POOL_ALIGN: usize = 256;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PoolError {
    #[error("device pool exhausted: {requested} bytes requested, {free} free in {fragments} fragments (pool of {capacity})")]
    Exhausted { requested: usize, free: usize, fragments: usize, capacity: usize },
    #[error("a block of 0 bytes was requested")]
    Empty,
}

/// Bytes in use and free, for logs and the session's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolStats {
    pub capacity: usize,
    pub in_use: usize,
    pub peak_in_use: usize,
    pub blocks: usize,
    pub refused: u64,
}

struct FreeList {
    /// (offset, length), sorted by offset, never adjacent (merged on release).
    free: Vec<(usize, usize)>,
    stats: PoolStats,
}

/// One device's reserved region.
pub struct DevicePool {
    runtime: Arc<dyn GpuRuntime>,
    base: DevicePtr,
    capacity: usize,
    state: Mutex<FreeList>,
    /// `stats.in_use`, readable without the lock ([`DevicePool::in_use`]).
    in_use: std::sync::atomic::AtomicUsize,
}

/// A block of the pool; returned to it on drop.
#[derive(Debug)]
pub struct PoolBlock {
    pool: Arc<DevicePool>,
    offset: usize,
    pub bytes: usize,
}

impl PoolBlock {
    pub fn ptr(&self) -> DevicePtr {
        self.pool.base + self.offset as u64
    }
}

impl Drop for PoolBlock {
    fn drop(&mut self) {
        self.pool.release(self.offset, self.bytes);
    }
}

impl std::fmt::Debug for DevicePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DevicePool({:#x}, {} bytes)", self.base, self.capacity)
    }
}

impl Drop for DevicePool {
    fn drop(&mut self) {
        // SAFETY: the region came from this runtime's malloc; every block holds an Arc to the
        // pool, so none is alive when the pool drops.
        let _ = unsafe { self.runtime.free(self.base) };
    }
}

fn round_up(bytes: usize) -> usize {
    bytes.div_ceil(POOL_ALIGN) * POOL_ALIGN
}

impl DevicePool {
    /// Reserves `capacity` bytes (rounded up to [`POOL_ALIGN`]) with one driver allocation.
    pub fn reserve(runtime: Arc<dyn GpuRuntime>, capacity: usize) -> Result<Arc<DevicePool>, DeviceError> {
        let capacity = round_up(capacity.max(1));
        let base = runtime.malloc(capacity)?;
        Ok(Arc::new(DevicePool {
            runtime,
            base,
            capacity,
            state: Mutex::new(FreeList {
                free: vec![(0, capacity)],
                stats: PoolStats { capacity, ..PoolStats::default() },
            }),
            in_use: std::sync::atomic::AtomicUsize::new(0),
        }))
    }

    /// A block of at least `bytes` bytes, aligned to [`POOL_ALIGN`]. Never calls the driver.
    pub fn take(self: &Arc<Self>, bytes: usize) -> Result<PoolBlock, PoolError> {
        if bytes == 0 {
            return Err(PoolError::Empty);
        }
        let size = round_up(bytes);
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let Some(index) = state.free.iter().position(|&(_, len)| len >= size) else {
            state.stats.refused += 1;
            return Err(PoolError::Exhausted {
                requested: bytes,
                free: state.free.iter().map(|f| f.1).sum(),
                fragments: state.free.len(),
                capacity: self.capacity,
            });
        };
        let (offset, len) = state.free[index];
        if len == size {
            state.free.remove(index);
        } else {
            state.free[index] = (offset + size, len - size);
        }
        state.stats.in_use += size;
        self.in_use.store(state.stats.in_use, std::sync::atomic::Ordering::Relaxed);
        state.stats.peak_in_use = state.stats.peak_in_use.max(state.stats.in_use);
        state.stats.blocks += 1;
        Ok(PoolBlock { pool: self.clone(), offset, bytes: size })
    }

    fn release(&self, offset: usize, size: usize) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let free = &mut state.free;
        let at = free.partition_point(|&(o, _)| o < offset);
        free.insert(at, (offset, size));
        // Merge with the right neighbour, then the left one.
        if at + 1 < free.len() && free[at].0 + free[at].1 == free[at + 1].0 {
            free[at].1 += free[at + 1].1;
            free.remove(at + 1);
        }
        if at > 0 && free[at - 1].0 + free[at - 1].1 == free[at].0 {
            free[at - 1].1 += free[at].1;
            free.remove(at);
        }
        state.stats.in_use -= size;
        self.in_use.store(state.stats.in_use, std::sync::atomic::Ordering::Relaxed);
        state.stats.blocks -= 1;
    }

    /// Bytes in use now, without taking the lock (as of the latest take or release).
    pub fn in_use(&self) -> usize {
        self.in_use.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn stats(&self) -> PoolStats {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).stats
    }

    pub fn base(&self) -> DevicePtr {
        self.base
    }
}
