//! The selection's bookkeeping over a graph model: nodes, edges, gates, clones, executables.

use super::*;
use std::collections::{BTreeSet, HashMap};

const GATE: GateField = GateField { params_size: 64, gate_offset: 40 };

#[derive(Debug, Clone, Default)]
struct Graph {
    nodes: BTreeSet<u64>,
    edges: BTreeSet<(u64, u64)>,
    /// Gate pointer of gated kernel nodes (nonzero: gated).
    gates: HashMap<u64, u64>,
    /// Clone node -> original node.
    origin: HashMap<u64, u64>,
    memory_nodes: bool,
}

#[derive(Default)]
struct Model {
    next: u64,
    graphs: HashMap<u64, Graph>,
    node_graph: HashMap<u64, u64>,
    execs: HashMap<u64, Graph>,
    destroyed_execs: Vec<u64>,
    fail_instantiate_after: Option<usize>,
    instantiated: usize,
    fail_clear_gate: bool,
}

#[derive(Default)]
struct FakeDriver(Mutex<Model>);

impl FakeDriver {
    fn with<R>(&self, f: impl FnOnce(&mut Model) -> R) -> R {
        f(&mut self.0.lock().unwrap())
    }
}

impl Model {
    fn id(&mut self) -> u64 {
        self.next += 1;
        self.next
    }
    /// A chain of `n` production nodes: returns (graph, nodes).
    fn chain(&mut self, n: usize) -> (u64, Vec<u64>) {
        let g = self.id();
        let mut graph = Graph::default();
        let mut nodes = vec![];
        for _ in 0..n {
            let v = self.id();
            if let Some(&p) = nodes.last() {
                graph.edges.insert((p, v));
            }
            graph.nodes.insert(v);
            self.node_graph.insert(v, g);
            nodes.push(v);
        }
        self.graphs.insert(g, graph);
        (g, nodes)
    }
    /// Inserts a node between `after` and its successors (as a capture would), gated or not.
    fn insert_after(&mut self, g: u64, after: u64, gated: bool) -> u64 {
        let v = self.id();
        let graph = self.graphs.get_mut(&g).unwrap();
        let succ: Vec<u64> = graph.edges.iter().filter(|e| e.0 == after).map(|e| e.1).collect();
        for s in &succ {
            graph.edges.remove(&(after, *s));
            graph.edges.insert((v, *s));
        }
        graph.edges.insert((after, v));
        graph.nodes.insert(v);
        if gated {
            graph.gates.insert(v, 0xdead_0000 + v);
        }
        self.node_graph.insert(v, g);
        v
    }
}

