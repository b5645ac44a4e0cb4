//! Per-replay sampling of captured checks, decided at graph launch (CUDA).
//!
//! Inside a capture with a sampling rule (`1/N`, `first:K,...`), each check is captured with a
//! device gate (`qs_gate_take`): at every replay the check kernel counts itself and leaves
//! unless its turn has come. The gated-out node still costs a kernel launch inside the graph:
//! about 1.3 us per GEMM on an H100 (`tests/gpu/conditional_gate.cu`; an empty kernel node
//! costs 1.2 us, a skipped conditional IF node 4.5 us, a disabled kernel node 0.36 us). No
//! node per GEMM can bring `1/100` near zero cost.
//!
//! So when such a graph is instantiated, two more executables are made from clones of it:
//! - **plain**: the clone with every check node removed (their predecessors joined to their
//!   successors), the same work as without the shim;
//! - **checked**: the clone with every check's gate cleared, so each check runs.
//!
//! A launch of the caller's executable is replaced by a launch of one of them, chosen on the
//! host with the sampling rule over that executable's launches: unsampled replays run the
//! plain graph and pay nothing on the GPU. The caller's own executable is never modified. It
//! stays device-gated and is what runs whenever the selection cannot be trusted:
//! - the graph could not be cloned, stripped or instantiated, or holds node types whose state
//!   the clones might not share (memory nodes, device launch);
//! - the caller changed its executable after instantiation (`cuGraphExecUpdate`, any
//!   `cuGraphExec*SetParams`, `cuGraphNodeSetEnabled`). The clones would then run stale work,
//!   so the selection is dropped before the change is forwarded.
//!
//! Graph handles here are raw driver handles (`CUgraph`, `CUgraphNode`, `CUgraphExec`) as u64;
//! the driver work is behind [`GraphDriver`] (CUDA: `device::cuda_graph`), so the bookkeeping
//! is tested on the CPU with a graph model.

use super::config::Sampling;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

/// Where a captured check kernel keeps its device gate: the u64 gate pointer inside its one
/// by-value parameter struct (0 = run at every launch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GateField {
    /// Size of the kernel's parameter struct.
    pub params_size: usize,
    /// Byte offset of `gate_ptr` in it.
    pub gate_offset: usize,
}

/// A node the shim added to a capture, only there for a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckNode {
    pub node: u64,
    /// A gated check kernel; None: a node that feeds a check (a copy of C before the call).
    pub gate: Option<GateField>,
}

/// The graph operations the selection needs. Errors are short texts (counted as skip reasons).
pub trait GraphDriver: Send + Sync {
    fn nodes(&self, graph: u64) -> Result<Vec<u64>, String>;
    /// Whether the graph holds nodes whose state clones would not share (memory alloc/free,
    /// conditional nodes, ...): then no clone is made.
    fn has_unclonable_nodes(&self, graph: u64) -> Result<bool, String>;
    fn clone_graph(&self, graph: u64) -> Result<u64, String>;
    fn find_in_clone(&self, node: u64, clone: u64) -> Result<u64, String>;
    fn dependencies(&self, node: u64) -> Result<Vec<u64>, String>;
    fn dependents(&self, node: u64) -> Result<Vec<u64>, String>;
    fn add_edge(&self, graph: u64, from: u64, to: u64) -> Result<(), String>;
    fn destroy_node(&self, node: u64) -> Result<(), String>;
    fn destroy_graph(&self, graph: u64);
    fn instantiate(&self, graph: u64, flags: u64) -> Result<u64, String>;
    fn destroy_exec(&self, exec: u64);
    /// Sets the gate pointer of kernel node `node` (of a graph, not an executable) to 0.
    fn clear_gate(&self, node: u64, field: GateField) -> Result<(), String>;
}

/// `CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH` (cuda.h): launched from the device as well,
/// where no host hook sees the launch.
pub const INSTANTIATE_FLAG_DEVICE_LAUNCH: u64 = 4;

