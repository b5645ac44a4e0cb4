//! A [`GpuRuntime`] over host memory, for tests of the layers above the vendor runtimes (the
//! device pool, the GPU backend's bookkeeping) on machines without a GPU. It counts the calls
//! those tests assert on; by default its compiler always fails (a test of a working kernel needs
//! a GPU) and every other operation is `Unsupported`. [`FakeRuntime::with_kernels`] makes
//! programs load and launches, event records and stream waits succeed without running anything,
//! and logs them in order: for tests of which work the backend enqueues where. Not used by the
//! product.

use super::{
    DeviceError, DeviceInfo, DevicePtr, Event, Function, GpuRuntime, LaunchOrder, MappedHost, Module, Stream,
    Vendor,
};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// The log of every failed compile (what NVRTC 13.0 said of the kernels before `-default-device`).
pub const COMPILE_LOG: &str = "error: host functions are not allowed in JIT mode";

/// Host memory stands in for device memory: a "device pointer" is the host address, so the
/// synchronous copies work and the tests can look at what was written.
#[derive(Default)]
pub struct FakeRuntime {
    pub mallocs: AtomicU64,
    pub frees: AtomicU64,
    /// The address the last `free` released.
    pub freed: AtomicU64,
    /// Address of the first allocation (the pool's reservation in the pool tests).
    pub first_malloc: AtomicU64,
    pub compiles: AtomicU64,
    /// Live allocations by aligned address; dropped on free.
    memory: Mutex<HashMap<u64, HostBlock>>,
    /// [`FakeRuntime::with_kernels`]: programs load, launches and stream work succeed.
    kernels: bool,
    /// Names of the functions handed out (a function's handle is its index + 1).
    functions: Mutex<Vec<String>>,
    /// What `with_kernels` enqueued, in order: "launch NAME GXxGYxGZ on S", "record E on S",
    /// "S waits E".
    pub log: Mutex<Vec<String>>,
    /// What `event_done` answers under `with_kernels`.
    pub events_done: std::sync::atomic::AtomicBool,
    events: AtomicU64,
    /// Launches of functions whose name contains this fail (nothing is logged for them).
    pub fail_launches_of: Mutex<Option<String>>,
    /// Launches, event records and waits succeed without being logged (host-cost benches:
    /// the log's formatting would outweigh what they measure).
    pub quiet: std::sync::atomic::AtomicBool,
}

/// The side stream `with_kernels` creates.
pub const SIDE_STREAM: Stream = Stream(0x51de);

/// The backing words of an allocation and the bytes asked for.
type HostBlock = (Box<[u64]>, usize);

/// Device allocations are at least this aligned on every vendor runtime (the pool relies on it).
const ALIGN: usize = 4096;

fn unsupported<T>() -> Result<T, DeviceError> {
    Err(DeviceError::Unsupported("fake runtime".into()))
}

impl FakeRuntime {
    /// A fake whose programs load and whose launches succeed (nothing runs; see `log`).
    pub fn with_kernels() -> FakeRuntime {
        FakeRuntime { kernels: true, ..Default::default() }
    }

