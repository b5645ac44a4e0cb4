//! Element and scale formats: the one table of what each format is, with exact host decoders
//! and round-to-nearest-even, saturating encoders.
//!
//! Packed 4-bit formats (e2m1, int4) hold two elements per byte, element `2i` in the low
//! nibble of byte `i` (the convention of PyTorch's `float4_e2m1fn_x2`, cuBLASLt and hipBLASLt).
//! Multi-byte formats are little-endian.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::OnceLock;

/// Every element format quantshadow can decode. The discriminants are part of the record
/// schema (`runtime/schema/quantshadow.fbs`, enum `Format`): never renumber.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[repr(u8)]
pub enum Format {
    F32 = 0,
    F16 = 1,
    Bf16 = 2,
    /// OCP FP8 E4M3 ("fn": finite, no inf): bias 7, max 448, S.1111.111 is NaN.
    E4m3fn = 3,
    /// AMD gfx942 FP8 E4M3 ("fnuz": finite, no negative zero): bias 8, max 240, 0x80 is NaN.
    E4m3fnuz = 4,
    /// OCP FP8 E5M2: IEEE-like, bias 15, inf and NaN, max 57344.
    E5m2 = 5,
    /// AMD gfx942 FP8 E5M2 fnuz: bias 16, max 57344, 0x80 is NaN, no inf.
    E5m2fnuz = 6,
    /// OCP FP4 E2M1, two per byte: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and negatives; no inf/NaN.
    E2m1 = 7,
    Int8 = 8,
    /// Signed two's-complement 4-bit integers, two per byte.
    Int4 = 9,
    /// Scale format: 2^(e-127); 0xFF is NaN; no zero, no sign (OCP MX scales).
    Ue8m0 = 10,
    /// Scale format: unsigned E4M3 (NVFP4 block scales); the sign bit is ignored.
    Ue4m3 = 11,
    /// 32-bit integer accumulator output of int8 GEMMs.
    I32 = 12,
}

/// Threshold classes (DESIGN.md "Metrics"): a check is judged by the narrowest input format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum FormatClass {
    /// bf16 / fp16 / fp32 inputs.
    Wide,
    /// FP8 / INT8 inputs.
    Fp8,
    /// FP4 / INT4 / MXFP4 / NVFP4 inputs.
    Fp4,
}

impl FormatClass {
    pub const ALL: [FormatClass; 3] = [FormatClass::Wide, FormatClass::Fp8, FormatClass::Fp4];

    pub fn name(self) -> &'static str {
        match self {
            FormatClass::Wide => "wide",
            FormatClass::Fp8 => "fp8",
            FormatClass::Fp4 => "fp4",
        }
    }

    pub fn from_name(name: &str) -> Option<FormatClass> {
        FormatClass::ALL.into_iter().find(|c| c.name() == name)
    }
}