/// Checks recorded into one graph during its capture.
#[derive(Debug, Default)]
struct Captured {
    /// The capture they were recorded in: a graph handle can come back for another graph once
    /// the first is gone (an invalidated capture's graph is freed with no `cuGraphDestroy`), and
    /// that graph must never meet these nodes.
    capture: u64,
    /// That capture ended successfully ([`GraphSelect::on_capture_end`]). Records of a capture
    /// whose end was never seen (invalidated before it) are never used: the handle may now be
    /// any graph, made by cuGraphCreate or cuGraphClone too.
    ended: bool,
    nodes: Vec<CheckNode>,
    rule: Option<Sampling>,
    /// Recorded with two different rules (cannot happen with one configuration): not selected.
    mixed_rules: bool,
}

/// The two executables a caller's executable launches instead of itself.
#[derive(Debug)]
struct Selected {
    plain: u64,
    checked: u64,
    rule: Sampling,
    launches: AtomicU64,
}

/// Counters for the closing log line and tests.
#[derive(Debug, Default)]
pub struct SelectStats {
    pub graphs_selected: AtomicU64,
    pub replays_checked: AtomicU64,
    pub replays_plain: AtomicU64,
    pub dropped_on_update: AtomicU64,
}

pub struct GraphSelect {
    driver: Arc<dyn GraphDriver>,
    captured: Mutex<HashMap<u64, Captured>>,
    execs: RwLock<HashMap<u64, Arc<Selected>>>,
    /// Some executable is selected: launches look it up (otherwise they are forwarded at once).
    any: AtomicBool,
    pub stats: SelectStats,
    /// Why a graph was left device-gated (reason -> count); the engine shows them as skips.
    refusals: Mutex<HashMap<String, u64>>,
}

/// What a launch of the caller's executable becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaunchAs {
    /// Not a selected executable: launched as asked.
    Unchanged,
    /// Launch this executable instead (the plain or the checked clone).
    Instead(u64),
}

impl GraphSelect {
    pub fn new(driver: Arc<dyn GraphDriver>) -> GraphSelect {
        GraphSelect {
            driver,
            captured: Mutex::new(HashMap::new()),
            execs: RwLock::new(HashMap::new()),
            any: AtomicBool::new(false),
            stats: SelectStats::default(),
            refusals: Mutex::new(HashMap::new()),
        }
    }

    /// Notes a check node just added to `graph` by capture `capture` (in progress) under `rule`.
    /// Records of an earlier capture under the same handle are dropped first.
    pub fn record(&self, graph: u64, capture: u64, node: CheckNode, rule: Sampling) {
        let mut captured = self.captured.lock().unwrap_or_else(|e| e.into_inner());
        let c = captured.entry(graph).or_default();
        if c.capture != capture {
            *c = Captured { capture, ..Captured::default() };
        }
        match c.rule {
            None => c.rule = Some(rule),
            Some(r) if r != rule => c.mixed_rules = true,
            Some(_) => {}
        }
        c.nodes.push(node);
    }

    /// After the caller's `graph` was instantiated as `exec`: makes the plain and checked
    /// executables if the graph holds recorded gated checks. Failures leave `exec` device-gated.
    pub fn on_instantiate(&self, graph: u64, exec: u64, flags: u64) {
        let (nodes, rule) = {
            let captured = self.captured.lock().unwrap_or_else(|e| e.into_inner());
            match captured.get(&graph) {
                Some(c) if c.ended && c.nodes.iter().any(|n| n.gate.is_some()) => {
                    if c.mixed_rules {
                        drop(captured);
                        self.refuse("graph launch selection: checks captured under two sampling rules");
                        return;
                    }
                    (c.nodes.clone(), c.rule.expect("set with the first node"))
                }
                _ => return,
            }
        };
        if flags & INSTANTIATE_FLAG_DEVICE_LAUNCH != 0 {
            self.refuse("graph launch selection: graph instantiated for device launch");
            return;
        }
        match self.build(graph, &nodes, flags) {
            Ok((plain, checked)) => {
                let sel = Arc::new(Selected { plain, checked, rule, launches: AtomicU64::new(0) });
                let old = self.execs.write().unwrap_or_else(|e| e.into_inner()).insert(exec, sel);
                if let Some(old) = old {
                    // A handle reused after a destroy we did not see: its clones are stale.
                    self.destroy_selected(&old);
                }
                self.any.store(true, Ordering::Release);
                let n = self.stats.graphs_selected.fetch_add(1, Ordering::Relaxed);
                if n < 8 {
                    super::log::info(&format!(
                        "graph launch selection: graph of {} nodes, {} check nodes ({} gated) removed from its plain clone, rule {}",
                        self.driver.nodes(graph).map_or(0, |v| v.len()),
                        nodes.len(),
                        nodes.iter().filter(|n| n.gate.is_some()).count(),
                        rule.describe()
                    ));
                }
            }
            Err(reason) => self.refuse(&format!("graph launch selection: {reason}")),
        }
    }

