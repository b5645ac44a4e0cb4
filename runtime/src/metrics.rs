//! The one definition of every comparison metric (DESIGN.md "Metrics").
//!
//! Device kernels produce the same partial sums as [`MetricSums`] and the host turns them into
//! [`Metrics`] with [`MetricSums::finish`], so host and device cannot disagree on a formula.
//! A sketch check fills the same sums from the k probe projections (y = D R, x = Ref R): since
//! E[r^T P^T Q r] = <P, Q>_F, the ratios estimate the whole-tensor metrics.

use serde::{Deserialize, Serialize};

/// Partial sums over the finite pairs of one comparison; mergeable across rows and blocks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct MetricSums {
    /// sum p*r
    pub dot: f64,
    /// sum p^2
    pub prod_sq: f64,
    /// sum r^2
    pub ref_sq: f64,
    /// sum (p - r)^2
    pub diff_sq: f64,
    /// max |p - r|
    pub max_abs_err: f64,
    /// number of pairs where both sides are finite
    pub finite: u64,
    /// number of pairs seen, finite or not
    pub pairs: u64,
    pub nan_prod: u64,
    pub inf_prod: u64,
    pub nan_ref: u64,
    pub inf_ref: u64,
}

impl MetricSums {
    /// Adds one (production, reference) pair. A pair with a non-finite side is only counted.
    #[inline]
    pub fn add(&mut self, p: f64, r: f64) {
        self.pairs += 1;
        self.nan_prod += p.is_nan() as u64;
        self.inf_prod += p.is_infinite() as u64;
        self.nan_ref += r.is_nan() as u64;
        self.inf_ref += r.is_infinite() as u64;
        if !(p.is_finite() && r.is_finite()) {
            return;
        }
        let d = p - r;
        self.dot += p * r;
        self.prod_sq += p * p;
        self.ref_sq += r * r;
        self.diff_sq += d * d;
        self.max_abs_err = self.max_abs_err.max(d.abs());
        self.finite += 1;
    }

    pub fn from_pairs(prod: &[f64], reference: &[f64]) -> MetricSums {
        assert_eq!(prod.len(), reference.len(), "metric inputs differ in length");
        let mut s = MetricSums::default();
        for (p, r) in prod.iter().zip(reference) {
            s.add(*p, *r);
        }
        s
    }

    pub fn merge(&mut self, other: &MetricSums) {
        self.dot += other.dot;
        self.prod_sq += other.prod_sq;
        self.ref_sq += other.ref_sq;
        self.diff_sq += other.diff_sq;
        self.max_abs_err = self.max_abs_err.max(other.max_abs_err);
        self.finite += other.finite;
        self.pairs += other.pairs;
        self.nan_prod += other.nan_prod;
        self.inf_prod += other.inf_prod;
        self.nan_ref += other.nan_ref;
        self.inf_ref += other.inf_ref;
    }

    /// cosine = <p,r>/(|p||r|); both zero -> 1, exactly one zero -> 0.
    pub fn cosine(&self) -> f64 {
        let (np, nr) = (self.prod_sq.sqrt(), self.ref_sq.sqrt());
        match (np == 0.0, nr == 0.0) {
            (true, true) => 1.0,
            (true, false) | (false, true) => 0.0,
            _ => (self.dot / (np * nr)).clamp(-1.0, 1.0),
        }
    }

    /// NMSE = sum (p-r)^2 / sum r^2 (reference in the denominator, as test-backend-ops).
    /// A zero reference gives 0 when production is zero too, +inf otherwise.
    pub fn nmse(&self) -> f64 {
        if self.ref_sq == 0.0 {
            return if self.diff_sq == 0.0 { 0.0 } else { f64::INFINITY };
        }
        self.diff_sq / self.ref_sq
    }

    /// |p| / |r|; both zero -> 1, zero reference only -> +inf.
    pub fn norm_ratio(&self) -> f64 {
        if self.ref_sq == 0.0 {
            return if self.prod_sq == 0.0 { 1.0 } else { f64::INFINITY };
        }
        (self.prod_sq / self.ref_sq).sqrt()
    }

