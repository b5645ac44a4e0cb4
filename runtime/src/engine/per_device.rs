//! One GPU backend per device of the process (tensor-parallel engines drive several GPUs
//! from one process, often one thread per GPU).
//!
//! A GPU backend's kernels, pool, ring and side stream belong to the device that was current
//! when it started. [`PerDevice`] routes every call to the backend of the calling thread's
//! current device and starts that backend on the device's first call, in the caller's own
//! context (never a new one). A first call that arrives while its stream captures a graph
//! cannot set up (set-up allocates): it passes through, counted, and a later call sets up. A
//! device whose backend cannot start passes its calls through with the reason, counted.

use super::backend::{Backend, CheckRequest, InjectRequest, Injected, Polled, PreCall};
use crate::intercept::Skip;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};

/// What [`PerDevice`] needs from the vendor runtime, apart from starting backends.
pub trait DeviceProbe: Send + Sync {
    /// Ordinal of the calling thread's current device.
    fn current_ordinal(&self) -> Result<i32, String>;
    /// Whether `stream` is capturing (on the current device).
    fn is_capturing(&self, stream: u64) -> bool;
    /// Whether `device`'s primary context exists now (None: unknown). Read-only.
    fn primary_context_active(&self, _device: i32) -> Option<bool> {
        None
    }
}

type Starter<B> = Box<dyn Fn(i32) -> Result<B, String> + Send + Sync>;

pub struct PerDevice<B: Backend> {
    name: &'static str,
    probe: Box<dyn DeviceProbe>,
    start: Starter<B>,
    devices: RwLock<HashMap<i32, Arc<B>>>,
    /// Devices whose backend failed to start, with the reason (not retried: the same error
    /// would come back at every call).
    failed: Mutex<HashMap<i32, String>>,
    /// Devices whose backend one thread is starting now. Starting allocates the pool, loads
    /// kernels and spawns a thread: no lock is held meanwhile, so the other devices' calls
    /// and the poller go on, and this device's other threads pass through (counted) instead
    /// of waiting.
    starting: Mutex<HashSet<i32>>,
    /// (name, arch) of the first device started, for the session record.
    first_device: Mutex<Option<(String, String)>>,
    /// Backends of devices the host reset (`cudaDeviceReset`): their context, memory and
    /// handles are gone, so they are never used again and never dropped (a drop would hand the
    /// driver handles of the destroyed context). The device's next call starts a new one.
    reset: Mutex<Vec<(i32, Arc<B>)>>,
    /// (context, backend) retired by the latest context destroys, until the destroy returns:
    /// one that fails gives back exactly these (a handle value may be reused, and an older
    /// backend of the same value is dead for good). Bounded; oldest first.
    destroying: Mutex<std::collections::VecDeque<(u64, usize)>>,
}

/// Context destroys remembered until their result ([`PerDevice::destroying`]).
const DESTROYS_REMEMBERED: usize = 16;

/// Resets of one device after which its backend is started again; past it the device's calls
/// pass through (each reset leaves its old backend's host memory behind).
const RESETS_MAX: usize = 16;
/// The start of the reason a device reset [`RESETS_MAX`] times gives.
const RESET_TOO_OFTEN: &str = "reset";

