//! A [`GpuRuntime`] over host memory, for tests of the layers above the vendor runtimes (the
//! device pool, the GPU backend's bookkeeping) on machines without a GPU. It counts the calls
//! those tests assert on; by default its compiler always fails (a test of a working kernel needs
//! a GPU) and every other operation is `Unsupported`. [`FakeRuntime::with_kernels`] makes
//! programs load and launches, event records and stream waits succeed without running anything,
//! and logs them in order: for tests of which work the backend enqueues where. Not used by the
//! product.
//!
//! Stream capture is opt-in ([`FakeRuntime::begin_capture`]): while a stream captures, its
//! work becomes nodes of a graph the tests read back ([`CapturedGraph`]), with the driver's
//! rules where the engine's capture paths rely on them (see [`FakeRuntime::begin_capture`]).

use super::{
    DeviceError, DeviceInfo, DevicePtr, Event, Function, GpuRuntime, GraphNode, LaunchOrder, MappedHost,
    Module, Stream, Vendor,
};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
    /// What `current_context` answers (0: None, the default).
    pub context: AtomicU64,
    /// (name part, bytes): launches of functions whose name contains the part record the first
    /// `bytes` bytes of their single by-value parameter in `params`. The test setting it must
    /// name kernels whose parameter is at least that large.
    pub record_params: Mutex<Option<(String, usize)>>,
    /// What `record_params` recorded: (function name, stream, bytes), in launch order.
    pub params: Mutex<Vec<(String, u64, Vec<u8>)>>,
    /// Set by the first `begin_capture`: until then stream work takes no capture lock.
    captures_begun: AtomicBool,
    captures: Mutex<Captures>,
}

/// Stream captures begun so far and the streams capturing now.
#[derive(Default)]
struct Captures {
    /// Every capture's graph, by order of `begin_capture` (a graph outlives its capture).
    graphs: Vec<CapturedGraph>,
    /// Streams capturing now: index into `graphs` and the stream's capture dependencies.
    streams: HashMap<u64, (usize, Vec<GraphNode>)>,
    /// Events last recorded on a capturing stream: index into `graphs` and the dependencies
    /// recorded (the driver adds no node for them).
    events: HashMap<u64, (usize, Vec<GraphNode>)>,
    nodes_made: u64,
}

/// The graph of one capture, as the driver has recorded it so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapturedGraph {
    pub capture: u64,
    pub graph: u64,
    /// The stream `begin_capture` was given: only it can end the capture.
    pub origin: Stream,
    pub active: bool,
    /// In the order they were added.
    pub nodes: Vec<CapturedNode>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapturedNode {
    pub node: GraphNode,
    /// A kernel node's function name.
    pub label: String,
    /// Its incoming edges.
    pub deps: Vec<GraphNode>,
}

/// Capture ids, graph handles and nodes count from these (recognisable in failures, never 0).
const FIRST_CAPTURE: u64 = 0xc0;
const FIRST_GRAPH: u64 = 0x6a0000;
const FIRST_NODE: u64 = 0x90000;

impl CapturedGraph {
    fn node(&self, n: GraphNode) -> Option<&CapturedNode> {
        self.nodes.iter().find(|c| c.node == n)
    }

    /// The nodes whose label contains `part`, in the order they were added.
    pub fn labelled(&self, part: &str) -> Vec<GraphNode> {
        self.nodes.iter().filter(|c| c.label.contains(part)).map(|c| c.node).collect()
    }

    /// The incoming edges of `n`.
    pub fn deps(&self, n: GraphNode) -> Vec<GraphNode> {
        self.node(n).map(|c| c.deps.clone()).unwrap_or_default()
    }

    /// The nodes with an edge from `n`.
    pub fn dependents(&self, n: GraphNode) -> Vec<GraphNode> {
        self.nodes.iter().filter(|c| c.deps.contains(&n)).map(|c| c.node).collect()
    }

    /// Whether `n` runs after `on` at every replay: a path of edges leads from `on` to `n`.
    pub fn depends_on(&self, n: GraphNode, on: GraphNode) -> bool {
        let mut seen = vec![n];
        let mut todo = vec![n];
        while let Some(x) = todo.pop() {
            for d in self.deps(x) {
                if d == on {
                    return true;
                }
                if !seen.contains(&d) {
                    seen.push(d);
                    todo.push(d);
                }
            }
        }
        false
    }
}

/// CUresult values of the driver's refusals the fake models.
const INVALID_VALUE: i32 = 1;
const STREAM_CAPTURE_UNSUPPORTED: i32 = 900;
const STREAM_CAPTURE_ISOLATION: i32 = 904;

