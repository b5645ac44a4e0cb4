//! The backend's graph-capture paths over the fake runtime's capture model
//! (`FakeRuntime::begin_capture`): what each captured check adds to the graph, and where.
//!
//! The host's side is played here: a checked GEMM is `before_call`, the production kernel
//! launched on the capturing stream, `after_call`; the shim's hooks are the backend's
//! `event_recording`, `capture_ending` and `stream_destroyed` called before the driver's call.

use super::*;
use crate::device::fake::{CapturedGraph, FakeRuntime};
use crate::device::{Function, GraphNode, LaunchOrder, Module};
use crate::formats::Format;
use crate::intercept::InterceptedGemm;
use crate::thresholds::Thresholds;

/// The host's capturing stream, and another one of its streams.
const STREAM: Stream = Stream(7);
const OTHER_STREAM: Stream = Stream(9);

/// Labels of the backend's nodes: snapshot copies, and sketch checks (lean checks stay off
/// in graphs by default).
const COPY: &str = "qs_sketch_snap";
const CHECK: &str = "qs_sketch_check";

/// The tests run one at a time, and apart from the other tests that leave copies pending:
/// skips and pending copies are counted per process.
use super::super::copy_beside::PENDING_COUNT as ONE_AT_A_TIME;

/// Skips the backend noted for `reason` so far in this test process (`super::note_skip`).
fn skips(reason: &str) -> u64 {
    super::super::TEST_SKIPS.lock().unwrap_or_else(|e| e.into_inner()).get(reason).copied().unwrap_or(0)
}

/// The host process: the fake driver, the backend, the checked calls (sites) it makes.
struct Host {
    rt: Arc<FakeRuntime>,
    backend: GpuBackend,
    thresholds: Thresholds,
    seq: std::cell::Cell<u64>,
}

/// One GEMM site: a bf16 call and its site id.
struct Site {
    call: InterceptedGemm,
    id: u64,
}

impl Host {
    /// The default detach policy (`graphs`): eager calls set up the detached checks of later
    /// captures and are checked on their stream.
    fn new() -> Host {
        let rt = Arc::new(FakeRuntime::with_kernels());
        let settings = GpuSettings {
            pool_bytes: 64 << 20,
            ring_capacity: 64,
            sync_compile: true,
            sketch_detach: SketchDetach::Graphs,
            graph_select: false,
            side_stream: true,
            kernels: Default::default(),
        };
        let backend = GpuBackend::new(rt.clone(), "fake", &settings).unwrap();
        Host { rt, backend, thresholds: Thresholds::default(), seq: std::cell::Cell::new(0) }
    }

    /// A site of M x N x K (a decode GEMV at M = 1) on the capturing stream, with its own
    /// buffers.
    fn site(&self, id: u64, (m, n, k): (u64, u64, u64)) -> Site {
        use crate::problem::{GemmBuffers, GemmProblem};
        let alloc = |elems: u64| self.rt.malloc(elems as usize * 2).unwrap();
        let call = InterceptedGemm {
            entry: "cublasGemmEx",
            problem: GemmProblem::row_major(m, n, k, Format::Bf16, Format::Bf16, Format::Bf16),
            buffers: GemmBuffers { a: alloc(m * k), b: alloc(k * n), d: alloc(m * n), ..Default::default() },
            stream: STREAM.0,
            pointer_arrays: None,
        };
        Site { call, id }
    }

    /// A checked call of `site`: the backend before and after its production kernel.
    fn call(&self, site: &Site) -> Result<(), Skip> {
        self.seq.set(self.seq.get() + 1);
        let req = CheckRequest {
            site_id: site.id,
            site_ordinal: site.id as u32,
            call_seq: self.seq.get(),
            ..CheckRequest::sketch_for_test(&site.call, &self.thresholds)
        };
        let pre = self.backend.before_call(&req)?;
        self.kernel(Stream(site.call.stream), &format!("gemm[{}]", site.id));
        self.backend.after_call(&req, pre)
    }