impl<B: Backend + 'static> PerDevice<B> {
    /// Starts the backend of the calling thread's current device now (so that a process whose
    /// GPU cannot be used learns it at start, as with a single backend) and the others on
    /// their first calls.
    pub fn start(name: &'static str, probe: Box<dyn DeviceProbe>, start: Starter<B>) -> Result<Self, String> {
        let ordinal = probe.current_ordinal()?;
        let first = start(ordinal)?;
        let per = PerDevice {
            name,
            probe,
            start,
            devices: RwLock::new(HashMap::new()),
            failed: Mutex::new(HashMap::new()),
            starting: Mutex::new(HashSet::new()),
            first_device: Mutex::new(Some(first.device())),
            reset: Mutex::new(Vec::new()),
            destroying: Mutex::default(),
        };
        per.devices.write().unwrap_or_else(|e| e.into_inner()).insert(ordinal, Arc::new(first));
        Ok(per)
    }

    /// Retires `ordinal`'s backend (its context is going away): never used or dropped again,
    /// still polled; the device's next call starts a new one, up to [`RESETS_MAX`] times.
    /// Returns whether there was one.
    fn retire(&self, ordinal: i32, why: &str) -> bool {
        let Some(old) = self.devices.write().unwrap_or_else(|e| e.into_inner()).remove(&ordinal) else {
            return false;
        };
        let mut reset = self.reset.lock().unwrap_or_else(|e| e.into_inner());
        reset.push((ordinal, old));
        if reset.iter().filter(|(o, _)| *o == ordinal).count() >= RESETS_MAX {
            let why = format!("{RESET_TOO_OFTEN} {RESETS_MAX} times: not started again");
            self.failed.lock().unwrap_or_else(|e| e.into_inner()).insert(ordinal, why);
        }
        super::log::info(&format!("{} backend of device {ordinal} retired: {why}", self.name));
        true
    }

    /// The host's destroy or reset that retired backends failed: each retired one that
    /// `matches` serves its device again, newest first, unless the device started a new one
    /// meanwhile (which stays; the old one stays retired). Without this a failed destroy would
    /// leave the old backend's pool allocated in a live context and start another beside it.
    fn unretire(&self, matches: impl Fn(i32, &B) -> bool) {
        let mut reset = self.reset.lock().unwrap_or_else(|e| e.into_inner());
        let mut devices = self.devices.write().unwrap_or_else(|e| e.into_inner());
        let mut i = reset.len();
        while i > 0 {
            i -= 1;
            let (ordinal, ref b) = reset[i];
            if !matches(ordinal, b) || devices.contains_key(&ordinal) {
                continue;
            }
            let (ordinal, b) = reset.remove(i);
            devices.insert(ordinal, b);
            if reset.iter().filter(|(o, _)| *o == ordinal).count() < RESETS_MAX {
                let mut failed = self.failed.lock().unwrap_or_else(|e| e.into_inner());
                if failed.get(&ordinal).is_some_and(|why| why.starts_with(RESET_TOO_OFTEN)) {
                    failed.remove(&ordinal);
                }
            }
            super::log::info(&format!("{} backend of device {ordinal} serves again", self.name));
        }
    }

    /// Devices with a running backend.
    pub fn started(&self) -> Vec<i32> {
        let mut v: Vec<i32> =
            self.devices.read().unwrap_or_else(|e| e.into_inner()).keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// The calling thread's device's backend, started here on the device's first call.
    fn current(&self, stream: u64) -> Result<Arc<B>, Skip> {
        let ordinal = self.probe.current_ordinal().map_err(|e| Skip::new(format!("current device: {e}")))?;
        if let Some(b) = self.devices.read().unwrap_or_else(|e| e.into_inner()).get(&ordinal) {
            return Ok(b.clone());
        }
        if let Some(reason) = self.failed.lock().unwrap_or_else(|e| e.into_inner()).get(&ordinal) {
            return Err(Skip::new(format!("no backend on this device: {reason}")));
        }
        if stream != 0 && self.probe.is_capturing(stream) {
            return Err(Skip::new("graph capture: device not set up before the capture"));
        }
        {
            let mut starting = self.starting.lock().unwrap_or_else(|e| e.into_inner());
            // Another thread of this device may have finished (or failed) meanwhile.
            if let Some(b) = self.devices.read().unwrap_or_else(|e| e.into_inner()).get(&ordinal) {
                return Ok(b.clone());
            }
            if let Some(reason) = self.failed.lock().unwrap_or_else(|e| e.into_inner()).get(&ordinal) {
                return Err(Skip::new(format!("no backend on this device: {reason}")));
            }
            if !starting.insert(ordinal) {
                return Err(Skip::new("device set-up: another thread is starting this device's backend"));
            }
        }
        // The marker goes when this scope ends, a panic in the start included: the backend (or
        // the failure) is in place by then, so a thread that finds neither and no marker may
        // start it again, never two at once.
        struct Starting<'a>(&'a Mutex<HashSet<i32>>, i32);
        impl Drop for Starting<'_> {
            fn drop(&mut self) {
                self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.1);
            }
        }
        let _marker = Starting(&self.starting, ordinal);
        match (self.start)(ordinal) {
            Ok(b) => {
                super::log::info(&format!("{} backend started on device {ordinal}", self.name));
                let b = Arc::new(b);
                self.devices.write().unwrap_or_else(|e| e.into_inner()).insert(ordinal, b.clone());
                Ok(b)
            }
            Err(e) => {
                super::log::warn(&format!("no {} backend on device {ordinal}: {e}", self.name));
                self.failed.lock().unwrap_or_else(|p| p.into_inner()).insert(ordinal, e.clone());
                Err(Skip::new(format!("no backend on this device: {e}")))
            }
        }
    }

    fn all(&self) -> Vec<Arc<B>> {
        let devices = self.devices.read().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<(i32, Arc<B>)> = devices.iter().map(|(o, b)| (*o, b.clone())).collect();
        v.sort_by_key(|(o, _)| *o);
        v.into_iter().map(|(_, b)| b).collect()
    }
}