fn refused(call: &'static str, code: i32, why: String) -> DeviceError {
    DeviceError::Call { call, code, message: format!("fake: {why}") }
}

impl Captures {
    /// Adds a node after `deps` to graph `g`, refused as the driver refuses an invalid
    /// dependency set: a node listed twice, or one of another graph.
    fn add_node(
        &mut self,
        g: usize,
        label: &str,
        deps: Vec<GraphNode>,
        call: &'static str,
    ) -> Result<GraphNode, DeviceError> {
        let graph = &self.graphs[g];
        for (k, d) in deps.iter().enumerate() {
            if deps[..k].contains(d) {
                return Err(refused(call, INVALID_VALUE, format!("dependency {:#x} listed twice", d.0)));
            }
            if graph.node(*d).is_none() {
                return Err(refused(
                    call,
                    INVALID_VALUE,
                    format!("{:#x} is no node of graph {:#x}", d.0, graph.graph),
                ));
            }
        }
        self.nodes_made += 1;
        let node = GraphNode(FIRST_NODE + self.nodes_made);
        self.graphs[g].nodes.push(CapturedNode { node, label: label.to_string(), deps });
        Ok(node)
    }

    /// An edge `from` -> `to` in graph `g`. The driver refuses an edge that exists already and
    /// a node of another graph; an edge that closes a cycle is refused here too (the driver
    /// accepts it and fails only at instantiation, which the fake does not model).
    fn add_edge(&mut self, g: usize, from: GraphNode, to: GraphNode) -> Result<(), DeviceError> {
        const CALL: &str = "cuGraphAddDependencies_v2";
        let graph = &self.graphs[g];
        if graph.node(from).is_none() || graph.node(to).is_none() {
            return Err(refused(
                CALL,
                INVALID_VALUE,
                format!("edge {:#x} -> {:#x} leaves the graph", from.0, to.0),
            ));
        }
        if graph.deps(to).contains(&from) {
            return Err(refused(CALL, INVALID_VALUE, format!("edge {:#x} -> {:#x} exists", from.0, to.0)));
        }
        if from == to || graph.depends_on(from, to) {
            return Err(refused(
                CALL,
                INVALID_VALUE,
                format!("edge {:#x} -> {:#x} closes a cycle", from.0, to.0),
            ));
        }
        let node = self.graphs[g].nodes.iter_mut().find(|n| n.node == to).expect("checked above");
        node.deps.push(from);
        Ok(())
    }
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

    /// Starts capturing `stream` into a new graph; returns the capture id. From here, as the
    /// CUDA driver does (under [`FakeRuntime::with_kernels`]; otherwise launches stay
    /// `Unsupported`):
    /// - a launch on the stream adds a kernel node after the stream's capture dependencies,
    ///   which become that node alone (the launch is logged as outside a capture);
    /// - an event recorded on it keeps those dependencies and adds no node; a stream that then
    ///   waits for the event joins the capture with them (or, capturing it already, adds them
    ///   to its own); a wait across a capture's boundary is refused;
    /// - graph branches and joins work (`launch_graph_branch`, `launch_graph_branch_from`,
    ///   `join_graph_branch`, as `CudaRuntime` makes them of the driver's calls); a dependency
    ///   listed twice, an edge added twice and a node of another graph are refused, as by the
    ///   driver, and so is an edge that closes a cycle;
    /// - synchronising a capturing stream is refused.
    ///
    /// Not modelled: capture modes, invalidation, and the driver's refusal to end a capture
    /// that other streams joined but never joined back.
    ///
    /// # Panics
    /// When `stream` captures already.
    pub fn begin_capture(&self, stream: Stream) -> u64 {
        let mut c = self.captures();
        assert!(!c.streams.contains_key(&stream.0), "fake: stream {} captures already", stream.0);
        let n = c.graphs.len() as u64;
        let capture = FIRST_CAPTURE + n;
        c.graphs.push(CapturedGraph {
            capture,
            graph: FIRST_GRAPH + n,
            origin: stream,
            active: true,
            nodes: Vec::new(),
        });
        let g = c.graphs.len() - 1;
        c.streams.insert(stream.0, (g, Vec::new()));
        self.captures_begun.store(true, Ordering::Release);
        capture
    }

