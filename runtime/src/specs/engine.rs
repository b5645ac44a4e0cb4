//! Load-time checking of a `[[kernel]]` entry and decoding of one launch through it.
//!
//! Everything that can be known from the spec alone is checked when it loads (references,
//! value kinds, parameter indices below the declared count, offsets inside the declared buffer
//! size), so decoding only has to compare the spec against the launch: a launch that does not
//! fit is a [`SpecError::Mismatch`] before any value is interpreted.

use super::format::*;
use super::glob::Glob;
use super::{DecodedLaunch, LaunchArgs, LaunchView, SpecError};
use crate::problem::{
    Activation, Bias, BiasAxis, ComputeType, Epilogue, GemmBuffers, GemmProblem, MatrixLayout, Order, Scalar,
    ScaleGranularity, ScaleSpec, ScaleStorage, Transpose,
};

/// What a field needs from its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Int,
    Float,
    Ptr,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Int => "an integer",
            Kind::Float => "a float",
            Kind::Ptr => "a pointer",
        }
    }
}

/// What a field accepts.
#[derive(Debug, Clone, Copy)]
enum Expect {
    Int,
    Ptr,
    /// alpha, beta, d_scale: an integer or a float.
    Number,
    /// A `vars` entry: anything.
    Any,
}

/// Names a `Ref` may use besides `vars`.
const BUILTIN_REFS: [&str; 4] = ["m", "n", "k", "batch"];
/// Deepest chain of references followed (the load-time cycle check keeps real chains short).
const MAX_REF_DEPTH: usize = 16;

/// A `[[kernel]]` entry that passed the load-time checks.
#[derive(Debug)]
pub(crate) struct CompiledSpec {
    pub origin: String,
    pub glob: Glob,
    pub def: KernelDef,
    /// Every parameter / buffer read of the spec with the field that makes it.
    reads: Vec<(String, Value)>,
}

