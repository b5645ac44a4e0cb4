//! Fault injection on the GPU (`QUANTSHADOW_INJECT`, [`crate::inject`]): the device kernels of
//! `kernels/qs_inject.cu`, enqueued on the call's stream around the real call.
//!
//! Stream order on `Stream(call.stream)`, per call:
//! 1. `inject_before`, for each before-call rewrite in the request's order: copy the caller's
//!    buffer (a scale buffer, or the whole declared extent of an operand) into a saved copy,
//!    then rewrite the caller's buffer from the saved copy (`qs_inject_scale` with the saved
//!    copy as source and the caller's buffer as destination; `qs_inject_permute` likewise);
//! 2. the real call reads the rewritten buffers;
//! 3. `inject_after`: the caller's buffers get their saved bytes back, in reverse order (two
//!    rewrites of one buffer restore to the original), then the output classes rewrite D in
//!    place (`qs_inject_output_{d}`), in the request's order.
//!
//! Saved copies belong to the backend: one pool block per (site, role, position in the request,
//! size), set up on the first call outside a stream capture and kept for the process's life (a
//! captured graph replays the copies into the same blocks forever, so they are never freed or
//! reused). While the stream captures nothing is allocated, compiled or
//! synchronised: missing scratch or kernels skip the injection (nothing changed); otherwise the
//! same copies and launches are recorded and run at every replay.

use super::{pool_reason, short, GpuBackend, RelaxedCapture};
use crate::device::abi::{self, KernelBuild, QsInjectParams, QsPermuteParams};
use crate::device::gpu::DeviceBuffer;
use crate::device::Stream;
use crate::engine::backend::{InjectRequest, Injected};
use crate::formats::Format;
use crate::inject::{CallRewrite, Operand};
use crate::intercept::Skip;
use std::collections::HashMap;

/// Saved copies kept at most (beyond, injection into new sites or sizes is skipped, counted).
const SAVED_COPIES_MAX: usize = 1024;

/// Which caller buffer a saved copy holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Role {
    Scale(Operand),
    Operand(Operand),
}

/// (site, role, position of the rewrite in the request, bytes).
type SavedKey = (u64, Role, usize, usize);

/// The backend's saved copies (see the module doc).
#[derive(Default)]
pub(super) struct InjectState {
    saved: HashMap<SavedKey, DeviceBuffer>,
}

impl InjectState {
    /// Whether a rewrite of `site`'s B or B's scales has been set up (side-stream work of the
    /// site must then copy them: the next call rewrites them in place while it may still run).
    pub(super) fn rewrites_weights(&self, site: u64) -> bool {
        self.saved.keys().any(|(s, role, _, _)| {
            *s == site && matches!(role, Role::Operand(Operand::B) | Role::Scale(Operand::B))
        })
    }
}

/// One before-call rewrite, planned: what to save and how to rewrite it.
#[derive(Debug, Clone)]
pub(super) struct PlannedRewrite {
    pub role: Role,
    /// The caller's buffer.
    pub target: u64,
    pub bytes: usize,
    pub kernel: RewriteKernel,
}

#[derive(Debug, Clone)]
pub(super) enum RewriteKernel {
    Scale { operand: Operand, rewrite: crate::inject::ScaleRewrite },
    Permute { operand: Operand, flipped: Box<crate::problem::GemmProblem> },
}

/// What `inject_before` hands to `inject_after`: (caller's buffer, saved copy, bytes) in the
/// order the rewrites were made.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct InjectSaved {
    pub restores: Vec<(u64, u64, usize)>,
}