impl GraphDriver for FakeDriver {
    fn nodes(&self, graph: u64) -> Result<Vec<u64>, String> {
        self.with(|m| {
            m.graphs.get(&graph).map(|g| g.nodes.iter().copied().collect()).ok_or("no graph".into())
        })
    }
    fn has_unclonable_nodes(&self, graph: u64) -> Result<bool, String> {
        self.with(|m| Ok(m.graphs[&graph].memory_nodes))
    }
    fn clone_graph(&self, graph: u64) -> Result<u64, String> {
        self.with(|m| {
            let src = m.graphs[&graph].clone();
            let c = m.id();
            let mut map = HashMap::new();
            let mut out = Graph::default();
            for &v in &src.nodes {
                let w = m.id();
                map.insert(v, w);
                out.nodes.insert(w);
                out.origin.insert(w, v);
                m.node_graph.insert(w, c);
                if let Some(&gate) = src.gates.get(&v) {
                    out.gates.insert(w, gate);
                }
            }
            out.edges = src.edges.iter().map(|(a, b)| (map[a], map[b])).collect();
            m.graphs.insert(c, out);
            Ok(c)
        })
    }
    fn find_in_clone(&self, node: u64, clone: u64) -> Result<u64, String> {
        self.with(|m| {
            m.graphs[&clone]
                .origin
                .iter()
                .find(|(_, &o)| o == node)
                .map(|(&w, _)| w)
                .ok_or("not in clone".into())
        })
    }
    fn dependencies(&self, node: u64) -> Result<Vec<u64>, String> {
        self.with(|m| {
            let g = &m.graphs[&m.node_graph[&node]];
            Ok(g.edges.iter().filter(|e| e.1 == node).map(|e| e.0).collect())
        })
    }
    fn dependents(&self, node: u64) -> Result<Vec<u64>, String> {
        self.with(|m| {
            let g = &m.graphs[&m.node_graph[&node]];
            Ok(g.edges.iter().filter(|e| e.0 == node).map(|e| e.1).collect())
        })
    }
    fn add_edge(&self, graph: u64, from: u64, to: u64) -> Result<(), String> {
        self.with(|m| {
            let g = m.graphs.get_mut(&graph).unwrap();
            assert!(g.edges.insert((from, to)), "duplicate edge {from}->{to}");
            Ok(())
        })
    }
    fn destroy_node(&self, node: u64) -> Result<(), String> {
        self.with(|m| {
            let g = m.graphs.get_mut(&m.node_graph[&node]).unwrap();
            g.nodes.remove(&node);
            g.edges.retain(|e| e.0 != node && e.1 != node);
            g.gates.remove(&node);
            Ok(())
        })
    }
    fn destroy_graph(&self, graph: u64) {
        self.with(|m| {
            m.graphs.remove(&graph);
        });
    }
    fn instantiate(&self, graph: u64, _flags: u64) -> Result<u64, String> {
        self.with(|m| {
            if m.fail_instantiate_after.is_some_and(|n| m.instantiated >= n) {
                return Err("instantiate failed".into());
            }
            m.instantiated += 1;
            let snapshot = m.graphs[&graph].clone();
            let e = m.id();
            m.execs.insert(e, snapshot);
            Ok(e)
        })
    }
    fn destroy_exec(&self, exec: u64) {
        self.with(|m| {
            m.execs.remove(&exec);
            m.destroyed_execs.push(exec);
        });
    }
    fn clear_gate(&self, node: u64, field: GateField) -> Result<(), String> {
        assert_eq!(field, GATE);
        self.with(|m| {
            if m.fail_clear_gate {
                return Err("set params failed".into());
            }
            let g = m.graphs.get_mut(&m.node_graph[&node]).unwrap();
            *g.gates.get_mut(&node).ok_or("not a gated node")? = 0;
            Ok(())
        })
    }
}

/// A 4-node production chain with a gated sketch check after node 1 and a C copy + gated
/// reference + gated compare around node 2 (as rows mode captures them).
fn captured(sel: &GraphSelect, d: &FakeDriver, rule: Sampling) -> (u64, Vec<u64>, Vec<u64>) {
    let (g, prod) = d.with(|m| m.chain(4));
    let ours = d.with(|m| {
        let sketch = m.insert_after(g, prod[0], true);
        // The copy of C runs before the call: between node 1's predecessor chain and node 2.
        let c_copy = m.insert_after(g, sketch, false);
        let reference = m.insert_after(g, prod[1], true);
        let compare = m.insert_after(g, reference, true);
        vec![sketch, c_copy, reference, compare]
    });
    for (i, &n) in ours.iter().enumerate() {
        sel.record(g, 1, CheckNode { node: n, gate: (i != 1).then_some(GATE) }, rule);
    }
    sel.on_capture_end(g, 1, true);
    (g, prod, ours)
}

fn origin_chain(d: &FakeDriver, exec: u64) -> (Vec<(u64, u64)>, HashMap<u64, u64>) {
    d.with(|m| {
        let g = &m.execs[&exec];
        let mut edges: Vec<(u64, u64)> = g.edges.iter().map(|(a, b)| (g.origin[a], g.origin[b])).collect();
        edges.sort();
        let gates = g.gates.iter().map(|(n, v)| (g.origin[n], *v)).collect();
        (edges, gates)
    })
}

#[test]
fn plain_clone_keeps_production_order_and_drops_every_check_node() {
    let d = Arc::new(FakeDriver::default());
    let sel = GraphSelect::new(d.clone());
    let (g, prod, _) = captured(&sel, &d, Sampling { first: 0, every: 100 });
    let user_exec = d.instantiate(g, 0).unwrap();
    sel.on_instantiate(g, user_exec, 0);
    assert_eq!(sel.selected_count(), 1);
    let LaunchAs::Instead(first) = sel.launch_as(user_exec) else { panic!("selected") };
    let LaunchAs::Instead(second) = sel.launch_as(user_exec) else { panic!("selected") };
    assert_ne!(first, second, "launch 0 is checked, launch 1 plain");
    let (edges, gates) = origin_chain(&d, second);
    assert_eq!(edges, vec![(prod[0], prod[1]), (prod[1], prod[2]), (prod[2], prod[3])]);
    assert!(gates.is_empty());
    // The checked clone: every node, every gate cleared, same edges as the caller's graph.
    let (checked_edges, checked_gates) = origin_chain(&d, first);
    assert_eq!(checked_gates.len(), 3);
    assert!(checked_gates.values().all(|&v| v == 0));
    let mut user_edges: Vec<_> = d.with(|m| m.graphs[&g].edges.iter().copied().collect());
    user_edges.sort();
    assert_eq!(checked_edges, user_edges);
    // The caller's graph and executable are untouched: still gated.
    assert!(d.with(|m| m.execs[&user_exec].gates.values().all(|&v| v != 0)));
}