impl CompiledSpec {
    pub fn compile(def: KernelDef, origin: &str) -> Result<CompiledSpec, String> {
        let glob = Glob::new(&def.name).map_err(|e| format!("kernel {:?}: {e}", def.name))?;
        let ctx = |msg: String| format!("kernel {:?}: {msg}", def.name);
        let packed = match (&def.params, def.packed_bytes) {
            (Some(p), None) => {
                if p.min().is_none() {
                    return Err(ctx("params: empty list".into()));
                }
                false
            }
            (None, Some(_)) => true,
            _ => {
                return Err(ctx("give exactly one of `params` (indexed) and `packed_bytes` (packed)".into()))
            }
        };
        for name in def.vars.keys() {
            if BUILTIN_REFS.contains(&name.as_str()) {
                return Err(ctx(format!("vars.{name}: `{name}` is a built-in name")));
            }
        }
        for (what, m) in [("c", &def.c), ("d", &Some(def.d.clone()))] {
            if m.as_ref().is_some_and(|m| m.trans == Some(TransName::T)) {
                return Err(ctx(format!("{what}.trans: only a and b can be transposed")));
            }
        }
        if def.c.is_some() != def.beta.is_some() {
            return Err(ctx("`c` and `beta` go together (beta scales the C matrix)".into()));
        }
        for (what, s) in [("a_scale", &def.a_scale), ("b_scale", &def.b_scale)] {
            let Some(s) = s else { continue };
            if (s.granularity == GranularityName::Block) != s.block.is_some() {
                return Err(ctx(format!("{what}.block: required with granularity = \"block\", only then")));
            }
            let strided = s.outer_stride.is_some() || s.inner_stride.is_some();
            if strided && (s.outer_stride.is_none() || s.inner_stride.is_none()) {
                return Err(ctx(format!("{what}: give both outer_stride and inner_stride")));
            }
            if strided && (s.storage.is_some() || s.ld.is_some()) {
                return Err(ctx(format!("{what}: outer_stride/inner_stride replace storage and ld")));
            }
        }

        let mut fields: Vec<(String, &Value, Expect)> = vec![
            ("m".into(), &def.m, Expect::Int),
            ("n".into(), &def.n, Expect::Int),
            ("k".into(), &def.k, Expect::Int),
        ];
        if let Some(b) = &def.batch {
            fields.push(("batch".into(), b, Expect::Int));
        }
        for (name, v) in &def.vars {
            fields.push((format!("vars.{name}"), v, Expect::Any));
        }
        let mats = [("a", Some(&def.a)), ("b", Some(&def.b)), ("c", def.c.as_ref()), ("d", Some(&def.d))];
        for (what, m) in mats {
            let Some(m) = m else { continue };
            fields.push((format!("{what}.ptr"), &m.ptr, Expect::Ptr));
            if let Some(v) = &m.ld {
                fields.push((format!("{what}.ld"), v, Expect::Int));
            }
            if let Some(v) = &m.batch_stride {
                fields.push((format!("{what}.batch_stride"), v, Expect::Int));
            }
        }
        for (what, s) in [("a_scale", &def.a_scale), ("b_scale", &def.b_scale)] {
            let Some(s) = s else { continue };
            fields.push((format!("{what}.ptr"), &s.ptr, Expect::Ptr));
            if let Some([o, i]) = &s.block {
                fields.push((format!("{what}.block[0]"), o, Expect::Int));
                fields.push((format!("{what}.block[1]"), i, Expect::Int));
            }
            for (f, v) in [
                ("ld", &s.ld),
                ("outer_stride", &s.outer_stride),
                ("inner_stride", &s.inner_stride),
                ("batch_stride", &s.batch_stride),
            ] {
                if let Some(v) = v {
                    fields.push((format!("{what}.{f}"), v, Expect::Int));
                }
            }
        }
        for (what, v) in [("alpha", &def.alpha), ("beta", &def.beta), ("d_scale", &def.d_scale)] {
            if let Some(v) = v {
                fields.push((what.into(), v, Expect::Number));
            }
        }
        if let Some(b) = &def.bias {
            fields.push(("bias.ptr".into(), &b.ptr, Expect::Ptr));
        }

        let mut reads = Vec::new();
        for (field, v, expect) in &fields {
            let kind = kind_of(&def, v, 0).map_err(|e| ctx(format!("{field}: {e}")))?;
            let ok = match expect {
                Expect::Int => kind == Kind::Int,
                Expect::Ptr => kind == Kind::Ptr,
                Expect::Number => kind != Kind::Ptr,
                Expect::Any => true,
            };
            if !ok {
                return Err(ctx(format!(
                    "{field}: needs {} value, this one is {}",
                    expect_name(*expect),
                    kind.name()
                )));
            }
            match v {
                Value::Param { index, .. } => {
                    if packed {
                        return Err(ctx(format!("{field}: `param` in a packed spec (use `offset`)")));
                    }
                    let min = def.params.as_ref().and_then(|p| p.min()).unwrap_or(0);
                    if *index >= min {
                        return Err(ctx(format!(
                            "{field}: parameter {index} but the kernel has {min} parameters"
                        )));
                    }
                    reads.push((field.clone(), (*v).clone()));
                }
                Value::Offset { offset, ty, .. } => {
                    let Some(size) = def.packed_bytes else {
                        return Err(ctx(format!("{field}: `offset` in an indexed spec (use `param`)")));
                    };
                    if offset.checked_add(ty.size() as u64).is_none_or(|end| end > size) {
                        return Err(ctx(format!(
                            "{field}: bytes {offset}..{} lie outside packed_bytes = {size}",
                            offset.saturating_add(ty.size() as u64)
                        )));
                    }
                    reads.push((field.clone(), (*v).clone()));
                }
                _ => {}
            }
        }
        Ok(CompiledSpec { origin: origin.to_string(), glob, def, reads })
    }

    fn here(&self) -> String {
        format!("spec {} [{}]", self.origin, self.def.name)
    }

    fn mismatch(&self, field: &str, msg: impl std::fmt::Display) -> SpecError {
        SpecError::Mismatch(format!("{}: {field}: {msg}", self.here()))
    }

    fn skip(&self, field: &str, msg: impl std::fmt::Display) -> SpecError {
        SpecError::Skip(format!("{}: {field}: {msg}", self.here()))
    }