    pub fn finish(&self) -> Metrics {
        let nmse = self.nmse();
        Metrics {
            cosine: self.cosine(),
            nmse,
            sqnr_db: sqnr_db(nmse),
            norm_ratio: self.norm_ratio(),
            max_abs_err: self.max_abs_err,
            worst_row: None,
            nan_prod: self.nan_prod,
            inf_prod: self.inf_prod,
            nan_ref: self.nan_ref,
            inf_ref: self.inf_ref,
            count: self.pairs,
        }
    }
}

/// SQNR in dB = -10 log10(NMSE); +inf for an exact match.
pub fn sqnr_db(nmse: f64) -> f64 {
    if nmse == 0.0 {
        f64::INFINITY
    } else {
        -10.0 * nmse.log10()
    }
}

/// The row whose cosine is lowest (rows are tokens after canonicalisation).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct WorstRow {
    pub index: u64,
    pub cosine: f64,
}

/// Result of one comparison, host or device.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    pub cosine: f64,
    pub nmse: f64,
    pub sqnr_db: f64,
    pub norm_ratio: f64,
    pub max_abs_err: f64,
    pub worst_row: Option<WorstRow>,
    pub nan_prod: u64,
    pub inf_prod: u64,
    pub nan_ref: u64,
    pub inf_ref: u64,
    /// Elements (or probe entries, for a sketch) compared.
    pub count: u64,
}

impl Metrics {
    /// NaN/Inf in production that the reference does not have: never acceptable.
    pub fn introduced_nonfinite(&self) -> u64 {
        self.nan_prod.saturating_sub(self.nan_ref) + self.inf_prod.saturating_sub(self.inf_ref)
    }
}

/// Compares a row-major `rows x cols` production matrix with its reference: whole-tensor
/// metrics plus the worst row by cosine.
pub fn compare_matrix(prod: &[f64], reference: &[f64], rows: usize, cols: usize) -> Metrics {
    assert_eq!(prod.len(), rows * cols, "production has the wrong size");
    assert_eq!(reference.len(), rows * cols, "reference has the wrong size");
    let mut total = MetricSums::default();
    let mut worst: Option<WorstRow> = None;
    for row in 0..rows {
        let span = row * cols..(row + 1) * cols;
        let sums = MetricSums::from_pairs(&prod[span.clone()], &reference[span]);
        total.merge(&sums);
        // A row with any non-finite value on either side counts as the worst possible.
        let nonfinite = sums.nan_prod + sums.inf_prod + sums.nan_ref + sums.inf_ref > 0;
        let cosine = if nonfinite { f64::NEG_INFINITY } else { sums.cosine() };
        if worst.is_none_or(|w| cosine < w.cosine) {
            worst = Some(WorstRow { index: row as u64, cosine });
        }
    }
    let mut metrics = total.finish();
    metrics.worst_row = worst.map(|w| WorstRow { index: w.index, cosine: w.cosine.max(-1.0) });
    metrics
}

/// Metrics of one logits row (an LM head output): distributions, not just vectors.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LogitsMetrics {
    /// KL(ref || prod) of the softmax distributions, in nats.
    pub kl: f64,
    pub top1_agree: bool,
    /// |topk(ref) ∩ topk(prod)| / k.
    pub topk_overlap: f64,
    pub k: u32,
}

fn log_softmax(logits: &[f64]) -> Vec<f64> {
    let max = logits.iter().copied().filter(|v| v.is_finite()).fold(f64::NEG_INFINITY, f64::max);
    let lse = max + logits.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
    logits.iter().map(|v| v - lse).collect()
}