#[test]
fn launches_follow_the_sampling_rule_per_executable() {
    let d = Arc::new(FakeDriver::default());
    let sel = GraphSelect::new(d.clone());
    let rule = Sampling::parse("first:2,1/5").unwrap();
    let (g, _, _) = captured(&sel, &d, rule);
    let e1 = d.instantiate(g, 0).unwrap();
    sel.on_instantiate(g, e1, 0);
    let e2 = d.instantiate(g, 0).unwrap();
    sel.on_instantiate(g, e2, 0);
    let checked_of = |e: u64| sel.execs.read().unwrap()[&e].checked;
    let picks = |e: u64| -> Vec<u64> {
        (0..18).filter(|_| sel.launch_as(e) == LaunchAs::Instead(checked_of(e))).collect::<Vec<_>>()
    };
    let expected: Vec<u64> = (0..18).filter(|&n| rule.takes(n)).collect();
    assert_eq!(picks(e1), expected);
    assert_eq!(picks(e2), expected, "each executable counts its own launches");
    assert_eq!(sel.stats.replays_checked.load(Ordering::Relaxed), 2 * expected.len() as u64);
    assert_eq!(sel.stats.replays_plain.load(Ordering::Relaxed), 2 * (18 - expected.len() as u64));
}

#[test]
fn unknown_executables_and_graphs_without_gated_checks_launch_unchanged() {
    let d = Arc::new(FakeDriver::default());
    let sel = GraphSelect::new(d.clone());
    assert_eq!(sel.launch_as(12345), LaunchAs::Unchanged);
    // A graph whose only recorded node is ungated (sample all captures no gates).
    let (g, prod) = d.with(|m| m.chain(2));
    let copy = d.with(|m| m.insert_after(g, prod[0], false));
    sel.record(g, 1, CheckNode { node: copy, gate: None }, Sampling::ALL);
    sel.on_capture_end(g, 1, true);
    let e = d.instantiate(g, 0).unwrap();
    sel.on_instantiate(g, e, 0);
    assert_eq!(sel.selected_count(), 0);
    assert_eq!(sel.launch_as(e), LaunchAs::Unchanged);
    // A selected graph does not change launches of others.
    let (g2, _, _) = captured(&sel, &d, Sampling { first: 0, every: 10 });
    let e2 = d.instantiate(g2, 0).unwrap();
    sel.on_instantiate(g2, e2, 0);
    assert_eq!(sel.launch_as(e), LaunchAs::Unchanged);
    assert!(matches!(sel.launch_as(e2), LaunchAs::Instead(_)));
}

#[test]
fn failures_leave_the_callers_executable_device_gated_and_leak_nothing() {
    for case in 0..4 {
        let d = Arc::new(FakeDriver::default());
        let sel = GraphSelect::new(d.clone());
        let (g, _, ours) = captured(&sel, &d, Sampling { first: 0, every: 100 });
        let user = d.instantiate(g, 0).unwrap();
        let mut flags = 0;
        match case {
            0 => d.with(|m| m.fail_instantiate_after = Some(2)), // the checked clone fails
            1 => d.with(|m| m.fail_clear_gate = true),
            2 => d.with(|m| m.graphs.get_mut(&g).unwrap().memory_nodes = true),
            _ => flags = INSTANTIATE_FLAG_DEVICE_LAUNCH,
        }
        sel.on_instantiate(g, user, flags);
        assert_eq!(sel.selected_count(), 0, "case {case}");
        assert_eq!(sel.launch_as(user), LaunchAs::Unchanged, "case {case}");
        assert_eq!(sel.refusals().len(), 1, "case {case}: {:?}", sel.refusals());
        // Only the caller's executable is alive; clone graphs are destroyed.
        d.with(|m| {
            assert_eq!(m.execs.len(), 1, "case {case}");
            assert_eq!(m.graphs.len(), 1, "case {case}");
        });
        let _ = ours;
    }
}