    /// Compares the spec with the launch's argument extents; nothing is interpreted yet.
    fn check_fit(&self, args: &LaunchArgs) -> Result<(), SpecError> {
        match (args, &self.def.params, self.def.packed_bytes) {
            (LaunchArgs::Indexed(params), Some(count), None) => {
                if !count.accepts(params.len()) {
                    return Err(self.mismatch(
                        "params",
                        format!("the launch has {} parameters, the spec expects {count}", params.len()),
                    ));
                }
            }
            (LaunchArgs::Packed(buf), None, Some(size)) => {
                if (buf.len() as u64) < size {
                    return Err(self.mismatch(
                        "packed_bytes",
                        format!(
                            "the launch's argument buffer has {} bytes, the spec needs {size}",
                            buf.len()
                        ),
                    ));
                }
            }
            (LaunchArgs::Indexed(_), ..) => {
                return Err(self
                    .mismatch("packed_bytes", "the launch passes indexed parameters, not a packed buffer"))
            }
            (LaunchArgs::Packed(_), ..) => {
                return Err(
                    self.mismatch("params", "the launch passes a packed argument buffer, not parameters")
                )
            }
        }
        for (field, v) in &self.reads {
            self.bytes(args, field, v)?;
        }
        Ok(())
    }

    /// The bytes a source reads, only when the launch justifies them.
    fn bytes<'a>(&self, args: &LaunchArgs<'a>, field: &str, v: &Value) -> Result<&'a [u8], SpecError> {
        match (v, args) {
            (Value::Param { index, ty, .. }, LaunchArgs::Indexed(params)) => {
                let i = *index as usize;
                let Some(p) = params.get(i) else {
                    return Err(
                        self.mismatch(field, format!("parameter {i} but the launch has {}", params.len()))
                    );
                };
                if p.len() != ty.size() {
                    return Err(self.mismatch(
                        field,
                        format!(
                            "parameter {i} is {} bytes, the spec reads it as {} ({} bytes)",
                            p.len(),
                            ty.name(),
                            ty.size()
                        ),
                    ));
                }
                Ok(p)
            }
            (Value::Offset { offset, ty, .. }, LaunchArgs::Packed(buf)) => {
                let start = usize::try_from(*offset).ok();
                let range = start.and_then(|s| Some(s..s.checked_add(ty.size())?));
                match range.and_then(|r| buf.get(r)) {
                    Some(b) => Ok(b),
                    None => Err(self.mismatch(
                        field,
                        format!("{} at offset {offset} lies past the {}-byte buffer", ty.name(), buf.len()),
                    )),
                }
            }
            _ => Err(self.mismatch(field, "source kind does not fit the launch")),
        }
    }

    fn eval(&self, args: &LaunchArgs, field: &str, v: &Value, depth: usize) -> Result<Num, SpecError> {
        if depth > MAX_REF_DEPTH {
            return Err(self.mismatch(field, "references nest too deeply"));
        }
        let (raw, div) = match v {
            Value::Int(i) => return Ok(Num::I(*i as i128)),
            Value::Float(f) => return Ok(Num::F(*f)),
            Value::Ref(name) => {
                let target =
                    ref_target(&self.def, name).ok_or_else(|| self.mismatch(field, "unknown name"))?;
                return self.eval(args, field, target, depth + 1);
            }
            Value::Param { ty, div, .. } | Value::Offset { ty, div, .. } => {
                (read_typed(self.bytes(args, field, v)?, *ty), *div)
            }
        };
        match (raw, div) {
            (Num::I(x), Some(d)) => {
                let d = d as i128;
                if x % d != 0 {
                    return Err(self.skip(field, format!("{x} is not a multiple of div = {d}")));
                }
                Ok(Num::I(x / d))
            }
            (n, _) => Ok(n),
        }
    }

    fn uint(&self, args: &LaunchArgs, field: &str, v: &Value) -> Result<u64, SpecError> {
        match self.eval(args, field, v, 0)? {
            Num::I(x) => u64::try_from(x).map_err(|_| self.skip(field, format!("{x} is negative"))),
            Num::F(_) => Err(self.mismatch(field, "a float where an integer belongs")),
        }
    }

    fn float(&self, args: &LaunchArgs, field: &str, v: &Value) -> Result<f64, SpecError> {
        Ok(match self.eval(args, field, v, 0)? {
            Num::I(x) => x as f64,
            Num::F(f) => f,
        })
    }

    fn ptr(&self, args: &LaunchArgs, field: &str, v: &Value) -> Result<u64, SpecError> {
        self.uint(args, field, v)
    }

    fn opt_uint(&self, args: &LaunchArgs, field: &str, v: &Option<Value>) -> Result<Option<u64>, SpecError> {
        v.as_ref().map(|v| self.uint(args, field, v)).transpose()
    }

    /// The weight operand's (B's) address alone, where the launch's arguments hold it: what
    /// tells apart the layers that share one kernel and grid (per-site sampling).
    pub fn weight_ptr(&self, args: &LaunchArgs) -> Option<u64> {
        self.ptr(args, "b.ptr", &self.def.b.ptr).ok()
    }

    /// Where the weight's address is read from (the parameter index of an indexed launch).
    pub fn weight_param(&self) -> Option<u32> {
        match self.def.b.ptr {
            Value::Param { index, .. } => Some(index),
            _ => None,
        }
    }

    /// Reads the launch into the problem model.
    pub fn decode(&self, launch: &LaunchView) -> Result<DecodedLaunch, SpecError> {
        let args = &launch.args;
        self.check_fit(args)?;
        let def = &self.def;
        let m = self.uint(args, "m", &def.m)?;
        let n = self.uint(args, "n", &def.n)?;
        let k = self.uint(args, "k", &def.k)?;
        let batch = match &def.batch {
            Some(v) => self.uint(args, "batch", v)?,
            None => 1,
        };
        let trans_a = trans(def.a.trans);
        let trans_b = trans(def.b.trans);
        let a_dims = match trans_a {
            Transpose::N => (m, k),
            Transpose::T => (k, m),
        };
        let b_dims = match trans_b {
            Transpose::N => (k, n),
            Transpose::T => (n, k),
        };
        let mut buffers = GemmBuffers::default();
        let a = self.matrix(args, "a", &def.a, a_dims, batch, &mut buffers.a)?;
        let b = self.matrix(args, "b", &def.b, b_dims, batch, &mut buffers.b)?;
        let d = self.matrix(args, "d", &def.d, (m, n), batch, &mut buffers.d)?;

        let mut problem = GemmProblem::row_major(m, n, k, a.format, b.format, d.format);
        problem.batch = batch;
        problem.trans_a = trans_a;
        problem.trans_b = trans_b;
        problem.a = a;
        problem.b = b;
        problem.d = d;
        if let Some(alpha) = &def.alpha {
            problem.alpha = Scalar::Host(self.float(args, "alpha", alpha)?);
        }
        if let (Some(c), Some(beta)) = (&def.c, &def.beta) {
            let beta = self.float(args, "beta", beta)?;
            let mut c_ptr = 0;
            let layout = self.matrix_nullable(args, "c", c, (m, n), batch, &mut c_ptr)?;
            if beta != 0.0 {
                if c_ptr == 0 {
                    return Err(self.skip("c.ptr", "null C with a non-zero beta"));
                }
                problem.c = Some(layout);
                problem.beta = Scalar::Host(beta);
                buffers.c = c_ptr;
            }
        }
        if let Some(v) = &def.d_scale {
            problem.d_scale = Some(Scalar::Host(self.float(args, "d_scale", v)?));
        }
        problem.a_scale = self.scale(args, "a_scale", &def.a_scale, (m, k), &mut buffers.a_scale)?;
        problem.b_scale = self.scale(args, "b_scale", &def.b_scale, (n, k), &mut buffers.b_scale)?;
        if let Some(bias) = &def.bias {
            let ptr = self.ptr(args, "bias.ptr", &bias.ptr)?;
            if ptr == 0 && !bias.optional {
                return Err(
                    self.skip("bias.ptr", "null pointer (set `optional = true` if null means no bias)")
                );
            }
            if ptr != 0 {
                let axis = match bias.axis {
                    Some(AxisName::Rows) => BiasAxis::Rows,
                    _ => BiasAxis::Cols,
                };
                problem.epilogue.bias = Some(Bias { format: bias.format.0, axis });
                buffers.bias = ptr;
            }
        }
        problem.epilogue = Epilogue {
            bias: problem.epilogue.bias,
            activation: match def.activation {
                None | Some(ActivationName::None) => Activation::None,
                Some(ActivationName::Relu) => Activation::Relu,
                Some(ActivationName::GeluTanh) => Activation::GeluTanh,
            },
        };
        problem.compute = match def.compute.unwrap_or(ComputeName::F32) {
            ComputeName::F32 => ComputeType::F32,
            ComputeName::F32FastF16 => ComputeType::F32FastF16,
            ComputeName::F32FastBf16 => ComputeType::F32FastBf16,
            ComputeName::F32FastTf32 => ComputeType::F32FastTf32,
            ComputeName::F16 => ComputeType::F16,
            ComputeName::F64 => ComputeType::F64,
            ComputeName::I32 => ComputeType::I32,
        };
        problem.fast_accum = def.fast_accum.unwrap_or(false);
        problem.validate().map_err(|e| self.skip("problem", e))?;
        Ok(DecodedLaunch { problem, buffers })
    }

    fn matrix(
        &self,
        args: &LaunchArgs,
        what: &str,
        m: &MatrixDef,
        dims: (u64, u64),
        batch: u64,
        ptr_out: &mut u64,
    ) -> Result<MatrixLayout, SpecError> {
        let layout = self.matrix_nullable(args, what, m, dims, batch, ptr_out)?;
        if *ptr_out == 0 {
            return Err(self.skip(&format!("{what}.ptr"), "null pointer"));
        }
        Ok(layout)
    }

    fn matrix_nullable(
        &self,
        args: &LaunchArgs,
        what: &str,
        m: &MatrixDef,
        (rows, cols): (u64, u64),
        batch: u64,
        ptr_out: &mut u64,
    ) -> Result<MatrixLayout, SpecError> {
        *ptr_out = self.ptr(args, &format!("{what}.ptr"), &m.ptr)?;
        let order = match m.order {
            Some(OrderName::Col) => Order::ColMajor,
            _ => Order::RowMajor,
        };
        let (minor, major) = match order {
            Order::RowMajor => (cols, rows),
            Order::ColMajor => (rows, cols),
        };
        let ld = self.opt_uint(args, &format!("{what}.ld"), &m.ld)?.unwrap_or(minor);
        let batch_stride = match self.opt_uint(args, &format!("{what}.batch_stride"), &m.batch_stride)? {
            Some(s) => s,
            None if batch > 1 => {
                ld.checked_mul(major).ok_or_else(|| self.skip(&format!("{what}.batch_stride"), "overflow"))?
            }
            None => 0,
        };
        Ok(MatrixLayout { format: m.format.0, order, ld, batch_stride })
    }

    fn scale(
        &self,
        args: &LaunchArgs,
        what: &str,
        s: &Option<ScaleDef>,
        (outer, inner): (u64, u64),
        ptr_out: &mut u64,
    ) -> Result<Option<ScaleSpec>, SpecError> {
        let Some(s) = s else { return Ok(None) };
        let ptr = self.ptr(args, &format!("{what}.ptr"), &s.ptr)?;
        if ptr == 0 {
            return Err(self.skip(&format!("{what}.ptr"), "null pointer"));
        }
        *ptr_out = ptr;
        let granularity = match s.granularity {
            GranularityName::Tensor => ScaleGranularity::Tensor,
            GranularityName::PerOuter => ScaleGranularity::PerOuter,
            GranularityName::PerInner => ScaleGranularity::PerInner,
            GranularityName::Mx32 => ScaleGranularity::Mx32,
            GranularityName::Nvfp4 => ScaleGranularity::Nvfp4,
            GranularityName::Block => {
                let [o, i] = s.block.as_ref().expect("checked at load");
                let bo = self.uint(args, &format!("{what}.block[0]"), o)?;
                let bi = self.uint(args, &format!("{what}.block[1]"), i)?;
                let fit = |f: &str, v: u64| {
                    u32::try_from(v)
                        .ok()
                        .filter(|v| *v > 0)
                        .ok_or_else(|| self.skip(&format!("{what}.{f}"), format!("block size {v}")))
                };
                ScaleGranularity::Block { outer: fit("block[0]", bo)?, inner: fit("block[1]", bi)? }
            }
        };
        let format = s.format.map_or(crate::formats::Format::F32, |f| f.0);
        let (storage, ld) = if let (Some(os), Some(is)) = (&s.outer_stride, &s.inner_stride) {
            let os = self.uint(args, &format!("{what}.outer_stride"), os)?;
            let is = self.uint(args, &format!("{what}.inner_stride"), is)?;
            let (go, gi) = granularity.grid(outer, inner);
            if is == 1 && (go == 1 || os >= gi) {
                (ScaleStorage::OuterMajor, if go == 1 { gi } else { os })
            } else if os == 1 && (gi == 1 || is >= go) {
                (ScaleStorage::InnerMajor, if gi == 1 { go } else { is })
            } else {
                return Err(self.skip(
                    what,
                    format!("strides (outer {os}, inner {is}) over a {go}x{gi} grid are neither outer- nor inner-major"),
                ));
            }
        } else {
            let storage = match s.storage {
                None | Some(StorageName::OuterMajor) => ScaleStorage::OuterMajor,
                Some(StorageName::InnerMajor) => ScaleStorage::InnerMajor,
                Some(StorageName::Swizzled128x4) => ScaleStorage::Swizzled128x4,
            };
            (storage, self.opt_uint(args, &format!("{what}.ld"), &s.ld)?.unwrap_or(0))
        };
        let batch_stride =
            self.opt_uint(args, &format!("{what}.batch_stride"), &s.batch_stride)?.unwrap_or(0);
        Ok(Some(ScaleSpec { granularity, format, storage, ld, batch_stride }))
    }
}