/// Indices of the `k` largest values, largest first; ties by lower index.
pub fn top_k(values: &[f64], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..values.len()).collect();
    idx.sort_by(|&a, &b| values[b].total_cmp(&values[a]).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

/// KL(ref || prod), top-1 agreement and top-k overlap of one logits row.
/// Non-finite logits make KL NaN, which never passes a threshold.
pub fn compare_logits(prod: &[f64], reference: &[f64], k: usize) -> LogitsMetrics {
    assert_eq!(prod.len(), reference.len(), "logits rows differ in length");
    let k = k.min(prod.len()).max(1);
    let nonfinite = prod.iter().chain(reference).any(|v| !v.is_finite());
    let kl = if nonfinite || prod.is_empty() {
        f64::NAN
    } else {
        let (lp, lr) = (log_softmax(prod), log_softmax(reference));
        lr.iter().zip(&lp).map(|(r, p)| r.exp() * (r - p)).sum::<f64>().max(0.0)
    };
    let (tp, tr) = (top_k(prod, k), top_k(reference, k));
    let overlap = tr.iter().filter(|i| tp.contains(i)).count();
    LogitsMetrics {
        kl,
        top1_agree: tp.first() == tr.first(),
        topk_overlap: overlap as f64 / k as f64,
        k: k as u32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn twice_the_magnitude_keeps_cosine_but_not_nmse() {
        let r = [1.0, -2.0, 3.0, 0.5];
        let p: Vec<f64> = r.iter().map(|v| v * 0.5).collect();
        let m = compare_matrix(&p, &r, 1, 4);
        assert!((m.cosine - 1.0).abs() < 1e-15);
        assert!((m.nmse - 0.25).abs() < 1e-15);
        assert!((m.norm_ratio - 0.5).abs() < 1e-15);
        assert!((m.sqnr_db - 6.0206).abs() < 1e-3);
    }

    #[test]
    fn hand_computed_case() {
        // p = (1, 0), r = (1, 1): dot 1, |p| 1, |r| sqrt2 -> cos 1/sqrt2; nmse = 1/2.
        let m = compare_matrix(&[1.0, 0.0], &[1.0, 1.0], 1, 2);
        assert!((m.cosine - std::f64::consts::FRAC_1_SQRT_2).abs() < 1e-15);
        assert_eq!(m.nmse, 0.5);
        assert_eq!(m.max_abs_err, 1.0);
    }

    #[test]
    fn worst_row_and_nan() {
        let r = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let mut p = r;
        p[3] = -4.0;
        let m = compare_matrix(&p, &r, 3, 2);
        assert_eq!(m.worst_row.unwrap().index, 1);
        p[5] = f64::NAN;
        let m = compare_matrix(&p, &r, 3, 2);
        assert_eq!(m.nan_prod, 1);
        assert_eq!(m.introduced_nonfinite(), 1);
        assert_eq!(m.worst_row.unwrap().index, 2);
    }

    #[test]
    fn logits_identical_and_shifted() {
        let r = [0.1, 2.0, -1.0, 0.7];
        let m = compare_logits(&r, &r, 2);
        assert!(m.kl.abs() < 1e-15 && m.top1_agree && m.topk_overlap == 1.0);
        // Adding a constant leaves softmax unchanged.
        let p: Vec<f64> = r.iter().map(|v| v + 3.0).collect();
        assert!(compare_logits(&p, &r, 2).kl.abs() < 1e-12);
        let swapped = [2.0, 0.1, -1.0, 0.7];
        let m = compare_logits(&swapped, &r, 1);
        assert!(!m.top1_agree && m.kl > 0.1);
    }

    #[test]
    fn zero_cases() {
        let z = MetricSums::from_pairs(&[0.0, 0.0], &[0.0, 0.0]).finish();
        assert_eq!((z.cosine, z.nmse, z.norm_ratio), (1.0, 0.0, 1.0));
        let m = MetricSums::from_pairs(&[0.0, 0.0], &[1.0, 0.0]).finish();
        assert_eq!((m.cosine, m.nmse, m.norm_ratio), (0.0, 1.0, 0.0));
    }
}