    /// The two clones of `graph`, instantiated: (plain, checked).
    fn build(&self, graph: u64, nodes: &[CheckNode], flags: u64) -> Result<(u64, u64), String> {
        let d = &self.driver;
        // Nodes recorded under this handle must all be in the graph (a handle reused by a
        // later graph would otherwise make us strip someone else's nodes).
        let present: std::collections::HashSet<u64> = d.nodes(graph)?.into_iter().collect();
        if nodes.iter().any(|n| !present.contains(&n.node)) {
            return Err("recorded check nodes are not in the graph".into());
        }
        if d.has_unclonable_nodes(graph)? {
            return Err("graph holds memory or conditional nodes".into());
        }
        let plain_graph = d.clone_graph(graph)?;
        let plain = strip(d.as_ref(), plain_graph, nodes).and_then(|()| d.instantiate(plain_graph, flags));
        d.destroy_graph(plain_graph);
        let plain = plain?;
        let checked = d.clone_graph(graph).and_then(|checked_graph| {
            let r =
                ungate(d.as_ref(), checked_graph, nodes).and_then(|()| d.instantiate(checked_graph, flags));
            d.destroy_graph(checked_graph);
            r
        });
        match checked {
            Ok(checked) => Ok((plain, checked)),
            Err(e) => {
                d.destroy_exec(plain);
                Err(e)
            }
        }
    }

    /// Chooses what a launch of `exec` runs. Cheap when nothing is selected (one load).
    pub fn launch_as(&self, exec: u64) -> LaunchAs {
        if !self.any.load(Ordering::Acquire) {
            return LaunchAs::Unchanged;
        }
        let execs = self.execs.read().unwrap_or_else(|e| e.into_inner());
        let Some(sel) = execs.get(&exec) else {
            return LaunchAs::Unchanged;
        };
        let n = sel.launches.fetch_add(1, Ordering::Relaxed);
        if sel.rule.takes(n) {
            self.stats.replays_checked.fetch_add(1, Ordering::Relaxed);
            LaunchAs::Instead(sel.checked)
        } else {
            self.stats.replays_plain.fetch_add(1, Ordering::Relaxed);
            LaunchAs::Instead(sel.plain)
        }
    }

    /// The caller destroys `exec`: its clones go too (freed by the driver once they finish).
    pub fn on_exec_destroy(&self, exec: u64) {
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        let sel = self.execs.write().unwrap_or_else(|e| e.into_inner()).remove(&exec);
        if let Some(sel) = sel {
            self.destroy_selected(&sel);
        }
    }

    /// The caller is about to change `exec`: from now on it runs itself (device-gated).
    pub fn on_exec_change(&self, exec: u64) {
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        let sel = self.execs.write().unwrap_or_else(|e| e.into_inner()).remove(&exec);
        if let Some(sel) = sel {
            self.stats.dropped_on_update.fetch_add(1, Ordering::Relaxed);
            self.refuse(
                "graph launch selection: executable changed after instantiation (device-gated from then)",
            );
            self.destroy_selected(&sel);
        }
    }