    /// The log entries so far, taken.
    pub fn take_log(&self) -> Vec<String> {
        std::mem::take(&mut *self.log.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn note(&self, entry: String) -> Result<(), DeviceError> {
        if !self.kernels {
            return unsupported();
        }
        self.log.lock().unwrap_or_else(|e| e.into_inner()).push(entry);
        Ok(())
    }

    fn host_alloc(&self, bytes: usize) -> u64 {
        let block = vec![0u64; (bytes + ALIGN).div_ceil(8)].into_boxed_slice();
        let addr = (block.as_ptr() as u64).next_multiple_of(ALIGN as u64);
        self.memory.lock().unwrap_or_else(|e| e.into_inner()).insert(addr, (block, bytes));
        addr
    }

    fn release(&self, addr: u64) {
        self.memory.lock().unwrap_or_else(|e| e.into_inner()).remove(&addr);
    }

    /// Whether `[addr, addr + bytes)` lies inside one live allocation.
    fn holds(&self, addr: u64, bytes: usize) -> bool {
        let memory = self.memory.lock().unwrap_or_else(|e| e.into_inner());
        memory.iter().any(|(base, (_, len))| addr >= *base && addr + bytes as u64 <= base + *len as u64)
    }
}

impl GpuRuntime for FakeRuntime {
    fn vendor(&self) -> Vendor {
        Vendor::Nvidia
    }
    fn current_device(&self) -> Result<DeviceInfo, DeviceError> {
        Ok(DeviceInfo {
            vendor: Vendor::Nvidia,
            ordinal: 0,
            name: "fake".into(),
            arch: "sm_90".into(),
            total_memory: 1 << 30,
            multiprocessors: 132,
            warp_size: 32,
            runtime_version: 13000,
        })
    }
    fn current_ordinal(&self) -> Result<i32, DeviceError> {
        Ok(0)
    }
    fn malloc(&self, bytes: usize) -> Result<DevicePtr, DeviceError> {
        let addr = self.host_alloc(bytes);
        if self.mallocs.fetch_add(1, Ordering::SeqCst) == 0 {
            self.first_malloc.store(addr, Ordering::SeqCst);
        }
        Ok(addr)
    }
    unsafe fn free(&self, ptr: DevicePtr) -> Result<(), DeviceError> {
        self.frees.fetch_add(1, Ordering::SeqCst);
        self.freed.store(ptr, Ordering::SeqCst);
        self.release(ptr);
        Ok(())
    }
    fn alloc_mapped(&self, bytes: usize) -> Result<MappedHost, DeviceError> {
        let addr = self.host_alloc(bytes);
        Ok(MappedHost { host: addr as *mut u8, device: addr, bytes })
    }
    unsafe fn free_mapped(&self, mapped: &MappedHost) -> Result<(), DeviceError> {
        self.release(mapped.device);
        Ok(())
    }
    fn copy_to_device_sync(&self, dst: DevicePtr, src: &[u8]) -> Result<(), DeviceError> {
        if !self.holds(dst, src.len()) {
            return Err(DeviceError::Unsupported(format!("fake runtime: {dst:#x} is not allocated")));
        }
        // SAFETY: checked above: dst..dst + len lies in a live allocation of this runtime.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) };
        Ok(())
    }
    fn copy_to_host_sync(&self, _dst: &mut [u8], _src: DevicePtr) -> Result<(), DeviceError> {
        unsupported()
    }
    fn copy_async(&self, _d: DevicePtr, _s: DevicePtr, _b: usize, _st: Stream) -> Result<(), DeviceError> {
        unsupported()
    }
    fn memset_async(&self, _d: DevicePtr, _v: u8, _b: usize, _st: Stream) -> Result<(), DeviceError> {
        unsupported()
    }
    fn compile(
        &self,
        _source: &str,
        name: &str,
        arch: &str,
        options: &[String],
        _headers: &[(&str, &str)],
    ) -> Result<Vec<u8>, DeviceError> {
        self.compiles.fetch_add(1, Ordering::SeqCst);
        if self.kernels {
            return Ok(Vec::new());
        }
        Err(DeviceError::Compile {
            name: name.into(),
            arch: arch.into(),
            options: options.join(" "),
            log: COMPILE_LOG.into(),
        })
    }
    fn compiler_version(&self) -> Result<String, DeviceError> {
        Ok(if self.kernels { "fake compiler (empty images)" } else { "fake compiler (always fails)" }.into())
    }
    fn disk_cache(&self) -> bool {
        false
    }
    fn load_module(&self, _image: &[u8]) -> Result<Module, DeviceError> {
        if self.kernels {
            Ok(Module(1))
        } else {
            unsupported()
        }
    }
    fn get_function(&self, _m: Module, name: &str) -> Result<Function, DeviceError> {
        if !self.kernels {
            return unsupported();
        }
        let mut functions = self.functions.lock().unwrap_or_else(|e| e.into_inner());
        functions.push(name.to_string());
        Ok(Function(functions.len() as u64))
    }
    unsafe fn launch(
        &self,
        f: Function,
        g: [u32; 3],
        _b: [u32; 3],
        _s: u32,
        st: Stream,
        _p: &mut [*mut c_void],
        _o: LaunchOrder,
    ) -> Result<(), DeviceError> {
        if self.kernels && self.quiet.load(Ordering::Relaxed) {
            return Ok(());
        }
        let name = {
            let functions = self.functions.lock().unwrap_or_else(|e| e.into_inner());
            functions
                .get((f.0 as usize).wrapping_sub(1))
                .cloned()
                .unwrap_or_else(|| format!("function {}", f.0))
        };
        let failing = self.fail_launches_of.lock().unwrap_or_else(|e| e.into_inner());
        if failing.as_ref().is_some_and(|part| name.contains(part.as_str())) {
            return Err(DeviceError::Unsupported(format!("launch of {name} refused (fake)")));
        }
        drop(failing);
        self.note(format!("launch {name} {}x{}x{} on {}", g[0], g[1], g[2], st.0))
    }
    fn is_capturing(&self, _s: Stream) -> Result<bool, DeviceError> {
        Ok(false)
    }
    fn synchronize(&self, s: Stream) -> Result<(), DeviceError> {
        self.note(format!("synchronize {}", s.0))
    }
    fn create_side_stream(&self) -> Result<Stream, DeviceError> {
        if self.kernels {
            Ok(SIDE_STREAM)
        } else {
            unsupported()
        }
    }
    fn create_event(&self) -> Result<Event, DeviceError> {
        if self.kernels {
            Ok(Event(self.events.fetch_add(1, Ordering::SeqCst) + 1))
        } else {
            unsupported()
        }
    }
    fn record_event(&self, e: Event, s: Stream) -> Result<(), DeviceError> {
        if self.kernels && self.quiet.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.note(format!("record {} on {}", e.0, s.0))
    }
    fn wait_event(&self, s: Stream, e: Event) -> Result<(), DeviceError> {
        if self.kernels && self.quiet.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.note(format!("{} waits {}", s.0, e.0))
    }
    fn event_done(&self, _e: Event) -> Result<bool, DeviceError> {
        if self.kernels {
            Ok(self.events_done.load(Ordering::SeqCst))
        } else {
            unsupported()
        }
    }
    fn elapsed_ms(&self, _a: Event, _b: Event) -> Result<f32, DeviceError> {
        unsupported()
    }
}