    /// Ends the capture that `stream` began (every stream that joined it stops capturing), as
    /// `cuStreamEndCapture` does, without telling the engine (the shim's hook does that
    /// first: `Backend::capture_ending`). Returns its graph.
    ///
    /// # Panics
    /// When `stream` began no capture in progress.
    pub fn end_capture(&self, stream: Stream) -> CapturedGraph {
        let mut c = self.captures();
        let g = match c.streams.get(&stream.0) {
            Some(&(g, _)) if c.graphs[g].origin == stream => g,
            _ => panic!("fake: stream {} began no capture in progress", stream.0),
        };
        c.streams.retain(|_, (of, _)| *of != g);
        c.events.retain(|_, (of, _)| *of != g);
        c.graphs[g].active = false;
        c.graphs[g].clone()
    }

    /// The graph of `capture` as recorded so far (during the capture or after it).
    pub fn captured_graph(&self, capture: u64) -> Option<CapturedGraph> {
        self.captures().graphs.iter().find(|g| g.capture == capture).cloned()
    }

    fn captures(&self) -> std::sync::MutexGuard<'_, Captures> {
        self.captures.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn capturing(&self, stream: Stream) -> bool {
        self.capture_of(stream).is_some()
    }

    /// (graph index, capture dependencies) of the capture `stream` takes part in; no lock
    /// before the first `begin_capture`.
    fn capture_of(&self, stream: Stream) -> Option<(usize, Vec<GraphNode>)> {
        if !self.captures_begun.load(Ordering::Acquire) {
            return None;
        }
        self.captures().streams.get(&stream.0).cloned()
    }

    fn function_name(&self, f: Function) -> String {
        let functions = self.functions.lock().unwrap_or_else(|e| e.into_inner());
        functions.get((f.0 as usize).wrapping_sub(1)).cloned().unwrap_or_else(|| format!("function {}", f.0))
    }

    /// Refuses a launch of a function `fail_launches_of` names.
    fn refuse_failing(&self, name: &str) -> Result<(), DeviceError> {
        let failing = self.fail_launches_of.lock().unwrap_or_else(|e| e.into_inner());
        if failing.as_ref().is_some_and(|part| name.contains(part.as_str())) {
            return Err(DeviceError::Unsupported(format!("launch of {name} refused (fake)")));
        }
        Ok(())
    }