    /// A device was reset: every executable, clone and graph the selection knows may be gone,
    /// and their handles reused. Everything is forgotten without a driver call (the clones
    /// died with their context, or leak if another device's); executables made since run
    /// themselves, device-gated.
    pub fn forget_all(&self) {
        let forgotten = std::mem::take(&mut *self.execs.write().unwrap_or_else(|e| e.into_inner()));
        self.any.store(false, Ordering::Release);
        self.captured.lock().unwrap_or_else(|e| e.into_inner()).clear();
        // Held clones are dropped without destroying them (their handles may be dead).
        drop(forgotten);
    }

    /// The caller destroys `graph`: its records go (the handle may be reused).
    pub fn on_graph_destroy(&self, graph: u64) {
        self.captured.lock().unwrap_or_else(|e| e.into_inner()).remove(&graph);
    }

    /// Capture `capture` into `graph` ended, `ended` telling whether it succeeded. A failed end
    /// frees the graph (no `cuGraphDestroy` follows): its records go. A successful one makes its
    /// own records usable and drops others under that handle (of an earlier, dead graph). Only
    /// records of `capture` itself are dropped on a failure: after the real end freed the graph,
    /// another thread's new capture may already be recording under the same handle.
    pub fn on_capture_end(&self, graph: u64, capture: u64, ended: bool) {
        let mut captured = self.captured.lock().unwrap_or_else(|e| e.into_inner());
        match captured.get_mut(&graph) {
            Some(c) if c.capture == capture && ended => c.ended = true,
            Some(c) if c.capture == capture || ended => {
                captured.remove(&graph);
            }
            _ => {}
        }
    }

    fn destroy_selected(&self, sel: &Selected) {
        self.driver.destroy_exec(sel.plain);
        self.driver.destroy_exec(sel.checked);
    }

    fn refuse(&self, reason: &str) {
        let mut m = self.refusals.lock().unwrap_or_else(|e| e.into_inner());
        if m.len() < 64 || m.contains_key(reason) {
            *m.entry(reason.to_string()).or_insert(0) += 1;
        }
        drop(m);
        super::note_skip(reason);
    }

    /// Reasons graphs were left device-gated, with counts.
    pub fn refusals(&self) -> Vec<(String, u64)> {
        let mut v: Vec<_> = self
            .refusals
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        v.sort();
        v
    }

    /// Selected executables now (tests, logs).
    pub fn selected_count(&self) -> usize {
        self.execs.read().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// Removes the check nodes from `clone` (a clone of the graph they were recorded in), joining
/// each one's predecessors to its successors so that the order of everything else is kept.
fn strip(d: &dyn GraphDriver, clone: u64, nodes: &[CheckNode]) -> Result<(), String> {
    for n in nodes {
        let c = d.find_in_clone(n.node, clone)?;
        let before = d.dependencies(c)?;
        let after = d.dependents(c)?;
        d.destroy_node(c)?;
        for &p in &before {
            let existing = d.dependents(p)?;
            for &s in &after {
                if !existing.contains(&s) {
                    d.add_edge(clone, p, s)?;
                }
            }
        }
    }
    Ok(())
}

/// Clears the gate of every gated check in `clone`, so each runs at every launch.
fn ungate(d: &dyn GraphDriver, clone: u64, nodes: &[CheckNode]) -> Result<(), String> {
    for n in nodes {
        if let Some(field) = n.gate {
            d.clear_gate(d.find_in_clone(n.node, clone)?, field)?;
        }
    }
    Ok(())
}

// ---- the process's selection (installed by the CUDA backend) -------------------------------

static SELECT: OnceLock<GraphSelect> = OnceLock::new();

/// Installs the process's selection over `driver` (first call wins).
pub fn install(driver: Arc<dyn GraphDriver>) -> &'static GraphSelect {
    SELECT.get_or_init(|| GraphSelect::new(driver))
}

/// The process's selection, once a CUDA backend installed it.
pub fn get() -> Option<&'static GraphSelect> {
    SELECT.get()
}

#[cfg(test)]
mod tests;