    /// Launches a host kernel `name` on `stream`; its node when the stream captures.
    fn kernel(&self, stream: Stream, name: &str) -> Option<GraphNode> {
        let f: Function = self.rt.get_function(Module(1), name).unwrap();
        // SAFETY: the fake runs nothing and reads no parameter.
        unsafe { self.rt.launch(f, [1, 1, 1], [32, 1, 1], 0, stream, &mut [], LaunchOrder::InOrder) }
            .unwrap();
        self.rt.last_captured_node(stream).unwrap().map(|(_, _, node)| node)
    }

    /// The capture's graph so far.
    fn graph(&self, capture: u64) -> CapturedGraph {
        self.rt.captured_graph(capture).expect("a capture begun here")
    }

    /// The shim's end of a capture: the backend's additions, then the driver's end.
    fn end_capture(&self, stream: Stream) -> CapturedGraph {
        assert!(self.backend.capture_ending(stream.0).is_some(), "the backend knows the capture");
        self.rt.end_capture(stream)
    }
}

/// A site set up eagerly, then called once in a capture that ended without the shim's hook
/// (not through `capture_ending`): its snapshot copy is left pending on [`STREAM`].
fn copy_left_by_an_unseen_capture_end() -> (Host, Site) {
    let host = Host::new();
    let site = host.site(1, (1, 256, 512));
    host.call(&site).unwrap();
    host.rt.begin_capture(STREAM);
    host.call(&site).unwrap();
    host.rt.end_capture(STREAM);
    (host, site)
}

/// The node labelled `label` (it must be the only one).
fn only(graph: &CapturedGraph, label: &str) -> GraphNode {
    match graph.labelled(label)[..] {
        [node] => node,
        ref nodes => panic!("{} nodes labelled {label}: {graph:#?}", nodes.len()),
    }
}

fn sorted(mut nodes: Vec<GraphNode>) -> Vec<GraphNode> {
    nodes.sort_by_key(|n| n.0);
    nodes
}

#[test]
fn an_event_recorded_after_a_captured_gemm_orders_its_waiters_after_the_pending_copy() {
    // Another stream waits for an event recorded right after the GEMM, then may overwrite what
    // the copy reads (the GEMM's D, say). The event records the stream's dependencies, no node:
    // the next GEMM would find the frontier unchanged and run beside the copy, which, added
    // after it, would precede nothing the waiter waits for. So the event settles the copy first.
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let host = Host::new();
    let (site, next) = (host.site(1, (1, 256, 512)), host.site(2, (1, 256, 512)));
    host.call(&site).unwrap();
    host.call(&next).unwrap(); // set-up outside the capture
    let capture = host.rt.begin_capture(STREAM);
    host.call(&site).unwrap();
    assert!(host.graph(capture).labelled(COPY).is_empty(), "the copy waits for the next GEMM");
    let event = host.rt.create_event().unwrap();
    host.backend.event_recording(STREAM.0);
    host.rt.record_event(event, STREAM).unwrap();
    host.rt.wait_event(OTHER_STREAM, event).unwrap();
    let waiter = host.kernel(OTHER_STREAM, "overwrite").unwrap();
    let copy = only(&host.graph(capture), COPY);
    assert!(host.graph(capture).depends_on(waiter, copy), "the event came after the copy");
    host.call(&next).unwrap();
    let joined = host.rt.create_event().unwrap();
    host.rt.record_event(joined, OTHER_STREAM).unwrap();
    host.rt.wait_event(STREAM, joined).unwrap();
    let graph = host.end_capture(STREAM);
    let [gemm, next_gemm] = [graph.labelled("gemm[1]")[0], graph.labelled("gemm[2]")[0]];
    assert_eq!(graph.deps(copy), [gemm], "the copy follows its GEMM");
    assert!(graph.depends_on(waiter, copy));
    assert!(graph.depends_on(next_gemm, copy), "joined into the stream at the event");
    let checks = graph.labelled(CHECK);
    assert_eq!(checks.len(), 2, "both sites checked: {graph:#?}");
    assert!(checks.iter().any(|&c| graph.deps(c).contains(&copy)), "its check reads the copy");
}