#[test]
fn nodes_missing_from_the_graph_are_refused() {
    // The handle of a destroyed graph reused by another graph: records do not match its nodes.
    let d = Arc::new(FakeDriver::default());
    let sel = GraphSelect::new(d.clone());
    let (g, _) = d.with(|m| m.chain(3));
    sel.record(g, 1, CheckNode { node: 999_999, gate: Some(GATE) }, Sampling { first: 0, every: 2 });
    sel.on_capture_end(g, 1, true);
    let e = d.instantiate(g, 0).unwrap();
    sel.on_instantiate(g, e, 0);
    assert_eq!(sel.selected_count(), 0);
    assert!(sel.refusals()[0].0.contains("not in the graph"));
}

#[test]
fn destroy_and_change_drop_the_clones() {
    let d = Arc::new(FakeDriver::default());
    let sel = GraphSelect::new(d.clone());
    let (g, _, _) = captured(&sel, &d, Sampling { first: 0, every: 3 });
    let e1 = d.instantiate(g, 0).unwrap();
    sel.on_instantiate(g, e1, 0);
    let e2 = d.instantiate(g, 0).unwrap();
    sel.on_instantiate(g, e2, 0);
    assert_eq!(d.with(|m| m.execs.len()), 6);
    sel.on_exec_change(e1);
    assert_eq!(sel.launch_as(e1), LaunchAs::Unchanged, "changed: runs itself from now on");
    assert_eq!(sel.stats.dropped_on_update.load(Ordering::Relaxed), 1);
    sel.on_exec_destroy(e2);
    assert_eq!(sel.selected_count(), 0);
    assert_eq!(d.with(|m| m.execs.len()), 2, "only the caller's two executables remain");
    sel.on_graph_destroy(g);
    let e3 = d.instantiate(g, 0).unwrap();
    sel.on_instantiate(g, e3, 0);
    assert_eq!(sel.selected_count(), 0, "records go with the graph");
}

#[test]
fn two_rules_in_one_graph_are_refused() {
    let d = Arc::new(FakeDriver::default());
    let sel = GraphSelect::new(d.clone());
    let (g, prod) = d.with(|m| m.chain(3));
    let a = d.with(|m| m.insert_after(g, prod[0], true));
    let b = d.with(|m| m.insert_after(g, prod[1], true));
    sel.record(g, 1, CheckNode { node: a, gate: Some(GATE) }, Sampling { first: 0, every: 2 });
    sel.record(g, 1, CheckNode { node: b, gate: Some(GATE) }, Sampling { first: 0, every: 3 });
    sel.on_capture_end(g, 1, true);
    let e = d.instantiate(g, 0).unwrap();
    sel.on_instantiate(g, e, 0);
    assert_eq!(sel.selected_count(), 0);
}

