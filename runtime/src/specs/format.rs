//! The TOML spec format as parsed (`docs/kernel-specs.md` documents every field). Every table
//! denies unknown fields so a typo is an error, never a silently ignored line.

use crate::formats::Format;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;

/// One spec file: any number of `[[kernel]]` entries.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpecFile {
    #[serde(default)]
    pub kernel: Vec<KernelDef>,
}

/// One `[[kernel]]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelDef {
    /// Glob (`*`, `?`) on the mangled kernel name.
    pub name: String,
    /// Free text for humans (what the kernel is, where it was checked).
    #[serde(default)]
    pub note: Option<String>,
    /// Indexed launches: the accepted parameter count(s).
    #[serde(default)]
    pub params: Option<ParamCount>,
    /// Packed launches: the minimum size of the argument buffer in bytes.
    #[serde(default)]
    pub packed_bytes: Option<u64>,
    /// Named values other fields can refer to by name.
    #[serde(default)]
    pub vars: BTreeMap<String, Value>,
    pub m: Value,
    pub n: Value,
    pub k: Value,
    #[serde(default)]
    pub batch: Option<Value>,
    pub a: MatrixDef,
    pub b: MatrixDef,
    pub d: MatrixDef,
    #[serde(default)]
    pub c: Option<MatrixDef>,
    #[serde(default)]
    pub a_scale: Option<ScaleDef>,
    #[serde(default)]
    pub b_scale: Option<ScaleDef>,
    #[serde(default)]
    pub alpha: Option<Value>,
    #[serde(default)]
    pub beta: Option<Value>,
    #[serde(default)]
    pub d_scale: Option<Value>,
    #[serde(default)]
    pub bias: Option<BiasDef>,
    #[serde(default)]
    pub activation: Option<ActivationName>,
    #[serde(default)]
    pub compute: Option<ComputeName>,
    #[serde(default)]
    pub fast_accum: Option<bool>,
}

/// `params = 10` or `params = [16, 17]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum ParamCount {
    One(u32),
    AnyOf(Vec<u32>),
}

impl ParamCount {
    pub fn accepts(&self, n: usize) -> bool {
        match self {
            ParamCount::One(c) => *c as usize == n,
            ParamCount::AnyOf(v) => v.iter().any(|c| *c as usize == n),
        }
    }

    /// The smallest accepted count: every index a spec reads must be below it.
    pub fn min(&self) -> Option<u32> {
        match self {
            ParamCount::One(c) => Some(*c),
            ParamCount::AnyOf(v) => v.iter().copied().min(),
        }
    }
}

impl fmt::Display for ParamCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParamCount::One(c) => write!(f, "{c}"),
            ParamCount::AnyOf(v) => {
                let s: Vec<String> = v.iter().map(|c| c.to_string()).collect();
                write!(f, "one of [{}]", s.join(", "))
            }
        }
    }
}

/// A stored matrix (`a`, `b`, `c`, `d`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MatrixDef {
    pub ptr: Value,
    pub format: FormatName,
    /// Only for `a` and `b`: whether op() transposes the stored matrix. Weights stored N x K
    /// are `b.trans = "T"`.
    #[serde(default)]
    pub trans: Option<TransName>,
    #[serde(default)]
    pub order: Option<OrderName>,
    /// Leading dimension in elements (default: packed).
    #[serde(default)]
    pub ld: Option<Value>,
    /// Distance between batch items in elements (default: packed).
    #[serde(default)]
    pub batch_stride: Option<Value>,
}