#[test]
fn an_event_recorded_by_another_thread_drops_the_pending_copy_and_its_check() {
    // Graphs are not thread-safe: a thread recording an event on a stream another thread
    // captures must not add nodes to that capture's graph.
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let host = Host::new();
    let site = host.site(1, (1, 256, 512));
    host.call(&site).unwrap();
    let capture = host.rt.begin_capture(STREAM);
    host.call(&site).unwrap();
    let nodes = host.graph(capture).nodes.len();
    let dropped = skips(COPY_DROPPED);
    std::thread::scope(|s| s.spawn(|| host.backend.event_recording(STREAM.0)).join().unwrap());
    assert_eq!(skips(COPY_DROPPED) - dropped, 1, "counted");
    assert_eq!(host.graph(capture).nodes.len(), nodes, "nothing added by the other thread");
    let graph = host.end_capture(STREAM);
    assert_eq!(graph.nodes.len(), nodes, "nor at the capture's end: {graph:#?}");
    assert_eq!(skips(COPY_DROPPED) - dropped, 1);
}

#[test]
fn a_capture_ending_with_a_copy_pending_adds_it_and_every_deferred_check_after_its_copy() {
    // The first GEMM's copy runs beside the second GEMM; the second's is still pending when the
    // capture ends, after a last kernel (a decode step's argmax). Its check starts right after
    // it, beside that kernel; the first's waits for the capture's last work.
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let host = Host::new();
    let (first, second) = (host.site(1, (1, 256, 512)), host.site(2, (1, 256, 512)));
    host.call(&first).unwrap();
    host.call(&second).unwrap();
    let capture = host.rt.begin_capture(STREAM);
    host.call(&first).unwrap();
    host.call(&second).unwrap();
    let argmax = host.kernel(STREAM, "argmax").unwrap();
    assert_eq!(host.graph(capture).labelled(COPY).len(), 1, "the second's copy is pending");
    let graph = host.end_capture(STREAM);
    let [gemm1, gemm2] = [only(&graph, "gemm[1]"), only(&graph, "gemm[2]")];
    let [copy1, copy2] = graph.labelled(COPY)[..] else { panic!("two copies: {graph:#?}") };
    assert_eq!(graph.deps(copy1), [gemm1]);
    assert!(!graph.depends_on(gemm2, copy1), "the second GEMM ran beside the first's copy");
    assert_eq!(sorted(graph.deps(copy2)), sorted(vec![gemm2, copy1]));
    assert!(graph.depends_on(argmax, copy2), "the pending copy precedes what came after its GEMM");
    let checks = graph.labelled(CHECK);
    assert_eq!(checks.len(), 2, "{graph:#?}");
    let check2 = checks.iter().copied().find(|&c| graph.deps(c) == [copy2]);
    let check2 = check2.unwrap_or_else(|| panic!("the last copy's check starts right after it: {graph:#?}"));
    let check1 = checks.iter().copied().find(|&c| c != check2).expect("two checks");
    assert!(graph.deps(check1).contains(&copy1), "each check after its own copy");
    assert!(graph.depends_on(check1, argmax), "the others after the capture's last work");
    assert!(checks.iter().all(|&c| graph.dependents(c).is_empty()), "nothing waits for a check");
}

#[test]
fn a_destroyed_stream_drops_its_pending_copy() {
    // A capture that ended unseen (not through the shim's hook) leaves its copy pending; the
    // stream's destruction gives it up, counted.
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (host, site) = copy_left_by_an_unseen_capture_end();
    let dropped = skips(COPY_DROPPED);
    host.backend.stream_destroyed(STREAM.0);
    assert_eq!(skips(COPY_DROPPED) - dropped, 1);
    // Gone: a later call on a stream of the same handle finds nothing to settle.
    host.call(&site).unwrap();
    assert_eq!(skips(COPY_DROPPED) - dropped, 1);
}

#[test]
fn a_copy_left_by_a_capture_that_ended_unseen_is_dropped_in_the_next() {
    // The old capture's nodes name nothing in the new graph (or are freed): the copy and its
    // check go, counted, and the new capture gets only its own.
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (host, site) = copy_left_by_an_unseen_capture_end();
    let dropped = skips(COPY_DROPPED);
    host.rt.begin_capture(STREAM);
    host.call(&site).unwrap();
    assert_eq!(skips(COPY_DROPPED) - dropped, 1);
    let graph = host.end_capture(STREAM);
    let copy = only(&graph, COPY);
    assert_eq!(graph.deps(only(&graph, CHECK)), [copy]);
}