    /// A kernel node of the graph `stream` captures into, after `deps` (None: the stream's
    /// capture dependencies, and `after`); the stream's dependencies are left as they are.
    fn add_branch(
        &self,
        f: Function,
        stream: Stream,
        deps: Option<&[GraphNode]>,
        after: Option<GraphNode>,
    ) -> Result<GraphNode, DeviceError> {
        if !self.kernels {
            return unsupported();
        }
        let name = self.function_name(f);
        self.refuse_failing(&name)?;
        let mut c = self.captures();
        let Some((g, frontier)) = c.streams.get(&stream.0).cloned() else {
            return Err(DeviceError::Unsupported("fake: no capture in progress".into()));
        };
        let deps = match deps {
            Some(exactly) => exactly.to_vec(),
            // As CudaRuntime: `after` once, though the frontier may hold it already.
            None => frontier.into_iter().chain(after).fold(Vec::new(), |mut all, n| {
                if !all.contains(&n) {
                    all.push(n);
                }
                all
            }),
        };
        c.add_node(g, &name, deps, "cuGraphAddKernelNode_v2")
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
        p: &mut [*mut c_void],
        _o: LaunchOrder,
    ) -> Result<(), DeviceError> {
        let capturing = self.capturing(st);
        if self.kernels && self.quiet.load(Ordering::Relaxed) && !capturing {
            return Ok(());
        }
        let name = self.function_name(f);
        self.refuse_failing(&name)?;
        if !self.kernels {
            return unsupported();
        }
        let wanted = self.record_params.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some((_, bytes)) = wanted.filter(|(part, _)| name.contains(part.as_str())) {
            if let [param] = p {
                // SAFETY: the caller's parameter pointer is valid for the launch, and the test that
                // asked for `bytes` names only kernels whose parameter is that large (field doc).
                let raw = unsafe { std::slice::from_raw_parts(*param as *const u8, bytes) }.to_vec();
                self.params.lock().unwrap_or_else(|e| e.into_inner()).push((name.clone(), st.0, raw));
            }
        }
        if capturing {
            let mut c = self.captures();
            if let Some((graph, frontier)) = c.streams.get(&st.0).cloned() {
                let node = c.add_node(graph, &name, frontier, "cuLaunchKernel")?;
                c.streams.insert(st.0, (graph, vec![node]));
            }
            if self.quiet.load(Ordering::Relaxed) {
                return Ok(());
            }
        }
        self.note(format!("launch {name} {}x{}x{} on {}", g[0], g[1], g[2], st.0))
    }
    fn current_context(&self) -> Option<u64> {
        Some(self.context.load(Ordering::Relaxed)).filter(|&c| c != 0)
    }
    fn is_capturing(&self, s: Stream) -> Result<bool, DeviceError> {
        Ok(self.capturing(s))
    }
    fn capture_id(&self, s: Stream) -> Result<Option<u64>, DeviceError> {
        Ok(self.capture_graph(s)?.map(|(capture, _)| capture))
    }
    fn capture_graph(&self, s: Stream) -> Result<Option<(u64, u64)>, DeviceError> {
        let Some((g, _)) = self.capture_of(s) else { return Ok(None) };
        let graph = &self.captures().graphs[g];
        Ok(Some((graph.capture, graph.graph)))
    }
    fn last_captured_node(&self, s: Stream) -> Result<Option<(u64, u64, GraphNode)>, DeviceError> {
        Ok(match (self.capture_graph(s)?, self.capture_frontier(s)?) {
            (Some((capture, graph)), Some(frontier)) if frontier.len() == 1 => {
                Some((capture, graph, frontier[0]))
            }
            _ => None,
        })
    }
    fn capture_frontier(&self, s: Stream) -> Result<Option<Vec<GraphNode>>, DeviceError> {
        Ok(self.capture_of(s).map(|(_, frontier)| frontier))
    }
    fn join_graph_branch(
        &self,
        stream: Stream,
        node: GraphNode,
        from: &[GraphNode],
        into_stream: bool,
    ) -> Result<(), DeviceError> {
        let mut c = self.captures();
        let Some((g, _)) = c.streams.get(&stream.0).cloned() else {
            return Err(DeviceError::Unsupported("fake: no capture in progress".into()));
        };
        let graph = &c.graphs[g];
        if graph.node(node).is_none() {
            return Err(refused(
                "cuGraphAddDependencies_v2",
                INVALID_VALUE,
                format!("{:#x} is no node", node.0),
            ));
        }
        // As CudaRuntime: the edges `branch_join_edges` picks from the dependents the driver lists.
        let edges = super::branch_join_edges(node, from, |f| match graph.node(f) {
            Some(_) => Ok(graph.dependents(f)),
            None => Err(refused(
                "cuGraphNodeGetDependentNodes_v2",
                INVALID_VALUE,
                format!("{:#x} is no node", f.0),
            )),
        })?;
        for to in edges {
            c.add_edge(g, node, to)?;
        }
        if into_stream {
            // The driver's answer to a node that is a dependency already is not modelled: kept once.
            let deps = &mut c.streams.get_mut(&stream.0).expect("capturing").1;
            if !deps.contains(&node) {
                deps.push(node);
            }
        }
        Ok(())
    }
    unsafe fn launch_graph_branch(
        &self,
        f: Function,
        _g: [u32; 3],
        _b: [u32; 3],
        _s: u32,
        st: Stream,
        _p: &mut [*mut c_void],
        after: Option<GraphNode>,
    ) -> Result<GraphNode, DeviceError> {
        self.add_branch(f, st, None, after)
    }
    unsafe fn launch_graph_branch_from(
        &self,
        f: Function,
        _g: [u32; 3],
        _b: [u32; 3],
        _s: u32,
        st: Stream,
        _p: &mut [*mut c_void],
        deps: &[GraphNode],
    ) -> Result<GraphNode, DeviceError> {
        self.add_branch(f, st, Some(deps), None)
    }
    fn synchronize(&self, s: Stream) -> Result<(), DeviceError> {
        if self.capturing(s) {
            let why = format!("stream {} is capturing", s.0);
            return Err(refused("cuStreamSynchronize", STREAM_CAPTURE_UNSUPPORTED, why));
        }
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
        if self.kernels && self.captures_begun.load(Ordering::Acquire) {
            let mut c = self.captures();
            match c.streams.get(&s.0).cloned() {
                Some(recorded) => c.events.insert(e.0, recorded),
                None => c.events.remove(&e.0),
            };
        }
        if self.kernels && self.quiet.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.note(format!("record {} on {}", e.0, s.0))
    }
    fn wait_event(&self, s: Stream, e: Event) -> Result<(), DeviceError> {
        if self.kernels && self.captures_begun.load(Ordering::Acquire) {
            let mut c = self.captures();
            let waiter = c.streams.get(&s.0).cloned();
            match (waiter, c.events.get(&e.0).cloned()) {
                (None, None) => {}
                // A fork: the stream joins the capture after what the event recorded.
                (None, Some(recorded)) => {
                    c.streams.insert(s.0, recorded);
                }
                (Some((g, mut deps)), Some((of, recorded))) if g == of => {
                    deps.extend(recorded.into_iter().filter(|n| !deps.contains(n)).collect::<Vec<_>>());
                    c.streams.insert(s.0, (g, deps));
                }
                _ => {
                    let why =
                        format!("stream {} waiting for event {} crosses a capture's boundary", s.0, e.0);
                    return Err(refused("cuStreamWaitEvent", STREAM_CAPTURE_ISOLATION, why));
                }
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn launch(rt: &FakeRuntime, name: &str, s: Stream) -> Option<GraphNode> {
        let f = rt.get_function(Module(1), name).unwrap();
        // SAFETY: the fake runs nothing and reads no parameter.
        unsafe { rt.launch(f, [1; 3], [1; 3], 0, s, &mut [], LaunchOrder::InOrder) }.unwrap();
        rt.last_captured_node(s).unwrap().map(|(_, _, node)| node)
    }

    #[test]
    fn captured_work_becomes_nodes_under_the_drivers_rules() {
        let rt = FakeRuntime::with_kernels();
        let (s, t) = (Stream(7), Stream(9));
        assert_eq!(launch(&rt, "eager", s), None);
        let capture = rt.begin_capture(s);
        assert!(rt.is_capturing(s).unwrap() && !rt.is_capturing(t).unwrap());
        let a = launch(&rt, "a", s).unwrap();
        // An event keeps the stream's dependencies, no node; a stream waiting for it forks.
        let e = rt.create_event().unwrap();
        rt.record_event(e, s).unwrap();
        assert_eq!(rt.capture_frontier(s).unwrap(), Some(vec![a]));
        rt.wait_event(t, e).unwrap();
        let b = launch(&rt, "b", t).unwrap();
        let c = launch(&rt, "c", s).unwrap();
        let f = rt.get_function(Module(1), "branch").unwrap();
        // SAFETY (the branches): as above.
        let after_c = unsafe { rt.launch_graph_branch(f, [1; 3], [1; 3], 0, s, &mut [], Some(c)) }.unwrap();
        assert_eq!(rt.capture_frontier(s).unwrap(), Some(vec![c]), "a branch leaves the stream as it was");
        assert!(unsafe { rt.launch_graph_branch_from(f, [1; 3], [1; 3], 0, s, &mut [], &[a, a]) }.is_err());
        let after_a = unsafe { rt.launch_graph_branch_from(f, [1; 3], [1; 3], 0, s, &mut [], &[a]) }.unwrap();
        // Before every other dependent of `a`, on both streams, then before the stream's next work.
        rt.join_graph_branch(s, after_a, &[a], true).unwrap();
        assert_eq!(rt.capture_frontier(s).unwrap(), Some(vec![c, after_a]));
        assert!(rt.join_graph_branch(s, after_a, &[a], false).is_err(), "an edge added twice");
        assert!(rt.synchronize(s).is_err());
        let outside = rt.create_event().unwrap();
        rt.record_event(outside, Stream(11)).unwrap();
        assert!(rt.wait_event(s, outside).is_err(), "across the capture's boundary");
        rt.quiet.store(true, Ordering::Relaxed);
        rt.take_log();
        let quiet = launch(&rt, "quiet", s).unwrap();
        assert!(rt.take_log().is_empty(), "quiet, but captured");
        let graph = rt.end_capture(s);
        assert_eq!(rt.captured_graph(capture), Some(graph.clone()));
        assert!(!rt.is_capturing(t).unwrap(), "the capture's every stream stops");
        assert_eq!(graph.deps(b), [a, after_a]);
        assert_eq!(graph.deps(c), [a, after_a]);
        assert_eq!(graph.deps(after_c), [c]);
        assert_eq!(graph.deps(quiet), [c, after_a]);
        assert_eq!(graph.dependents(a), [b, c, after_a]);
        assert!(graph.depends_on(quiet, a) && !graph.depends_on(b, c));
        assert_eq!(graph.labelled("branch"), [after_c, after_a]);
        // A branch after q, joined before the dependents of p (q): a cycle, refused.
        rt.begin_capture(s);
        let p = launch(&rt, "p", s).unwrap();
        let q = launch(&rt, "q", s).unwrap();
        let after_q = unsafe { rt.launch_graph_branch_from(f, [1; 3], [1; 3], 0, s, &mut [], &[q]) }.unwrap();
        assert!(rt.join_graph_branch(s, after_q, &[p], false).is_err());
        assert_eq!(rt.end_capture(s).dependents(after_q), []);
    }
}