/// Parameters of a small IEEE-like float format; the single source for the 4- and 8-bit
/// floating formats' decoders.
#[derive(Debug, Clone, Copy)]
struct MiniFloat {
    exp_bits: u32,
    man_bits: u32,
    bias: i32,
    signed: bool,
    nan: NanRule,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum NanRule {
    /// No NaN and no inf (e2m1).
    None,
    /// All exponent and mantissa bits set is NaN; no inf (e4m3fn).
    AllOnes,
    /// IEEE: max exponent with mantissa 0 is inf, otherwise NaN (e5m2).
    Ieee,
    /// The negative-zero code 0x80 is NaN; no inf (fnuz formats).
    NegativeZero,
    /// The all-ones code is NaN and there is no zero (ue8m0).
    AllOnesNoZero,
}

impl MiniFloat {
    fn decode(&self, code: u32) -> f64 {
        let total = self.exp_bits + self.man_bits + self.signed as u32;
        let code = code & ((1u32 << total) - 1);
        let sign_bit = if self.signed { (code >> (total - 1)) & 1 } else { 0 };
        let exp = (code >> self.man_bits) & ((1 << self.exp_bits) - 1);
        let man = code & ((1 << self.man_bits) - 1);
        let exp_max = (1u32 << self.exp_bits) - 1;
        let man_max = (1u32 << self.man_bits) - 1;
        match self.nan {
            NanRule::AllOnes if exp == exp_max && man == man_max => return f64::NAN,
            NanRule::Ieee if exp == exp_max => {
                return if man == 0 {
                    if sign_bit == 1 {
                        f64::NEG_INFINITY
                    } else {
                        f64::INFINITY
                    }
                } else {
                    f64::NAN
                };
            }
            NanRule::NegativeZero if sign_bit == 1 && exp == 0 && man == 0 => return f64::NAN,
            NanRule::AllOnesNoZero => {
                if exp == exp_max {
                    return f64::NAN;
                }
                return 2f64.powi(exp as i32 - self.bias);
            }
            _ => {}
        }
        let magnitude = if exp == 0 {
            // Subnormal: 0.m * 2^(1 - bias).
            man as f64 / (1u64 << self.man_bits) as f64 * 2f64.powi(1 - self.bias)
        } else {
            (1.0 + man as f64 / (1u64 << self.man_bits) as f64) * 2f64.powi(exp as i32 - self.bias)
        };
        if sign_bit == 1 {
            -magnitude
        } else {
            magnitude
        }
    }
}

const E4M3FN: MiniFloat =
    MiniFloat { exp_bits: 4, man_bits: 3, bias: 7, signed: true, nan: NanRule::AllOnes };
const E4M3FNUZ: MiniFloat =
    MiniFloat { exp_bits: 4, man_bits: 3, bias: 8, signed: true, nan: NanRule::NegativeZero };
const E5M2: MiniFloat = MiniFloat { exp_bits: 5, man_bits: 2, bias: 15, signed: true, nan: NanRule::Ieee };
const E5M2FNUZ: MiniFloat =
    MiniFloat { exp_bits: 5, man_bits: 2, bias: 16, signed: true, nan: NanRule::NegativeZero };
const E2M1: MiniFloat = MiniFloat { exp_bits: 2, man_bits: 1, bias: 1, signed: true, nan: NanRule::None };
const UE8M0: MiniFloat =
    MiniFloat { exp_bits: 8, man_bits: 0, bias: 127, signed: false, nan: NanRule::AllOnesNoZero };

/// Decoded value of every code of an 8- or 4-bit format, built once; encoders search it.
struct CodeTable {
    values: Vec<f64>,
    /// (value, code) of the finite, non-negative codes sorted by value, ties by code.
    sorted_non_negative: Vec<(f64, u32)>,
}

impl CodeTable {
    fn build(format: Format) -> CodeTable {
        let n = 1u32 << format.bits();
        let values: Vec<f64> = (0..n).map(|c| format.decode_code(c)).collect();
        let mut sorted_non_negative: Vec<(f64, u32)> = values
            .iter()
            .enumerate()
            .filter(|(c, v)| v.is_finite() && **v >= 0.0 && !is_negative_zero_code(format, *c as u32))
            .map(|(c, v)| (*v, c as u32))
            .collect();
        sorted_non_negative.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        sorted_non_negative.dedup_by(|later, earlier| later.0 == earlier.0);
        CodeTable { values, sorted_non_negative }
    }
}

fn is_negative_zero_code(format: Format, code: u32) -> bool {
    match format {
        Format::E4m3fn | Format::E5m2 | Format::E4m3fnuz | Format::E5m2fnuz => code == 0x80,
        Format::E2m1 => code == 0x8,
        _ => false,
    }
}

fn code_table(format: Format) -> &'static CodeTable {
    static TABLES: [OnceLock<CodeTable>; 13] = [const { OnceLock::new() }; 13];
    TABLES[format as usize].get_or_init(|| CodeTable::build(format))
}

impl Format {
    pub const ALL: [Format; 13] = [
        Format::F32,
        Format::F16,
        Format::Bf16,
        Format::E4m3fn,
        Format::E4m3fnuz,
        Format::E5m2,
        Format::E5m2fnuz,
        Format::E2m1,
        Format::Int8,
        Format::Int4,
        Format::Ue8m0,
        Format::Ue4m3,
        Format::I32,
    ];