/// The rewrites of `request.before`, with the buffers and sizes they touch (no device work).
pub(super) fn plan_rewrites(request: &InjectRequest) -> Result<Vec<PlannedRewrite>, Skip> {
    let p = &request.call.problem;
    let buffers = &request.call.buffers;
    let mut out = vec![];
    for rewrite in &request.before {
        match rewrite {
            CallRewrite::Nothing => {}
            CallRewrite::ReplaceScale { operand, rewrite, spec, entries } => {
                let target = match operand {
                    Operand::A => buffers.a_scale,
                    Operand::B => buffers.b_scale,
                };
                if target == 0 {
                    return Err(Skip::new(format!("{} scale buffer is missing", operand.name())));
                }
                out.push(PlannedRewrite {
                    role: Role::Scale(*operand),
                    target,
                    bytes: spec.format.bytes_for(*entries as usize),
                    kernel: RewriteKernel::Scale { operand: *operand, rewrite: *rewrite },
                });
            }
            CallRewrite::FlipTranspose { operand, problem: flipped } => {
                let (target, layout, (rows, cols)) = match operand {
                    Operand::A => (buffers.a, p.a, p.a_stored_dims()),
                    Operand::B => (buffers.b, p.b, p.b_stored_dims()),
                };
                if target == 0 {
                    return Err(Skip::new(format!("{} buffer is missing", operand.name())));
                }
                if layout.format.bits() < 8 {
                    return Err(Skip::new(format!(
                        "no-transpose: {} is packed 4-bit (not applicable)",
                        operand.name()
                    )));
                }
                let elements = layout.required_elements(rows, cols, p.batch);
                out.push(PlannedRewrite {
                    role: Role::Operand(*operand),
                    target,
                    bytes: layout.format.bytes_for(elements as usize),
                    kernel: RewriteKernel::Permute { operand: *operand, flipped: flipped.clone() },
                });
            }
        }
    }
    Ok(out)
}

/// The inject program for a call: keyed by D's format, which the scale and permute entries do
/// not depend on (a packed 4-bit D has no output transforms: any program serves the others).
fn inject_build(d: Format) -> Result<KernelBuild, Skip> {
    KernelBuild::inject(d)
        .or_else(|_| KernelBuild::inject(Format::Bf16))
        .map_err(|e| Skip::new(format!("fault injection: {}", short(&e.to_string()))))
}

/// One prepared launch of a rewrite.
enum Launch {
    Scale(QsInjectParams),
    Permute(QsPermuteParams),
}

impl GpuBackend {
    pub(super) fn inject_before_impl(&self, request: &InjectRequest) -> Result<Injected, Skip> {
        let planned = plan_rewrites(request)?;
        if planned.is_empty() {
            return Ok(Injected::default());
        }
        self.same_device()?;
        if request.call.pointer_arrays.is_some() {
            return Err(Skip::new("batched pointer arrays are not injected on the GPU"));
        }
        let p = &request.call.problem;
        let stream = Stream(request.call.stream);
        let capturing = self
            .runtime
            .is_capturing(stream)
            .map_err(|e| Skip::new(format!("stream capture query: {}", short(&e.to_string()))))?;
        // Set-up (allocations, module loads) only outside a capture of this stream; relaxed mode
        // keeps it from invalidating another thread's capture.
        let _relaxed = (!capturing).then(|| RelaxedCapture::new(self.runtime.as_ref()));
        let build = inject_build(p.d.format)?;
        self.ensure_program(&build, capturing)?;
        let site = request.site_id;
        // Saved copies first (nothing is enqueued until every one exists).
        let copies: Vec<u64> = {
            let mut state = self.inject.lock().unwrap_or_else(|e| e.into_inner());
            let mut copies = Vec::with_capacity(planned.len());
            for (index, r) in planned.iter().enumerate() {
                let key = (site, r.role, index, r.bytes);
                if let Some(buf) = state.saved.get(&key) {
                    copies.push(buf.ptr);
                    continue;
                }
                if capturing {
                    return Err(Skip::new(
                        "graph capture: fault-injection scratch not set up before the capture",
                    ));
                }
                if state.saved.len() >= SAVED_COPIES_MAX {
                    return Err(Skip::new("fault-injection scratch limit reached"));
                }
                let buf = self
                    .checker
                    .alloc(r.bytes)
                    .map_err(|e| Skip::new(format!("fault-injection scratch: {}", pool_reason(&e))))?;
                copies.push(buf.ptr);
                state.saved.insert(key, buf);
            }
            copies
        };
        // Every launch's parameters, before anything touches the caller's buffers.
        let mut launches = Vec::with_capacity(planned.len());
        for (r, &saved) in planned.iter().zip(&copies) {
            let launch = match &r.kernel {
                RewriteKernel::Scale { operand, rewrite } => Launch::Scale(
                    QsInjectParams::scale(p, *operand, *rewrite, saved, r.target, 0)
                        .map_err(|e| Skip::new(format!("fault injection: {}", short(&e.to_string()))))?,
                ),
                RewriteKernel::Permute { operand, flipped } => Launch::Permute(
                    QsPermuteParams::transpose_fault(p, *operand, flipped, saved, r.target, 0)
                        .map_err(|e| Skip::new(format!("fault injection: {}", short(&e.to_string()))))?,
                ),
            };
            launches.push(launch);
        }
        let mut done = InjectSaved::default();
        for ((r, &saved), launch) in planned.iter().zip(&copies).zip(&launches) {
            if let Err(e) = self.rewrite(&build, r, saved, launch, stream) {
                // Put back what was already rewritten: the call then runs unfaulted.
                let _ = self.restore(&done, stream);
                return Err(e);
            }
            done.restores.push((r.target, saved, r.bytes));
        }
        Ok(Injected(Some(Box::new(done))))
    }

