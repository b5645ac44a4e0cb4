//! What the engine asks of a check backend (GPU or host), and what comes back.
//!
//! The engine decides (sampling, site, mode); a backend only executes: it may copy inputs the
//! call is about to overwrite (`before_call`), then runs or enqueues the check after the real
//! call succeeded (`after_call`), and hands finished results back through `poll`. A backend
//! never blocks the caller's stream on the host, never synchronises a capturing stream, and
//! turns every failure into a `Skip` with a reason (counted by the engine).

use crate::inject::{CallRewrite, FaultClass};
use crate::intercept::{InterceptedGemm, Skip};
use crate::metrics::{LogitsMetrics, Metrics};
use crate::record::{CheckMode, DiagnosisRecord, LogitsRow};
use crate::thresholds::Thresholds;
use std::any::Any;

/// Sketch settings of a check (DESIGN.md "Checking without paying for a second GEMM").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SketchSettings {
    /// Probe seed; per site, so that a site's fingerprints compare across runs.
    pub seed: u64,
    /// k, 1..=32.
    pub probes: u32,
    /// Rows sketched per call when M is larger (rotating over calls of the site).
    pub rows_per_call: u64,
}

/// One sampled call and how to check it.
#[derive(Debug, Clone)]
pub struct CheckRequest<'a> {
    pub call: &'a InterceptedGemm,
    /// Sketch, Rows or Full (Observe never reaches a backend).
    pub mode: CheckMode,
    pub site_ordinal: u32,
    pub site_id: u64,
    /// Per-process sequence number of this call (all entries).
    pub call_seq: u64,
    /// How many calls of this site were checked before this one: sketch and rows modes
    /// rotate their row sample by it, so every row is covered over time.
    pub site_epoch: u64,
    pub sketch: SketchSettings,
    /// Rows mode: rows compared per call (all rows when M is smaller).
    pub rows_per_call: u64,
    /// Some(k) when the site is an LM head (logits): KL, top-1 and top-k overlap as well.
    pub logits_topk: Option<u32>,
    /// Set when the call is being captured into a graph and the sampling rule is not "all":
    /// the backend records the check with this rule decided on the device at every replay
    /// (where it can; otherwise it records it unconditionally).
    pub device_gate: Option<super::config::Sampling>,
    /// Whether this call's check also diagnoses the site (see [`Diagnose`]).
    pub diagnose: Diagnose,
    /// Thresholds a backend judges with when it diagnoses failing checks itself.
    pub thresholds: &'a Thresholds,
    /// Fault injection rewrites this call's inputs (operands, scales) in place around it
    /// (`QUANTSHADOW_INJECT`): writes beyond D that the call's own check cannot see.
    pub rewrites_inputs: bool,
    /// Memory the library writes besides D during the call ([`crate::intercept::GemmArgs::scratch`]).
    pub scratch: Option<(u64, u64)>,
}

/// Diagnosis of a site (issue 6): the reference re-run under alternative readings of the
/// contract ([`crate::diagnosis::alternatives`]), ranked against production, plus the error
/// map of the declared reading. Decided by the engine per call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Diagnose {
    No,
    /// A backend that judges its checks as they finish (the host) diagnoses this call if its
    /// check fails `thresholds`, and attaches the result to the outcome. Backends that learn
    /// results later (GPU) ignore it: the engine asks [`Backend::diagnose`] on a later call.
    IfFailing,
}

#[cfg(test)]
impl<'a> CheckRequest<'a> {
    /// A sketch request of `call` as site 1 with plain settings (tests of the layers that take
    /// requests).
    pub(crate) fn sketch_for_test(call: &'a InterceptedGemm, thresholds: &'a Thresholds) -> Self {
        CheckRequest {
            call,
            mode: CheckMode::Sketch,
            site_ordinal: 0,
            site_id: 1,
            call_seq: 0,
            site_epoch: 0,
            sketch: SketchSettings { seed: 1, probes: 8, rows_per_call: 256 },
            rows_per_call: 64,
            logits_topk: None,
            device_gate: None,
            diagnose: Diagnose::No,
            thresholds,
            rewrites_inputs: false,
            scratch: None,
        }
    }
}

/// The faults planted into one call (`QUANTSHADOW_INJECT`), as a backend applies them.
/// Before-call rewrites act on the caller's buffers in place (the original bytes are saved
/// first and put back right after the real call, before any check reads them); output
/// transforms rewrite D in place after the call.
#[derive(Debug, Clone)]
pub struct InjectRequest<'a> {
    pub call: &'a InterceptedGemm,
    /// The engine's site id of the call (backends key per-site scratch by it).
    pub site_id: u64,
    /// From [`crate::inject::plan_call`]: `ReplaceScale` (a scale buffer rewritten to its
    /// transposed layout or to ones) and `FlipTranspose` (the operand's elements permuted so
    /// that the declared call computes the flipped one, [`crate::inject::prepare_transpose_fault`]).
    pub before: Vec<CallRewrite>,
    /// Output classes, applied in this order.
    pub after: Vec<FaultClass>,
    /// Seed of the noise and the NaN position ([`crate::inject::InjectPlan::seed`]).
    pub seed: u64,
}

/// What `inject_before` saved for `inject_after` (backend-specific).
#[derive(Default)]
pub struct Injected(pub Option<Box<dyn Any + Send>>);

/// What `before_call` kept for `after_call` (backend-specific).
#[derive(Default)]
pub struct PreCall(pub Option<Box<dyn Any + Send>>);

