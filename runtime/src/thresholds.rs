//! Pass/fail rules per format class (DESIGN.md defaults), overridable from a TOML file:
//!
//! ```toml
//! [fp8]
//! cosine_min = 0.9995
//! nmse_max = 1e-3
//! norm_ratio_tol = 0.01
//! ```
//! Sections: `wide` (bf16/fp16/fp32), `fp8` (FP8/INT8), `fp4` (FP4/INT4/MXFP4/NVFP4); keys not
//! given keep their defaults. Unknown sections or keys are errors, so a typo never silently
//! loosens a check.

use crate::formats::FormatClass;
use crate::metrics::Metrics;
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
        Thresholds {
            wide: ClassThresholds { cosine_min: 0.99999, nmse_max: 2e-5, norm_ratio_tol: 0.002 },
            fp8: ClassThresholds { cosine_min: 0.999, nmse_max: 2e-3, norm_ratio_tol: 0.01 },
            fp4: ClassThresholds { cosine_min: 0.995, nmse_max: 1e-2, norm_ratio_tol: 0.02 },
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
                    other => {
                        return Err(parse_err(format!(
                            "[{section}] unknown key {other}; expected cosine_min, nmse_max, norm_ratio_tol"
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
    /// Comparisons are written so that a NaN metric always fails.
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
        out
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
    fn nan_metrics_fail() {
        let mut m = compare_matrix(&[1.0, 2.0], &[1.0, 2.0], 1, 2);
        assert!(Thresholds::default().judge(FormatClass::Wide, &m).is_empty());
        m.cosine = f64::NAN;
        assert!(!Thresholds::default().judge(FormatClass::Wide, &m).is_empty());
    }
}