    /// Saves `r`'s buffer into `saved` and rewrites it, on `stream`. Err: the caller's buffer
    /// is unchanged (the copy only reads it; a failed launch writes nothing).
    fn rewrite(
        &self,
        build: &KernelBuild,
        r: &PlannedRewrite,
        saved: u64,
        launch: &Launch,
        stream: Stream,
    ) -> Result<(), Skip> {
        self.runtime
            .copy_async(saved, r.target, r.bytes, stream)
            .map_err(|e| Skip::new(format!("fault injection copy: {}", short(&e.to_string()))))?;
        let launched = match launch {
            Launch::Scale(params) => {
                abi::inject_scale_launch(params).map_err(|e| e.to_string()).and_then(|cfg| {
                    self.checker
                        .launch(build, "qs_inject_scale", &cfg, params, stream)
                        .map_err(|e| e.to_string())
                })
            }
            Launch::Permute(params) => {
                abi::inject_permute_launch(params).map_err(|e| e.to_string()).and_then(|cfg| {
                    self.checker
                        .launch(build, "qs_inject_permute", &cfg, params, stream)
                        .map_err(|e| e.to_string())
                })
            }
        };
        launched.map_err(|e| Skip::new(format!("fault injection launch: {}", short(&e))))
    }

    /// Copies the saved bytes back, last rewrite first; every copy is tried, the first error
    /// is returned.
    fn restore(&self, saved: &InjectSaved, stream: Stream) -> Result<(), Skip> {
        let mut first = Ok(());
        for &(target, copy, bytes) in saved.restores.iter().rev() {
            if let Err(e) = self.runtime.copy_async(target, copy, bytes, stream) {
                if first.is_ok() {
                    first = Err(Skip::new(format!("fault injection restore: {}", short(&e.to_string()))));
                }
            }
        }
        first
    }

    pub(super) fn inject_after_impl(&self, request: &InjectRequest, saved: Injected) -> Result<(), Skip> {
        let stream = Stream(request.call.stream);
        // The caller's inputs come back first, whatever happens to the output faults.
        let saved = saved.0.and_then(|b| b.downcast::<InjectSaved>().ok());
        let restored = match &saved {
            Some(s) => self.restore(s, stream),
            None => Ok(()),
        };
        let output = self.output_faults(request, stream);
        restored.and(output)
    }