#[derive(Debug, Clone, Copy)]
enum Num {
    I(i128),
    F(f64),
}

fn trans(t: Option<TransName>) -> Transpose {
    match t {
        Some(TransName::T) => Transpose::T,
        _ => Transpose::N,
    }
}

fn expect_name(e: Expect) -> &'static str {
    match e {
        Expect::Int => "an integer",
        Expect::Ptr => "a pointer (type = \"ptr\")",
        Expect::Number => "a numeric",
        Expect::Any => "any",
    }
}

fn ref_target<'a>(def: &'a KernelDef, name: &str) -> Option<&'a Value> {
    match name {
        "m" => Some(&def.m),
        "n" => Some(&def.n),
        "k" => Some(&def.k),
        "batch" => def.batch.as_ref(),
        _ => def.vars.get(name),
    }
}

/// The kind of a value, following references (which also finds unknown names and cycles).
fn kind_of(def: &KernelDef, v: &Value, depth: usize) -> Result<Kind, String> {
    if depth > MAX_REF_DEPTH {
        return Err("references form a cycle (or nest deeper than 16)".into());
    }
    Ok(match v {
        Value::Int(_) => Kind::Int,
        Value::Float(_) => Kind::Float,
        Value::Ref(name) => {
            let target = ref_target(def, name)
                .ok_or_else(|| format!("unknown name {name:?} (m, n, k, batch or a `vars` entry)"))?;
            kind_of(def, target, depth + 1)?
        }
        Value::Param { ty, div, .. } | Value::Offset { ty, div, .. } => {
            let kind = match ty {
                ParamType::Ptr => Kind::Ptr,
                ParamType::F32 => Kind::Float,
                _ => Kind::Int,
            };
            if div.is_some() && kind != Kind::Int {
                return Err(format!("div applies to integers, not {}", ty.name()));
            }
            kind
        }
    })
}

fn read_typed(b: &[u8], ty: ParamType) -> Num {
    let mut w = [0u8; 8];
    w[..b.len().min(8)].copy_from_slice(&b[..b.len().min(8)]);
    let w4 = [w[0], w[1], w[2], w[3]];
    match ty {
        ParamType::I32 => Num::I(i32::from_ne_bytes(w4) as i128),
        ParamType::U32 => Num::I(u32::from_ne_bytes(w4) as i128),
        ParamType::F32 => Num::F(f32::from_ne_bytes(w4) as f64),
        ParamType::I64 => Num::I(i64::from_ne_bytes(w) as i128),
        ParamType::U64 | ParamType::Ptr => Num::I(u64::from_ne_bytes(w) as i128),
    }
}