impl<B: Backend + 'static> Backend for PerDevice<B> {
    fn name(&self) -> &'static str {
        self.name
    }

    fn device(&self) -> (String, String) {
        self.first_device.lock().unwrap_or_else(|e| e.into_inner()).clone().unwrap_or_default()
    }

    fn before_call(&self, request: &CheckRequest) -> Result<PreCall, Skip> {
        self.current(request.call.stream)?.before_call(request)
    }

    fn after_call(&self, request: &CheckRequest, pre: PreCall) -> Result<(), Skip> {
        self.current(request.call.stream)?.after_call(request, pre)
    }

    fn poll(&self, out: &mut Vec<Polled>) {
        for b in self.all() {
            b.poll(out);
        }
        // Checks a reset device finished before its reset are in its ring (host pages): a
        // backend's poll makes no driver call.
        let reset: Vec<Arc<B>> =
            self.reset.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|(_, b)| b.clone()).collect();
        for b in reset {
            b.poll(out);
        }
    }

    fn is_capturing(&self, stream: u64) -> bool {
        self.probe.is_capturing(stream)
    }

    fn capture_ending(&self, stream: u64) -> Option<(u64, u64)> {
        // Only a started backend can have deferred anything: never start one here.
        let ordinal = self.probe.current_ordinal().ok()?;
        let backend = self.devices.read().unwrap_or_else(|e| e.into_inner()).get(&ordinal).cloned();
        backend.and_then(|b| b.capture_ending(stream))
    }

    fn stream_destroyed(&self, stream: u64) {
        // Every device: the destroying thread's current device need not be the stream's.
        for b in self.all() {
            b.stream_destroyed(stream);
        }
    }

    fn event_recording(&self, stream: u64) {
        for b in self.all() {
            b.event_recording(stream);
        }
    }

    fn device_reset(&self, device: Option<i32>) -> bool {
        let Some(ordinal) = device.or_else(|| self.probe.current_ordinal().ok()) else {
            return false;
        };
        self.retire(ordinal, "the host reset the device")
    }

    fn context_destroyed(&self, ctx: u64) -> bool {
        let dead: Vec<i32> = self
            .devices
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(_, b)| b.context() == Some(ctx))
            .map(|(o, _)| *o)
            .collect();
        let mut retired = Vec::new();
        for &ordinal in &dead {
            let b = self
                .devices
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .get(&ordinal)
                .map(|b| Arc::as_ptr(b) as usize);
            if self.retire(ordinal, "the host destroyed its context") {
                retired.extend(b);
            }
        }
        let mut destroying = self.destroying.lock().unwrap_or_else(|e| e.into_inner());
        for b in &retired {
            if destroying.len() == DESTROYS_REMEMBERED {
                destroying.pop_front();
            }
            destroying.push_back((ctx, *b));
        }
        !retired.is_empty()
    }

    fn device_reset_failed(&self, device: Option<i32>) {
        let Some(ordinal) = device.or_else(|| self.probe.current_ordinal().ok()) else {
            return;
        };
        // The device's newest retired backend is the one the failed reset retired.
        let newest = {
            let reset = self.reset.lock().unwrap_or_else(|e| e.into_inner());
            reset.iter().rev().find(|(o, _)| *o == ordinal).map(|(_, b)| Arc::as_ptr(b))
        };
        if let Some(newest) = newest {
            self.unretire(|o, b| o == ordinal && std::ptr::eq(b, newest));
        }
    }

    fn context_destroy_returned(&self, ctx: u64, ok: bool) {
        let mine: Vec<usize> = {
            let mut destroying = self.destroying.lock().unwrap_or_else(|e| e.into_inner());
            let mine = destroying.iter().filter(|(c, _)| *c == ctx).map(|(_, b)| *b).collect();
            destroying.retain(|(c, _)| *c != ctx);
            mine
        };
        if !ok {
            self.unretire(|_, b| mine.contains(&(b as *const B as usize)));
        }
    }

    fn primary_context_released(&self, device: i32) -> bool {
        // Still held by someone else (the release only counted down): nothing is gone.
        if self.probe.primary_context_active(device) != Some(false) {
            return false;
        }
        let made_there = self
            .devices
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&device)
            .is_some_and(|b| b.in_primary_context() == Some(true));
        if made_there {
            self.retire(device, "the host released its primary context");
        }
        made_there
    }

    fn dropped(&self) -> u64 {
        let reset = self
            .reset
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(_, b)| b.dropped())
            .sum::<u64>();
        self.all().iter().map(|b| b.dropped()).sum::<u64>() + reset
    }

    fn early_launches(&self) -> u64 {
        self.all().iter().map(|b| b.early_launches()).sum()
    }

    fn inject_before(&self, request: &InjectRequest) -> Result<Injected, Skip> {
        self.current(request.call.stream)?.inject_before(request)
    }

    fn inject_after(&self, request: &InjectRequest, saved: Injected) -> Result<(), Skip> {
        self.current(request.call.stream)?.inject_after(request, saved)
    }

    fn diagnose(&self, request: &CheckRequest) -> Result<(), Skip> {
        self.current(request.call.stream)?.diagnose(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};

    /// A backend that says which device it serves through its poll results.
    struct Fake {
        ordinal: i32,
        generation: u64,
        calls: AtomicU64,
        capture_ends: AtomicU64,
    }

    impl Backend for Fake {
        fn name(&self) -> &'static str {
            "fake"
        }
        fn device(&self) -> (String, String) {
            (format!("gpu{}", self.ordinal), "sm_test".into())
        }
        fn before_call(&self, _: &CheckRequest) -> Result<PreCall, Skip> {
            Ok(PreCall::default())
        }
        fn after_call(&self, _: &CheckRequest, _: PreCall) -> Result<(), Skip> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
        fn poll(&self, out: &mut Vec<Polled>) {
            let n = self.calls.swap(0, Ordering::Relaxed);
            for _ in 0..n {
                out.push(Polled::Failed {
                    site_ordinal: self.ordinal as u32,
                    call_seq: 0,
                    reason: "served".into(),
                });
            }
        }
        fn capture_ending(&self, _: u64) -> Option<(u64, u64)> {
            self.capture_ends.fetch_add(1, Ordering::Relaxed);
            None
        }
        fn dropped(&self) -> u64 {
            self.ordinal as u64
        }
        fn in_primary_context(&self) -> Option<bool> {
            // Device 1's backends are made in a context of the host's own.
            Some(self.ordinal != 1)
        }
        fn context(&self) -> Option<u64> {
            // Each start of a device's backend in a new context (0xc0de00 + device, + 0x100
            // per start after the first).
            Some(0xc0de00 + self.ordinal as u64 + 0x100 * self.generation)
        }
    }

    struct Probe {
        current: Arc<AtomicI32>,
        capturing: Arc<AtomicBool>,
    }

    /// Devices whose primary context is gone (a bit per device).
    static PRIMARY_GONE: AtomicU64 = AtomicU64::new(0);

    impl DeviceProbe for Probe {
        fn current_ordinal(&self) -> Result<i32, String> {
            Ok(self.current.load(Ordering::Relaxed))
        }
        fn is_capturing(&self, _: u64) -> bool {
            self.capturing.load(Ordering::Relaxed)
        }
        fn primary_context_active(&self, device: i32) -> Option<bool> {
            Some(PRIMARY_GONE.load(Ordering::Relaxed) & (1 << device) == 0)
        }
    }

    fn per_device(broken: i32) -> (PerDevice<Fake>, Arc<AtomicI32>, Arc<AtomicBool>, Arc<AtomicU64>) {
        let current = Arc::new(AtomicI32::new(0));
        let capturing = Arc::new(AtomicBool::new(false));
        let starts = Arc::new(AtomicU64::new(0));
        let s = starts.clone();
        let per = PerDevice::start(
            "fake",
            Box::new(Probe { current: current.clone(), capturing: capturing.clone() }),
            Box::new(move |ordinal| {
                s.fetch_add(1, Ordering::Relaxed);
                if ordinal == broken {
                    return Err("no memory".into());
                }
                let generation = s.load(Ordering::Relaxed) - 1;
                Ok(Fake { ordinal, generation, calls: AtomicU64::new(0), capture_ends: AtomicU64::new(0) })
            }),
        )
        .unwrap();
        (per, current, capturing, starts)
    }

    fn after(per: &PerDevice<Fake>, stream: u64) -> Result<(), Skip> {
        use crate::formats::Format;
        use crate::problem::{GemmBuffers, GemmProblem};
        let call = crate::intercept::InterceptedGemm {
            entry: "cublasLtMatmul",
            problem: GemmProblem::row_major(4, 8, 16, Format::Bf16, Format::Bf16, Format::Bf16),
            buffers: GemmBuffers::default(),
            stream,
            pointer_arrays: None,
        };
        let thresholds = crate::thresholds::Thresholds::default();
        per.after_call(&CheckRequest::sketch_for_test(&call, &thresholds), PreCall::default())
    }

    fn served(per: &PerDevice<Fake>) -> Vec<u32> {
        let mut out = vec![];
        per.poll(&mut out);
        let mut v: Vec<u32> = out
            .iter()
            .map(|p| match p {
                Polled::Failed { site_ordinal, .. } => *site_ordinal,
                _ => u32::MAX,
            })
            .collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn calls_go_to_their_device_and_backends_start_on_first_use() {
        let (per, current, _, starts) = per_device(-1);
        assert_eq!(per.started(), [0]);
        after(&per, 7).unwrap();
        current.store(1, Ordering::Relaxed);
        after(&per, 7).unwrap();
        after(&per, 7).unwrap();
        assert_eq!(per.started(), [0, 1]);
        assert_eq!(starts.load(Ordering::Relaxed), 2, "each device started once");
        assert_eq!(served(&per), [0, 1, 1]);
        assert_eq!(per.dropped(), 1, "drops of every device are summed");
        assert_eq!(per.device(), ("gpu0".to_string(), "sm_test".to_string()));
    }

    #[test]
    fn a_destroyed_context_retires_the_backends_made_in_it_and_no_other() {
        let (per, current, _, starts) = per_device(-1);
        after(&per, 7).unwrap(); // device 0, context 0xc0de00
        current.store(1, Ordering::Relaxed);
        after(&per, 7).unwrap(); // device 1, context 0xc0de01 + 0x100
        assert_eq!(per.started(), [0, 1]);
        let ctx1 = per.all()[1].context().unwrap();
        // A context no backend was made in: nothing happens.
        assert!(!per.context_destroyed(0xdead));
        assert_eq!(per.started(), [0, 1]);
        assert!(per.context_destroyed(ctx1));
        assert_eq!(per.started(), [0], "device 1's backend retired");
        let n = starts.load(Ordering::Relaxed);
        after(&per, 7).unwrap();
        assert_eq!(starts.load(Ordering::Relaxed), n + 1, "device 1 starts again in its new context");
        assert_ne!(per.all()[1].context(), Some(ctx1));
        // Destroying the old context again (a recycled handle) leaves the new backend alone.
        per.context_destroyed(ctx1);
        assert_eq!(per.started(), [0, 1]);
    }

    #[test]
    fn a_failed_destroy_or_reset_leaves_the_backend_serving() {
        let (per, current, _, starts) = per_device(-1);
        after(&per, 7).unwrap();
        current.store(1, Ordering::Relaxed);
        after(&per, 7).unwrap();
        let (first0, first1) = (per.all()[0].clone(), per.all()[1].clone());
        let ctx1 = first1.context().unwrap();
        // The destroy of device 1's context fails: the same backend serves on, none starts.
        assert!(per.context_destroyed(ctx1));
        per.context_destroy_returned(ctx1, false);
        assert_eq!(per.started(), [0, 1]);
        assert!(Arc::ptr_eq(&per.all()[1], &first1));
        let n = starts.load(Ordering::Relaxed);
        after(&per, 7).unwrap();
        assert_eq!(starts.load(Ordering::Relaxed), n, "no second backend in the live context");
        assert_eq!(first1.calls.load(Ordering::Relaxed), 2);
        // A device reset that fails: likewise.
        assert!(per.device_reset(Some(0)));
        per.device_reset_failed(Some(0));
        assert!(Arc::ptr_eq(&per.all()[0], &first0));
        // Nothing retired, nothing to give back: a reset of a device never started, and a
        // failed destroy of a context no backend was made in.
        assert!(!per.device_reset(Some(5)));
        per.context_destroy_returned(0xdead, false);
        assert_eq!(per.started(), [0, 1]);
        // A backend started for the device while the destroy ran stays; the old one stays
        // retired (never two serving one device).
        assert!(per.context_destroyed(ctx1));
        after(&per, 7).unwrap();
        let second1 = per.all()[1].clone();
        assert!(!Arc::ptr_eq(&second1, &first1));
        per.context_destroy_returned(ctx1, false);
        assert!(Arc::ptr_eq(&per.all()[1], &second1));
        // A destroy that succeeded: its backend is dead for good, even when a later destroy of
        // the same handle value (reused) fails.
        let ctx2 = second1.context().unwrap();
        assert!(per.context_destroyed(ctx2));
        per.context_destroy_returned(ctx2, true);
        per.context_destroy_returned(ctx2, false);
        assert_eq!(per.started(), [0], "device 1's dead backend stays retired");
        // A device reset too often is not started again; if its last reset failed, that
        // reset's backend serves again.
        current.store(0, Ordering::Relaxed);
        for _ in 1..RESETS_MAX {
            per.device_reset(Some(0));
            let _ = after(&per, 7);
        }
        assert!(per.device_reset(Some(0)));
        assert!(after(&per, 7).unwrap_err().0.contains("reset"));
        let n = starts.load(Ordering::Relaxed);
        per.device_reset_failed(Some(0));
        after(&per, 7).unwrap();
        assert_eq!(starts.load(Ordering::Relaxed), n, "its last backend serves again");
    }

    #[test]
    fn a_released_primary_context_retires_its_backend_only_once_it_is_gone() {
        let (per, current, _, starts) = per_device(-1);
        for device in [0, 1, 2] {
            current.store(device, Ordering::Relaxed);
            after(&per, 7).unwrap();
        }
        assert_eq!(per.started(), [0, 1, 2]);
        // A release that only counted down (the context is still active): nothing happens.
        assert!(!per.primary_context_released(0));
        assert_eq!(per.started(), [0, 1, 2]);
        // Device 0's primary context is gone: its backend (made there) is retired and starts
        // again at the next call. Device 1's backend lives in the host's own context: kept.
        PRIMARY_GONE.fetch_or(0b011, Ordering::Relaxed);
        assert!(per.primary_context_released(0));
        assert!(!per.primary_context_released(1));
        assert_eq!(per.started(), [1, 2]);
        let n = starts.load(Ordering::Relaxed);
        current.store(0, Ordering::Relaxed);
        after(&per, 7).unwrap();
        assert_eq!(starts.load(Ordering::Relaxed), n + 1);
        assert_eq!(per.started(), [0, 1, 2]);
    }

    #[test]
    fn a_reset_device_gets_a_new_backend_and_the_old_one_is_never_used_or_dropped() {
        let (per, current, _, starts) = per_device(-1);
        after(&per, 7).unwrap();
        let old = per.all()[0].clone();
        per.device_reset(Some(0));
        assert!(per.started().is_empty());
        after(&per, 7).unwrap();
        assert_eq!(starts.load(Ordering::Relaxed), 2, "device 0 started again after its reset");
        let new = per.all()[0].clone();
        assert!(!Arc::ptr_eq(&old, &new));
        assert_eq!(old.calls.load(Ordering::Relaxed), 1, "the reset backend gets no call");
        assert_eq!(Arc::strong_count(&old), 2, "kept (never dropped) by the per-device set");
        old.calls.store(1, Ordering::Relaxed); // a result it finished before the reset
        assert_eq!(served(&per), [0, 0], "still read");
        // Of the current device (hipDeviceReset), and a device never started: nothing starts.
        current.store(1, Ordering::Relaxed);
        per.device_reset(None);
        per.device_reset(Some(5));
        assert_eq!(per.started(), [0]);
        // A device reset again and again stops being restarted.
        current.store(0, Ordering::Relaxed);
        for _ in 1..RESETS_MAX {
            per.device_reset(Some(0));
            let _ = after(&per, 7);
        }
        let skip = after(&per, 7).unwrap_err();
        assert!(skip.0.contains("reset"), "{}", skip.0);
    }

    #[test]
    fn a_capture_end_reaches_the_current_device_and_never_starts_one() {
        let (per, current, _, starts) = per_device(-1);
        per.capture_ending(5);
        current.store(3, Ordering::Relaxed);
        per.capture_ending(5);
        assert_eq!(per.started(), [0], "device 3 has deferred nothing: not started for it");
        assert_eq!(starts.load(Ordering::Relaxed), 1);
        let ends = per.all().iter().map(|b| b.capture_ends.load(Ordering::Relaxed)).collect::<Vec<_>>();
        assert_eq!(ends, [1], "device 0's backend saw its capture end once");
    }

    #[test]
    fn a_device_seen_first_inside_a_capture_waits_for_a_later_call() {
        let (per, current, capturing, starts) = per_device(-1);
        current.store(2, Ordering::Relaxed);
        capturing.store(true, Ordering::Relaxed);
        let skip = after(&per, 9).unwrap_err();
        assert!(skip.0.contains("graph capture"), "{}", skip.0);
        assert_eq!(per.started(), [0]);
        capturing.store(false, Ordering::Relaxed);
        after(&per, 9).unwrap();
        assert_eq!(per.started(), [0, 2]);
        assert_eq!(starts.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn a_device_that_cannot_start_passes_through_without_retrying() {
        let (per, current, _, starts) = per_device(3);
        current.store(3, Ordering::Relaxed);
        for _ in 0..3 {
            let skip = after(&per, 5).unwrap_err();
            assert!(skip.0.contains("no memory"), "{}", skip.0);
        }
        assert_eq!(starts.load(Ordering::Relaxed), 2, "one failed start, not one per call");
        current.store(0, Ordering::Relaxed);
        after(&per, 5).unwrap();
        assert_eq!(served(&per), [0]);
    }

    #[test]
    fn threads_of_several_devices_share_it() {
        let (per, current, _, _) = per_device(-1);
        let per = Arc::new(per);
        // The probe's "current device" is process-wide in this fake: take turns per device.
        for ordinal in 0..4 {
            current.store(ordinal, Ordering::Relaxed);
            let skipped = Arc::new(AtomicU64::new(0));
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    let (per, skipped) = (per.clone(), skipped.clone());
                    std::thread::spawn(move || {
                        for _ in 0..25 {
                            // A call while another thread starts the device passes through.
                            if let Err(s) = after(&per, 11) {
                                assert!(s.0.contains("another thread is starting"), "{}", s.0);
                                skipped.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    })
                })
                .collect();
            for h in handles {
                h.join().unwrap();
            }
            let got = served(&per);
            assert_eq!(got.len() as u64 + skipped.load(Ordering::Relaxed), 100, "device {ordinal}");
            assert!(got.iter().all(|&o| o == ordinal as u32));
        }
        assert_eq!(per.started(), [0, 1, 2, 3]);
    }

    #[test]
    fn a_slow_start_blocks_neither_the_device_s_other_threads_nor_other_devices() {
        // Device 1's backend start waits until the test lets it finish. Meanwhile another call
        // of device 1 passes through at once, and the poller (every device) is served.
        let (entered_tx, entered_rx) = std::sync::mpsc::channel::<()>();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let (entered_tx, release_rx) = (Mutex::new(entered_tx), Mutex::new(release_rx));
        let current = Arc::new(AtomicI32::new(0));
        let per = Arc::new(
            PerDevice::start(
                "fake",
                Box::new(Probe { current: current.clone(), capturing: Arc::new(AtomicBool::new(false)) }),
                Box::new(move |ordinal| {
                    if ordinal == 1 {
                        entered_tx.lock().unwrap().send(()).unwrap();
                        release_rx.lock().unwrap().recv().unwrap();
                    }
                    Ok(Fake {
                        ordinal,
                        generation: 0,
                        calls: AtomicU64::new(0),
                        capture_ends: AtomicU64::new(0),
                    })
                }),
            )
            .unwrap(),
        );
        current.store(1, Ordering::Relaxed);
        let starter = {
            let per = per.clone();
            std::thread::spawn(move || after(&per, 3))
        };
        entered_rx.recv().unwrap(); // the start is running
        let skip = after(&per, 3).unwrap_err();
        assert!(skip.0.contains("another thread is starting"), "{}", skip.0);
        let mut out = vec![];
        per.poll(&mut out);
        assert!(!starter.is_finished());
        release_tx.send(()).unwrap();
        starter.join().unwrap().unwrap();
        assert_eq!(per.started(), [0, 1]);
        after(&per, 3).unwrap();
    }

    #[test]
    fn a_start_that_panics_leaves_the_device_startable() {
        let current = Arc::new(AtomicI32::new(1));
        let tries = Arc::new(AtomicU64::new(0));
        let t = tries.clone();
        let per = PerDevice::start(
            "fake",
            Box::new(Probe { current: current.clone(), capturing: Arc::new(AtomicBool::new(false)) }),
            Box::new(move |ordinal| {
                if ordinal == 2 && t.fetch_add(1, Ordering::Relaxed) == 0 {
                    panic!("first start of device 2");
                }
                Ok(Fake { ordinal, generation: 0, calls: AtomicU64::new(0), capture_ends: AtomicU64::new(0) })
            }),
        )
        .unwrap();
        current.store(2, Ordering::Relaxed);
        assert!(std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| after(&per, 3))).is_err());
        after(&per, 3).unwrap();
        assert_eq!(per.started(), [1, 2]);
    }
}