/// A finished check, tagged with the request's site and call.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckOutcome {
    pub site_ordinal: u32,
    pub site_id: u64,
    pub call_seq: u64,
    pub mode: CheckMode,
    pub metrics: Metrics,
    pub rows_checked: u64,
    pub sketch_seed: u64,
    pub sketch_prod: Vec<f32>,
    pub sketch_ref: Vec<f32>,
    pub logits: Option<LogitsMetrics>,
    pub logits_rows: Vec<LogitsRow>,
    /// `record::flags` bits.
    pub flags: u32,
    /// A diagnosis made with the check ([`Diagnose::IfFailing`]); `session_id` and timestamp
    /// are filled by the engine.
    pub diagnosis: Option<Box<DiagnosisRecord>>,
}

/// A result the backend could not produce after all (device status flags, bad descriptor):
/// counted as a skip with this reason, never reported as a pass or a failure of the library.
#[derive(Debug, Clone, PartialEq)]
pub enum Polled {
    Done(Box<CheckOutcome>),
    Failed {
        site_ordinal: u32,
        /// The call the check was of (`CheckRequest::call_seq`).
        call_seq: u64,
        reason: String,
    },
    /// A diagnosis pass asked for with [`Backend::diagnose`] finished.
    Diagnosis(Box<DiagnosisRecord>),
    /// A diagnosis pass could not finish after it was started (counted as a skip).
    DiagnosisFailed {
        site_id: u64,
        reason: String,
    },
}

/// The executing side of the engine.
pub trait Backend: Send + Sync {
    /// "host", "cuda" or "hip".
    fn name(&self) -> &'static str;
    /// Device name and architecture for the session record.
    fn device(&self) -> (String, String);
    /// Runs before the real call: copies what the call overwrites and the check needs
    /// (C when D aliases it with beta != 0). Never called on a failed decode.
    fn before_call(&self, request: &CheckRequest) -> Result<PreCall, Skip>;
    /// Runs after the real call returned success: run or enqueue the check.
    fn after_call(&self, request: &CheckRequest, pre: PreCall) -> Result<(), Skip>;
    /// Finished checks since the last poll, in completion order.
    fn poll(&self, out: &mut Vec<Polled>);
    /// Whether `stream` is capturing into a graph (cheap; false where graphs do not exist).
    fn is_capturing(&self, _stream: u64) -> bool {
        false
    }
    /// A capture on `stream` is about to end: add the work deferred to its end (CUDA graphs;
    /// nothing elsewhere). Returns (graph, capture id) of the capture where known, so that what
    /// was recorded of that graph can be checked against how the capture ends.
    fn capture_ending(&self, _stream: u64) -> Option<(u64, u64)> {
        None
    }
    /// `stream` is about to be destroyed: forget every use of its handle (called before the
    /// real destroy, on the destroying thread, whatever device is current there).
    fn stream_destroyed(&self, _stream: u64) {}
    /// The host is about to record an event on `stream` (which may be capturing): work it
    /// left pending for later on that stream must be captured before the event.
    fn event_recording(&self, _stream: u64) {}
    /// The host is about to reset `device` (None: the calling thread's current one): its
    /// context and everything made in it go away. Returns whether a backend was retired.
    fn device_reset(&self, _device: Option<i32>) -> bool {
        false
    }
    /// The host's reset of `device` (None: the calling thread's current one), announced by
    /// [`Backend::device_reset`], failed: the context lives on, and so may the backend retired
    /// for it.
    fn device_reset_failed(&self, _device: Option<i32>) {}
    /// The context the backend was made in, as a raw handle, when known.
    fn context(&self) -> Option<u64> {
        None
    }
    /// The host is about to destroy context `ctx` (`cuCtxDestroy`): backends made in it are
    /// retired, as after a device reset. Returns whether one was.
    fn context_destroyed(&self, _ctx: u64) -> bool {
        false
    }
    /// The destroy of `ctx` announced by [`Backend::context_destroyed`] returned; if it failed
    /// (`ok` false), the backends it retired serve again.
    fn context_destroy_returned(&self, _ctx: u64, _ok: bool) {}
    /// Whether the backend was made in its device's primary context (None: unknown).
    fn in_primary_context(&self) -> Option<bool> {
        None
    }
    /// The host released `device`'s primary context (`cuDevicePrimaryCtxRelease`); if that
    /// was the last reference, the context is gone and backends made in it are retired.
    /// Returns whether one was.
    fn primary_context_released(&self, _device: i32) -> bool {
        false
    }
    /// Results the backend had to drop (full result ring, full queue).
    fn dropped(&self) -> u64 {
        0
    }
    /// Checks and copies launched to start early (`QUANTSHADOW_EARLY_START`), for the closing
    /// line: shows whether the setting took effect on this device.
    fn early_launches(&self) -> u64 {
        0
    }
    /// Before the real call: rewrites the inputs named by `request.before` in place, saving
    /// what it overwrites. Err: nothing was changed (the call runs unfaulted, counted).
    fn inject_before(&self, _request: &InjectRequest) -> Result<Injected, Skip> {
        Err(Skip::new("fault injection is not supported by this backend"))
    }
    /// After the real call: puts back what `inject_before` saved, then applies the output
    /// classes to D. Runs even when the call failed, so the caller's inputs are always restored.
    fn inject_after(&self, _request: &InjectRequest, _saved: Injected) -> Result<(), Skip> {
        Err(Skip::new("fault injection is not supported by this backend"))
    }
    /// Starts a diagnosis pass over this call (after the real call and any check of it):
    /// every reading of [`crate::diagnosis::alternatives`] evaluated on a row sample, ranked
    /// with [`crate::diagnosis::rank`], with the error map of the declared reading. The result
    /// comes back through `poll` as [`Polled::Diagnosis`]. Err: not started (counted; the
    /// engine asks again on a later call of the site, a bounded number of times).
    fn diagnose(&self, _request: &CheckRequest) -> Result<(), Skip> {
        Err(Skip::new("diagnosis is not supported by this backend"))
    }
}