    /// The output classes, in order, on D in place; the first error is returned after every
    /// class was tried.
    fn output_faults(&self, request: &InjectRequest, stream: Stream) -> Result<(), Skip> {
        if request.after.is_empty() {
            return Ok(());
        }
        self.same_device()?;
        if request.call.pointer_arrays.is_some() {
            return Err(Skip::new("batched pointer arrays are not injected on the GPU"));
        }
        let p = &request.call.problem;
        let capturing = self
            .runtime
            .is_capturing(stream)
            .map_err(|e| Skip::new(format!("stream capture query: {}", short(&e.to_string()))))?;
        let _relaxed = (!capturing).then(|| RelaxedCapture::new(self.runtime.as_ref()));
        let build = KernelBuild::inject(p.d.format)
            .map_err(|e| Skip::new(format!("fault injection: {}", short(&e.to_string()))))?;
        self.ensure_program(&build, capturing)?;
        let entry = format!("qs_inject_output_{}", p.d.format.name());
        let mut first = Ok(());
        for &class in &request.after {
            let launched = QsInjectParams::output(p, class, request.call.buffers.d, request.seed, 0)
                .map_err(|e| format!("fault injection: {}", short(&e.to_string())))
                .and_then(|params| {
                    let cfg = abi::inject_output_launch(&params)
                        .map_err(|e| format!("fault injection: {}", short(&e.to_string())))?;
                    self.checker
                        .launch(&build, &entry, &cfg, &params, stream)
                        .map_err(|e| format!("fault injection launch: {}", short(&e.to_string())))
                });
            if let (Err(e), true) = (launched, first.is_ok()) {
                first = Err(Skip::new(e));
            }
        }
        first
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inject::{plan_call, FaultClass, ScaleRewrite};
    use crate::intercept::InterceptedGemm;
    use crate::problem::{GemmBuffers, GemmProblem, ScaleGranularity, ScaleSpec, Transpose};

    fn call(p: GemmProblem) -> InterceptedGemm {
        InterceptedGemm {
            entry: "cublasLtMatmul",
            problem: p,
            buffers: GemmBuffers {
                a: 0x1000,
                b: 0x2000,
                d: 0x3000,
                a_scale: 0x4000,
                b_scale: 0x5000,
                ..Default::default()
            },
            stream: 7,
            pointer_arrays: None,
        }
    }

    fn request<'a>(c: &'a InterceptedGemm, classes: &[FaultClass]) -> InjectRequest<'a> {
        let before = classes
            .iter()
            .map(|&class| plan_call(&c.problem, class).unwrap())
            .filter(|r| *r != CallRewrite::Nothing)
            .collect();
        InjectRequest { call: c, site_id: 1, before, after: vec![], seed: 1 }
    }

    #[test]
    fn rewrites_are_planned_on_the_callers_buffers() {
        let mut p = GemmProblem::row_major(64, 96, 512, Format::E4m3fn, Format::E4m3fn, Format::Bf16);
        p.a_scale = Some(ScaleSpec::new(ScaleGranularity::Block { outer: 1, inner: 128 }, Format::F32));
        p.b_scale = Some(ScaleSpec::new(ScaleGranularity::Block { outer: 128, inner: 128 }, Format::F32));
        let c = call(p);
        let r = request(&c, &[FaultClass::ScaleTranspose, FaultClass::ScaleIgnore, FaultClass::Garbage]);
        let planned = plan_rewrites(&r).unwrap();
        assert_eq!(planned.len(), 2);
        // Both act on A's scales (64 x 4 f32 entries), in the request's order.
        assert!(planned.iter().all(|x| x.role == Role::Scale(Operand::A) && x.target == 0x4000));
        assert!(planned.iter().all(|x| x.bytes == 64 * 4 * 4));
        assert!(matches!(planned[0].kernel, RewriteKernel::Scale { rewrite: ScaleRewrite::Transposed, .. }));
        assert!(matches!(planned[1].kernel, RewriteKernel::Scale { rewrite: ScaleRewrite::Ones, .. }));
        // Output classes alone: nothing to do before the call.
        let only_after =
            InjectRequest { call: &c, site_id: 1, before: vec![], after: vec![FaultClass::Nan], seed: 0 };
        assert!(plan_rewrites(&only_after).unwrap().is_empty());
    }

    #[test]
    fn no_transpose_saves_the_whole_declared_extent() {
        let mut p = GemmProblem::row_major(16, 40, 40, Format::Bf16, Format::Bf16, Format::Bf16);
        p.trans_b = Transpose::T;
        p.batch = 2;
        p.a.batch_stride = 16 * 40;
        p.b.batch_stride = 40 * 40 + 8;
        p.d.batch_stride = 16 * 40;
        let c = call(p);
        let planned = plan_rewrites(&request(&c, &[FaultClass::NoTranspose])).unwrap();
        assert_eq!(planned.len(), 1);
        assert_eq!((planned[0].role, planned[0].target), (Role::Operand(Operand::B), 0x2000));
        assert_eq!(planned[0].bytes, (40 * 40 + 8 + 40 * 40) * 2);
        // A missing buffer is a skip, not a launch on address 0.
        let mut c0 = c.clone();
        c0.buffers.b = 0;
        assert!(plan_rewrites(&request(&c0, &[FaultClass::NoTranspose])).is_err());
    }

    #[test]
    fn program_for_any_d() {
        assert_eq!(inject_build(Format::Bf16).unwrap(), KernelBuild::inject(Format::Bf16).unwrap());
        // A packed 4-bit D still gets a program for the scale and permute entries.
        let b = inject_build(Format::E2m1).unwrap();
        assert!(b.entries.iter().any(|e| e.name == "qs_inject_permute"));
    }
}