#[test]
fn concurrent_launches_count_every_replay_once() {
    let d = Arc::new(FakeDriver::default());
    let sel = Arc::new(GraphSelect::new(d.clone()));
    let (g, _, _) = captured(&sel, &d, Sampling { first: 0, every: 10 });
    let e = d.instantiate(g, 0).unwrap();
    sel.on_instantiate(g, e, 0);
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let sel = sel.clone();
            std::thread::spawn(move || {
                for _ in 0..1000 {
                    assert!(matches!(sel.launch_as(e), LaunchAs::Instead(_)));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(sel.stats.replays_checked.load(Ordering::Relaxed), 400);
    assert_eq!(sel.stats.replays_plain.load(Ordering::Relaxed), 3600);
}

#[test]
fn records_of_a_dead_capture_never_reach_a_later_graph_under_the_same_handle() {
    // An invalidated capture's graph is freed by the driver with no cuGraphDestroy: its handle
    // (and its nodes' handles) can come back for the next graph.
    let d = Arc::new(FakeDriver::default());
    let sel = GraphSelect::new(d.clone());
    let (g, prod) = d.with(|m| m.chain(3));
    let rule = Sampling { first: 0, every: 2 };
    // Capture 1 recorded a check whose node is a production node of the graph now at `g`
    // (a reused node handle), then failed to end: its records go.
    sel.record(g, 1, CheckNode { node: prod[1], gate: Some(GATE) }, rule);
    sel.on_capture_end(g, 1, false);
    let e = d.instantiate(g, 0).unwrap();
    sel.on_instantiate(g, e, 0);
    assert_eq!(
        sel.selected_count(),
        0,
        "a failed capture's records were used (its plain clone strips prod[1])"
    );

    // Capture 2 at the same handle recorded nothing, capture 3's end is seen: capture 2's
    // records (never told) are dropped by capture 3's successful end...
    sel.record(g, 2, CheckNode { node: prod[1], gate: Some(GATE) }, rule);
    sel.on_capture_end(g, 3, true);
    let e = d.instantiate(g, 0).unwrap();
    sel.on_instantiate(g, e, 0);
    assert_eq!(sel.selected_count(), 0, "an earlier capture's records survived a later end");

    // ...and a capture recording under a handle replaces what another capture left there.
    let ours = d.with(|m| m.insert_after(g, prod[0], true));
    sel.record(g, 4, CheckNode { node: prod[2], gate: Some(GATE) }, rule);
    sel.record(g, 5, CheckNode { node: ours, gate: Some(GATE) }, rule);
    sel.on_capture_end(g, 5, true);
    let e = d.instantiate(g, 0).unwrap();
    sel.on_instantiate(g, e, 0);
    assert_eq!(sel.selected_count(), 1, "capture 5's own check selects the graph");
    let LaunchAs::Instead(checked) = sel.launch_as(e) else { panic!("selected") };
    let (_, gates) = origin_chain(&d, checked);
    assert_eq!(gates.keys().copied().collect::<Vec<_>>(), vec![ours], "only capture 5's node is ungated");
}

#[test]
fn records_count_only_once_their_capture_ended_and_a_failed_end_drops_only_its_own() {
    let d = Arc::new(FakeDriver::default());
    let sel = GraphSelect::new(d.clone());
    let (g, prod) = d.with(|m| m.chain(3));
    let ours = d.with(|m| m.insert_after(g, prod[0], true));
    let rule = Sampling { first: 0, every: 2 };
    // A capture invalidated before its end was seen (no end reported): its records must not
    // reach whatever graph the handle names now (cuGraphCreate / cuGraphClone ones included).
    sel.record(g, 7, CheckNode { node: ours, gate: Some(GATE) }, rule);
    let e = d.instantiate(g, 0).unwrap();
    sel.on_instantiate(g, e, 0);
    assert_eq!(sel.selected_count(), 0, "records of a capture never seen to end were used");
    // Another thread's capture 8 records under the handle after capture 7's failed end freed
    // the graph; capture 7's failure (reported late) must not drop capture 8's records.
    sel.record(g, 8, CheckNode { node: ours, gate: Some(GATE) }, rule);
    sel.on_capture_end(g, 7, false);
    sel.on_capture_end(g, 8, true);
    let e = d.instantiate(g, 0).unwrap();
    sel.on_instantiate(g, e, 0);
    assert_eq!(sel.selected_count(), 1, "capture 8's records were dropped by capture 7's failure");
}

#[test]
fn a_device_reset_forgets_every_selection_without_a_driver_call() {
    // The reset destroyed the caller's executable and its clones: a later executable at the
    // same handle launches as asked, and its destruction touches no dead clone.
    let d = Arc::new(FakeDriver::default());
    let sel = GraphSelect::new(d.clone());
    let (g, _, _) = captured(&sel, &d, Sampling { first: 0, every: 100 });
    let user = d.instantiate(g, 0).unwrap();
    sel.on_instantiate(g, user, 0);
    assert!(matches!(sel.launch_as(user), LaunchAs::Instead(_)));
    let destroyed_before = d.with(|m| m.destroyed_execs.len());
    sel.forget_all();
    assert_eq!(sel.selected_count(), 0);
    assert_eq!(sel.launch_as(user), LaunchAs::Unchanged, "the handle now names another executable");
    sel.on_exec_destroy(user);
    assert_eq!(
        d.with(|m| m.destroyed_execs.len()),
        destroyed_before,
        "no clone of the dead context destroyed"
    );
    // The graph's records are gone too: instantiating it again selects nothing.
    let again = d.instantiate(g, 0).unwrap();
    sel.on_instantiate(g, again, 0);
    assert_eq!(sel.selected_count(), 0);
}