    /// Canonical lower-case name, used in specs, reports and the CLI.
    pub fn name(self) -> &'static str {
        match self {
            Format::F32 => "f32",
            Format::F16 => "f16",
            Format::Bf16 => "bf16",
            Format::E4m3fn => "e4m3fn",
            Format::E4m3fnuz => "e4m3fnuz",
            Format::E5m2 => "e5m2",
            Format::E5m2fnuz => "e5m2fnuz",
            Format::E2m1 => "e2m1",
            Format::Int8 => "int8",
            Format::Int4 => "int4",
            Format::Ue8m0 => "ue8m0",
            Format::Ue4m3 => "ue4m3",
            Format::I32 => "i32",
        }
    }

    pub fn from_name(name: &str) -> Option<Format> {
        let lower = name.to_ascii_lowercase();
        Format::ALL.into_iter().find(|f| f.name() == lower)
    }

    pub fn from_u8(v: u8) -> Option<Format> {
        Format::ALL.get(v as usize).copied()
    }

    pub fn bits(self) -> u32 {
        match self {
            Format::F32 | Format::I32 => 32,
            Format::F16 | Format::Bf16 => 16,
            Format::E2m1 | Format::Int4 => 4,
            _ => 8,
        }
    }

    /// Bytes needed for `count` elements (packed formats round up to whole bytes).
    pub fn bytes_for(self, count: usize) -> usize {
        count.saturating_mul(self.bits() as usize).div_ceil(8)
    }

    pub fn is_integer(self) -> bool {
        matches!(self, Format::Int8 | Format::Int4 | Format::I32)
    }

    pub fn is_scale_only(self) -> bool {
        matches!(self, Format::Ue8m0 | Format::Ue4m3)
    }

    /// Class used to pick default thresholds.
    pub fn class(self) -> FormatClass {
        match self.bits() {
            4 => FormatClass::Fp4,
            8 => FormatClass::Fp8,
            _ if self == Format::I32 => FormatClass::Fp8,
            _ => FormatClass::Wide,
        }
    }

    /// Largest finite value.
    pub fn max_finite(self) -> f64 {
        match self {
            Format::F32 => f32::MAX as f64,
            Format::F16 => 65504.0,
            Format::Bf16 => half::bf16::MAX.to_f64(),
            Format::E4m3fn | Format::Ue4m3 => 448.0,
            Format::E4m3fnuz => 240.0,
            Format::E5m2 | Format::E5m2fnuz => 57344.0,
            Format::E2m1 => 6.0,
            Format::Int8 => 127.0,
            Format::Int4 => 7.0,
            Format::Ue8m0 => 2f64.powi(127),
            Format::I32 => i32::MAX as f64,
        }
    }

    /// Value of one code (the low `bits()` bits of `code` are used).
    pub fn decode_code(self, code: u32) -> f64 {
        match self {
            Format::F32 => f32::from_bits(code) as f64,
            Format::F16 => half::f16::from_bits(code as u16).to_f64(),
            Format::Bf16 => half::bf16::from_bits(code as u16).to_f64(),
            Format::E4m3fn => E4M3FN.decode(code),
            Format::E4m3fnuz => E4M3FNUZ.decode(code),
            Format::E5m2 => E5M2.decode(code),
            Format::E5m2fnuz => E5M2FNUZ.decode(code),
            Format::E2m1 => E2M1.decode(code),
            Format::Int8 => (code as u8) as i8 as f64,
            Format::Int4 => (((code & 0xF) as u8) << 4) as i8 as f64 / 16.0,
            Format::Ue8m0 => UE8M0.decode(code),
            Format::Ue4m3 => E4M3FN.decode(code & 0x7F),
            Format::I32 => code as i32 as f64,
        }
    }

    /// Code of element `index` in `bytes`. Panics if out of range: callers check extents first.
    pub fn load_code(self, bytes: &[u8], index: usize) -> u32 {
        match self.bits() {
            4 => {
                let byte = bytes[index / 2];
                if index & 1 == 0 {
                    (byte & 0xF) as u32
                } else {
                    (byte >> 4) as u32
                }
            }
            8 => bytes[index] as u32,
            16 => u16::from_le_bytes([bytes[2 * index], bytes[2 * index + 1]]) as u32,
            _ => u32::from_le_bytes(bytes[4 * index..4 * index + 4].try_into().unwrap()),
        }
    }

    /// Decoded value of element `index` in `bytes`.
    pub fn load(self, bytes: &[u8], index: usize) -> f64 {
        self.decode_code(self.load_code(bytes, index))
    }

    /// Writes one code as element `index` of `bytes`.
    pub fn store_code(self, bytes: &mut [u8], index: usize, code: u32) {
        match self.bits() {
            4 => {
                let byte = &mut bytes[index / 2];
                if index & 1 == 0 {
                    *byte = (*byte & 0xF0) | (code as u8 & 0xF);
                } else {
                    *byte = (*byte & 0x0F) | ((code as u8 & 0xF) << 4);
                }
            }
            8 => bytes[index] = code as u8,
            16 => bytes[2 * index..2 * index + 2].copy_from_slice(&(code as u16).to_le_bytes()),
            _ => bytes[4 * index..4 * index + 4].copy_from_slice(&code.to_le_bytes()),
        }
    }

    /// Encodes `value` with round-to-nearest-even. The 4/8-bit and integer formats saturate to
    /// +-max_finite (as quantization kernels do with `satfinite`); f32/f16/bf16 follow IEEE
    /// (overflow to inf). NaN maps to the format's NaN code, or 0 where it has none.
    pub fn encode(self, value: f64) -> u32 {
        match self {
            Format::F32 => (value as f32).to_bits(),
            // Via f32 with round-to-odd: one correct rounding from f64 (half's from_f64 rounds
            // twice on some CPUs and drops the low bits for bf16).
            Format::F16 => half::f16::from_f32(f64_to_f32_round_to_odd(value)).to_bits() as u32,
            Format::Bf16 => half::bf16::from_f32(f64_to_f32_round_to_odd(value)).to_bits() as u32,
            Format::Int8 | Format::Int4 | Format::I32 => {
                if value.is_nan() {
                    return 0;
                }
                let max = self.max_finite();
                let q = value.round_ties_even().clamp(-max - 1.0, max) as i64;
                (q as u32) & (u32::MAX >> (32 - self.bits()))
            }
            _ => self.encode_minifloat(value),
        }
    }

    /// Encode then decode: the value the format actually stores for `value`.
    pub fn round(self, value: f64) -> f64 {
        self.decode_code(self.encode(value))
    }

    fn encode_minifloat(self, value: f64) -> u32 {
        let table = code_table(self);
        if value.is_nan() {
            return table.values.iter().position(|v| v.is_nan()).unwrap_or(0) as u32;
        }
        let signed = !matches!(self, Format::Ue8m0 | Format::Ue4m3);
        let negative = value.is_sign_negative() && signed;
        let magnitude = if signed { value.abs() } else { value.max(0.0) };
        let sorted = &table.sorted_non_negative;
        // First entry >= magnitude; ties between neighbours go to the even code.
        let upper = sorted.partition_point(|(v, _)| *v < magnitude);
        let (_, code) = if upper == sorted.len() {
            sorted[sorted.len() - 1]
        } else if upper == 0 {
            sorted[0]
        } else {
            let (lo, hi) = (sorted[upper - 1], sorted[upper]);
            let (dlo, dhi) = (magnitude - lo.0, hi.0 - magnitude);
            if dlo < dhi || (dlo == dhi && lo.1 % 2 == 0) {
                lo
            } else {
                hi
            }
        };
        if !negative || code == 0 {
            // Negative values that round to zero become +0 (fnuz formats have no -0).
            if negative && code == 0 && !matches!(self, Format::E4m3fnuz | Format::E5m2fnuz) {
                return self.sign_bit();
            }
            return code;
        }
        code | self.sign_bit()
    }

    fn sign_bit(self) -> u32 {
        1 << (self.bits() - 1)
    }
}