#[test]
fn a_pending_copy_runs_beside_the_next_gemm_only_when_nothing_came_between_and_it_writes_elsewhere() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // (kernel captured between the GEMMs, the second GEMM writes the first's A) -> whether the
    // second GEMM runs beside the first's copy.
    for (between, overwrites, beside) in [(false, false, true), (true, false, false), (false, true, false)] {
        let host = Host::new();
        let (first, mut second) = (host.site(1, (1, 256, 512)), host.site(2, (1, 512, 512)));
        if overwrites {
            second.call.buffers.d = first.call.buffers.a;
        }
        host.call(&first).unwrap();
        host.call(&second).unwrap();
        host.rt.begin_capture(STREAM);
        host.call(&first).unwrap();
        let norm = between.then(|| host.kernel(STREAM, "norm").unwrap());
        host.call(&second).unwrap();
        let next = host.kernel(STREAM, "next").unwrap();
        let graph = host.end_capture(STREAM);
        let case = format!("between {between}, overwrites {overwrites}");
        let gemm2 = only(&graph, "gemm[2]");
        let copy1 = graph.labelled(COPY)[0];
        assert_eq!(graph.deps(copy1), [only(&graph, "gemm[1]")], "{case}");
        assert_eq!(!graph.depends_on(gemm2, copy1), beside, "{case}: {graph:#?}");
        assert!(graph.depends_on(next, copy1), "{case}: later work waits for the copy");
        if let Some(norm) = norm {
            assert!(graph.depends_on(norm, copy1), "{case}: in front of what came between");
        }
    }
}

#[test]
fn checks_move_beside_a_far_larger_gemm_captured_later() {
    // Nine small GEMMs (eight checks deferred with their copies, the ninth's copy pending), then
    // one 16 times their weight (a vocabulary projection): the eight checks are added before it
    // is captured, beside it rather than after it; the rest wait for the end.
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let host = Host::new();
    let small: Vec<Site> = (1..=9).map(|id| host.site(id, (1, 256, 512))).collect();
    let vocab = host.site(100, (1, 4096, 512));
    for site in small.iter().chain([&vocab]) {
        host.call(site).unwrap();
    }
    let capture = host.rt.begin_capture(STREAM);
    for site in &small {
        host.call(site).unwrap();
    }
    assert!(host.graph(capture).labelled(CHECK).is_empty(), "deferred");
    host.call(&vocab).unwrap();
    let moved = host.graph(capture).labelled(CHECK);
    assert_eq!(moved.len(), BESIDE_MIN_CHECKS, "{:#?}", host.graph(capture));
    let graph = host.end_capture(STREAM);
    let gemm = only(&graph, "gemm[100]");
    let copies = graph.labelled(COPY);
    for &check in &moved {
        assert!(!graph.depends_on(gemm, check), "beside the large GEMM, not before it");
        assert!(graph.deps(check).iter().any(|d| copies.contains(d)), "after its copy");
        assert!(graph.depends_on(check, only(&graph, "gemm[9]")), "after the work before the GEMM");
    }
    assert_eq!(graph.labelled(CHECK).len(), 10, "the ninth's and the large one's at the end");
}

#[test]
fn calls_of_a_site_after_its_first_in_a_capture_chain_their_checks_after_their_copies() {
    // The site's own scratch goes to its first captured call; later ones share their shape's
    // scratch, so their checks are chained, within each capture only.
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let host = Host::new();
    let site = host.site(1, (1, 256, 512));
    host.call(&site).unwrap();
    for _ in 0..2 {
        host.rt.begin_capture(STREAM);
        for _ in 0..3 {
            host.call(&site).unwrap();
        }
        let graph = host.end_capture(STREAM);
        let (copies, checks) = (graph.labelled(COPY), graph.labelled(CHECK));
        assert_eq!((copies.len(), checks.len()), (3, 3), "{graph:#?}");
        // Added in this order: the second and third calls' branches, then the deferred first.
        let [second, third, _first] = checks[..] else { unreachable!() };
        assert_eq!(graph.deps(second), [copies[1]], "{graph:#?}");
        assert_eq!(sorted(graph.deps(third)), sorted(vec![copies[2], second]), "chained");
        let gemms = graph.labelled("gemm[1]");
        assert!(graph.depends_on(gemms[2], copies[1]), "a copy on the stream precedes later GEMMs");
    }
}