/// Scale factors of `a` or `b`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScaleDef {
    pub ptr: Value,
    pub granularity: GranularityName,
    /// `[outer, inner]` block size for `granularity = "block"`.
    #[serde(default)]
    pub block: Option<[Value; 2]>,
    /// Scale format (default f32).
    #[serde(default)]
    pub format: Option<FormatName>,
    #[serde(default)]
    pub storage: Option<StorageName>,
    /// Leading dimension of the scale grid in entries (with `storage`; default packed).
    #[serde(default)]
    pub ld: Option<Value>,
    /// Alternative to `storage` + `ld`: the grid's strides in entries as the kernel receives
    /// them; the storage order follows from which one is 1.
    #[serde(default)]
    pub outer_stride: Option<Value>,
    #[serde(default)]
    pub inner_stride: Option<Value>,
    #[serde(default)]
    pub batch_stride: Option<Value>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BiasDef {
    pub ptr: Value,
    pub format: FormatName,
    /// `cols` (one per output column, length N: `F.linear`) or `rows` (length M).
    #[serde(default)]
    pub axis: Option<AxisName>,
    /// A null bias pointer means "no bias" instead of an unchecked launch.
    #[serde(default)]
    pub optional: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum TransName {
    N,
    T,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OrderName {
    #[serde(alias = "row-major")]
    Row,
    #[serde(alias = "col-major", alias = "column", alias = "column-major")]
    Col,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GranularityName {
    Tensor,
    #[serde(alias = "per-token", alias = "per-channel")]
    PerOuter,
    PerInner,
    Block,
    Mx32,
    Nvfp4,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StorageName {
    #[serde(alias = "row-major")]
    OuterMajor,
    #[serde(alias = "col-major", alias = "column-major")]
    InnerMajor,
    Swizzled128x4,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AxisName {
    Cols,
    Rows,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ActivationName {
    None,
    Relu,
    #[serde(alias = "gelu")]
    GeluTanh,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ComputeName {
    F32,
    F32FastF16,
    F32FastBf16,
    F32FastTf32,
    F16,
    F64,
    I32,
}

/// An element or scale format by name (`bf16`, `e4m3fn`, ...; `e4m3` = `e4m3fn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FormatName(pub Format);

impl<'de> Deserialize<'de> for FormatName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        let alias = match s.to_ascii_lowercase().as_str() {
            "e4m3" | "fp8e4m3" | "float8_e4m3fn" => Some(Format::E4m3fn),
            "float8_e4m3fnuz" => Some(Format::E4m3fnuz),
            "float8_e5m2" => Some(Format::E5m2),
            "fp32" | "float32" | "float" => Some(Format::F32),
            "fp16" | "float16" | "half" => Some(Format::F16),
            "bfloat16" => Some(Format::Bf16),
            _ => None,
        };
        alias.or_else(|| Format::from_name(&s)).map(FormatName).ok_or_else(|| {
            let names: Vec<&str> = Format::ALL.iter().map(|f| f.name()).collect();
            de::Error::custom(format!("unknown format {s:?}, expected one of {}", names.join(", ")))
        })
    }
}

/// How a parameter's bytes are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ParamType {
    I32,
    U32,
    I64,
    U64,
    Ptr,
    F32,
}

impl ParamType {
    pub fn size(self) -> usize {
        match self {
            ParamType::I32 | ParamType::U32 | ParamType::F32 => 4,
            ParamType::I64 | ParamType::U64 | ParamType::Ptr => 8,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ParamType::I32 => "i32",
            ParamType::U32 => "u32",
            ParamType::I64 => "i64",
            ParamType::U64 => "u64",
            ParamType::Ptr => "ptr",
            ParamType::F32 => "f32",
        }
    }
}

/// Where a value comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// An integer constant.
    Int(i64),
    /// A float constant (alpha, beta, d_scale).
    Float(f64),
    /// Another value by name: `m`, `n`, `k`, `batch` or a `vars` entry.
    Ref(String),
    /// Parameter `index` of an indexed launch.
    Param { index: u32, ty: ParamType, div: Option<u64> },
    /// Bytes at `offset` of a packed argument buffer.
    Offset { offset: u64, ty: ParamType, div: Option<u64> },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SourceTable {
    #[serde(default)]
    param: Option<u32>,
    #[serde(default)]
    offset: Option<u64>,
    #[serde(rename = "type")]
    ty: ParamType,
    /// Divide the value read by this (exactly), e.g. a stride in bytes into elements.
    #[serde(default)]
    div: Option<u64>,
}

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Value;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(
                    "an integer, a float, the name of another value, or a table \
                     { param = I, type = T } / { offset = BYTES, type = T }",
                )
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
                Ok(Value::Int(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
                i64::try_from(v).map(Value::Int).map_err(|_| E::custom("integer constant too large"))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
                Ok(Value::Float(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
                Ok(Value::Ref(v.to_string()))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Value, A::Error> {
                let t = SourceTable::deserialize(de::value::MapAccessDeserializer::new(map))?;
                if t.div == Some(0) {
                    return Err(de::Error::custom("div = 0"));
                }
                match (t.param, t.offset) {
                    (Some(index), None) => Ok(Value::Param { index, ty: t.ty, div: t.div }),
                    (None, Some(offset)) => Ok(Value::Offset { offset, ty: t.ty, div: t.div }),
                    _ => Err(de::Error::custom("give exactly one of `param` and `offset`")),
                }
            }
        }
        d.deserialize_any(V)
    }
}