/// f64 -> f32 rounding to odd: a later f32 -> f16/bf16 round-to-nearest-even then equals a
/// single correct rounding of the f64 (the f32 keeps a sticky bit below the narrow mantissa).
fn f64_to_f32_round_to_odd(value: f64) -> f32 {
    let nearest = value as f32;
    if nearest as f64 == value || !value.is_finite() || nearest.is_infinite() {
        return nearest;
    }
    let bits = nearest.to_bits();
    if bits & 1 == 1 {
        return nearest;
    }
    let away_from_zero = (nearest as f64).abs() < value.abs();
    f32::from_bits(if away_from_zero { bits + 1 } else { bits - 1 })
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for f in Format::ALL {
            assert_eq!(Format::from_name(f.name()), Some(f));
            assert_eq!(Format::from_u8(f as u8), Some(f));
        }
    }

    #[test]
    fn headline_values() {
        assert_eq!(Format::E4m3fn.decode_code(0x7E), 448.0);
        assert!(Format::E4m3fn.decode_code(0x7F).is_nan());
        assert_eq!(Format::E4m3fnuz.decode_code(0x7F), 240.0);
        assert!(Format::E4m3fnuz.decode_code(0x80).is_nan());
        assert_eq!(Format::E5m2.decode_code(0x7C), f64::INFINITY);
        assert_eq!(Format::Ue8m0.decode_code(127), 1.0);
        assert_eq!(Format::E2m1.decode_code(0x7), 6.0);
        assert_eq!(Format::Int4.decode_code(0x8), -8.0);
    }
}
