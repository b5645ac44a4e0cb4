//! Pass/fail rules per format class (DESIGN.md defaults), overridable from a TOML file:
//!
//! ```toml
//! [fp8]
//! cosine_min = 0.9995
//! nmse_max = 1e-3
//! norm_ratio_tol = 0.01
//! row_cosine_min = 0.99
//! logits_kl_max = 1e-3
//! ```
//! Sections: `wide` (bf16/fp16/fp32), `fp8` (FP8/INT8), `fp4` (FP4/INT4/MXFP4/NVFP4); keys not
//! given keep their defaults. Unknown sections or keys are errors, so a typo never silently
//! loosens a check.

use crate::formats::FormatClass;
use crate::metrics::{LogitsMetrics, Metrics};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassThresholds {
    pub cosine_min: f64,
    pub nmse_max: f64,
    /// Largest allowed |1 - norm ratio|.
    pub norm_ratio_tol: f64,
    /// Lowest allowed cosine of the worst row: whole-tensor metrics dilute a few bad rows
    /// (one wrong row in 4096 moves NMSE by ~5e-4), a per-row bound does not.
    pub row_cosine_min: f64,
    /// Largest allowed KL(ref || prod) in nats of a logits row (LM heads).
    pub logits_kl_max: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Thresholds {
    pub wide: ClassThresholds,
    pub fp8: ClassThresholds,
    pub fp4: ClassThresholds,
}

impl Default for Thresholds {
    fn default() -> Self {
        // Cosine bounds are DESIGN.md's; NMSE ~ 2 (1 - cosine) for an unbiased error, and the
        // norm-ratio bound catches magnitude bugs that cosine cannot see (the 2x fn/fnuz case).
        // Per-row bounds are looser than whole-tensor ones: a row has fewer elements, so its
        // honest rounding noise averages out less (and short rows are noisier still).
        Thresholds {
            wide: ClassThresholds {
                cosine_min: 0.99999,
                nmse_max: 2e-5,
                norm_ratio_tol: 0.002,
                row_cosine_min: 0.9999,
                logits_kl_max: 1e-4,
            },
            fp8: ClassThresholds {
                cosine_min: 0.999,
                nmse_max: 2e-3,
                norm_ratio_tol: 0.01,
                row_cosine_min: 0.99,
                logits_kl_max: 1e-3,
            },
            fp4: ClassThresholds {
                cosine_min: 0.995,
                nmse_max: 1e-2,
                norm_ratio_tol: 0.02,
                row_cosine_min: 0.98,
                logits_kl_max: 5e-3,
            },
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ThresholdError {
    #[error("cannot read thresholds file {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("thresholds file {path}: {message}")]
    Parse { path: String, message: String },
}

/// Why a check failed; one entry per broken rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Violation {
    /// NaN/Inf in production that the reference does not have.
    NonFinite {
        nan: u64,
        inf: u64,
    },
    Cosine {
        value: f64,
        min: f64,
    },
    Nmse {
        value: f64,
        max: f64,
    },
    NormRatio {
        value: f64,
        tol: f64,
    },
    /// One row (token) is much worse than the whole: tile-boundary and row-indexing bugs.
    WorstRow {
        index: u64,
        value: f64,
        min: f64,
    },
    LogitsKl {
        value: f64,
        max: f64,
    },
}

impl Violation {
    /// One sentence in words, for the report.
    pub fn describe(&self) -> String {
        match self {
            Violation::NonFinite { nan, inf } => {
                format!("production has {nan} NaN and {inf} Inf values the reference does not have")
            }
            Violation::Cosine { value, min } => format!("cosine {value:.6} is below {min}"),
            Violation::Nmse { value, max } => format!("NMSE {value:.3e} is above {max:.1e}"),
            Violation::NormRatio { value, tol } => {
                let hint = if (value - 0.5).abs() < 0.01 || (value - 2.0).abs() < 0.02 {
                    " (an exact factor of 2: an FP8 variant or scale-exponent mix-up?)"
                } else {
                    ""
                };
                format!("norm ratio {value:.4} is off by more than {tol}{hint}")
            }
            Violation::WorstRow { index, value, min } => {
                format!("row {index} has cosine {value:.6}, below {min}")
            }
            Violation::LogitsKl { value, max } => {
                format!("logits KL(ref||prod) {value:.3e} nats is above {max:.1e}")
            }
        }
    }
}

impl Thresholds {
    pub fn for_class(&self, class: FormatClass) -> &ClassThresholds {
        match class {
            FormatClass::Wide => &self.wide,
            FormatClass::Fp8 => &self.fp8,
            FormatClass::Fp4 => &self.fp4,
        }
    }

    /// Defaults overridden by the TOML text `text`; `origin` names it in errors.
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Thresholds, ThresholdError> {
        let parse_err = |message: String| ThresholdError::Parse { path: origin.to_string(), message };
        let table: BTreeMap<String, toml::Value> =
            toml::from_str(text).map_err(|e| parse_err(e.to_string()))?;
        let mut out = Thresholds::default();
        for (section, value) in table {
            let class = FormatClass::from_name(&section).ok_or_else(|| {
                parse_err(format!("unknown section [{section}]; expected [wide], [fp8] or [fp4]"))
            })?;
            let toml::Value::Table(entries) = value else {
                return Err(parse_err(format!("[{section}] must be a table")));
            };
            let target = match class {
                FormatClass::Wide => &mut out.wide,
                FormatClass::Fp8 => &mut out.fp8,
                FormatClass::Fp4 => &mut out.fp4,
            };
            for (key, v) in entries {
                let number = v
                    .as_float()
                    .or_else(|| v.as_integer().map(|i| i as f64))
                    .ok_or_else(|| parse_err(format!("[{section}] {key} must be a number")))?;
                if !number.is_finite() || number < 0.0 {
                    return Err(parse_err(format!("[{section}] {key} = {number} must be finite and >= 0")));
                }
                match key.as_str() {
                    "cosine_min" if number <= 1.0 => target.cosine_min = number,
                    "cosine_min" => return Err(parse_err(format!("[{section}] cosine_min {number} > 1"))),
                    "nmse_max" => target.nmse_max = number,
                    "norm_ratio_tol" => target.norm_ratio_tol = number,
                    "row_cosine_min" if number <= 1.0 => target.row_cosine_min = number,
                    "row_cosine_min" => {
                        return Err(parse_err(format!("[{section}] row_cosine_min {number} > 1")))
                    }
                    "logits_kl_max" => target.logits_kl_max = number,
                    other => {
                        return Err(parse_err(format!(
                            "[{section}] unknown key {other}; expected cosine_min, nmse_max, norm_ratio_tol, \
                             row_cosine_min, logits_kl_max"
                        )))
                    }
                }
            }
        }
        Ok(out)
    }

    pub fn from_file(path: &Path) -> Result<Thresholds, ThresholdError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ThresholdError::Io { path: path.display().to_string(), source })?;
        Thresholds::from_toml_str(&text, &path.display().to_string())
    }

    /// Every rule `metrics` breaks for a problem of `class`; empty means PASS.
    /// Comparisons are negated on purpose so that a NaN metric always fails.
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    pub fn judge(&self, class: FormatClass, metrics: &Metrics) -> Vec<Violation> {
        let t = self.for_class(class);
        let mut out = Vec::new();
        let nan = metrics.nan_prod.saturating_sub(metrics.nan_ref);
        let inf = metrics.inf_prod.saturating_sub(metrics.inf_ref);
        if nan + inf > 0 {
            out.push(Violation::NonFinite { nan, inf });
        }
        if !(metrics.cosine >= t.cosine_min) {
            out.push(Violation::Cosine { value: metrics.cosine, min: t.cosine_min });
        }
        if !(metrics.nmse <= t.nmse_max) {
            out.push(Violation::Nmse { value: metrics.nmse, max: t.nmse_max });
        }
        if !((1.0 - metrics.norm_ratio).abs() <= t.norm_ratio_tol) {
            out.push(Violation::NormRatio { value: metrics.norm_ratio, tol: t.norm_ratio_tol });
        }
        if let Some(row) = metrics.worst_row {
            if !(row.cosine >= t.row_cosine_min) {
                out.push(Violation::WorstRow { index: row.index, value: row.cosine, min: t.row_cosine_min });
            }
        }
        out
    }

    /// The rule for LM-head logits; None when they pass. NaN KL (non-finite logits) fails.
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    pub fn judge_logits(&self, class: FormatClass, logits: &LogitsMetrics) -> Option<Violation> {
        let max = self.for_class(class).logits_kl_max;
        (!(logits.kl <= max)).then_some(Violation::LogitsKl { value: logits.kl, max })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::compare_matrix;

    #[test]
    fn half_magnitude_fails_on_nmse_and_norm_not_cosine() {
        let r: Vec<f64> = (0..64).map(|i| (i as f64 * 0.37).sin()).collect();
        let p: Vec<f64> = r.iter().map(|v| v * 0.5).collect();
        let v = Thresholds::default().judge(FormatClass::Fp8, &compare_matrix(&p, &r, 8, 8));
        assert!(v.iter().any(|x| matches!(x, Violation::Nmse { .. })));
        assert!(v.iter().any(|x| matches!(x, Violation::NormRatio { .. })));
        assert!(!v.iter().any(|x| matches!(x, Violation::Cosine { .. })));
    }

    #[test]
    fn toml_overrides_and_rejects_typos() {
        let t = Thresholds::from_toml_str("[fp8]\ncosine_min = 0.9999\n", "t").unwrap();
        assert_eq!(t.fp8.cosine_min, 0.9999);
        assert_eq!(t.fp8.nmse_max, Thresholds::default().fp8.nmse_max);
        assert!(Thresholds::from_toml_str("[fp16]\ncosine_min = 0.9\n", "t").is_err());
        assert!(Thresholds::from_toml_str("[fp8]\ncosin_min = 0.9\n", "t").is_err());
        assert!(Thresholds::from_toml_str("[fp8]\ncosine_min = \"x\"\n", "t").is_err());
        assert!(Thresholds::from_toml_str("[fp8\n", "t").is_err());
    }

    #[test]
    fn one_bad_row_in_many_fails_on_the_row_bound_only() {
        let (rows, cols) = (4096, 16);
        let r: Vec<f64> = (0..rows * cols).map(|i| ((i * 7919) % 104729) as f64 / 104729.0 - 0.5).collect();
        let mut p = r.clone();
        for v in &mut p[1000 * cols..1001 * cols] {
            *v = -*v;
        }
        let m = compare_matrix(&p, &r, rows, cols);
        let v = Thresholds::default().judge(FormatClass::Fp8, &m);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(matches!(v[0], Violation::WorstRow { index: 1000, .. }));
    }

    #[test]
    fn logits_kl_bound() {
        let t = Thresholds::default();
        let ok = LogitsMetrics { kl: 1e-6, top1_agree: true, topk_overlap: 1.0, k: 5 };
        assert!(t.judge_logits(FormatClass::Fp8, &ok).is_none());
        let bad = LogitsMetrics { kl: 0.5, ..ok };
        assert!(matches!(t.judge_logits(FormatClass::Fp8, &bad), Some(Violation::LogitsKl { .. })));
        let nan = LogitsMetrics { kl: f64::NAN, ..ok };
        assert!(t.judge_logits(FormatClass::Fp8, &nan).is_some());
        assert!(Thresholds::from_toml_str("[fp8]\nlogits_kl_max = 0.1\nrow_cosine_min = 0.5\n", "t").is_ok());
        assert!(Thresholds::from_toml_str("[fp8]\nrow_cosine_min = 1.5\n", "t").is_err());
    }

    #[test]
    fn nan_metrics_fail() {
        let mut m = compare_matrix(&[1.0, 2.0], &[1.0, 2.0], 1, 2);
        assert!(Thresholds::default().judge(FormatClass::Wide, &m).is_empty());
        m.cosine = f64::NAN;
        assert!(!Thresholds::default().judge(FormatClass::Wide, &m).is_empty());
    }
}
