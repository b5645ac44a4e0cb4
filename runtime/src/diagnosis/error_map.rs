//! Where a failing check's errors are: rows (with periodicity), column blocks, scale blocks;
//! and the scale layout of a call in words.

use crate::metrics::MetricSums;
use crate::problem::{GemmProblem, ScaleGranularity, ScaleSpec, ScaleStorage};
use crate::thresholds::Thresholds;

/// Bad rows are exactly the checked rows i >= `first_row` with i % period == offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowPeriod {
    pub period: u64,
    pub offset: u64,
    pub first_row: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ErrorMap {
    /// M of the call (with [`onset_m`] over several calls: "only from M >= 56").
    pub m: u64,
    /// Distinct rows compared.
    pub rows_checked: u64,
    /// Distinct bad rows, ascending.
    pub bad_rows: Vec<u64>,
    pub row_period: Option<RowPeriod>,
    /// Width of a column block: B's scale block (outer) when B has block scales, else 128.
    pub col_block: u64,
    pub col_blocks: u64,
    pub bad_col_blocks: Vec<u64>,
    /// A's scale blocks along M (row blocks of A's block height) holding a bad row; `None`
    /// without A scales.
    pub bad_a_scale_blocks: Option<Vec<u64>>,
    /// B's scale blocks along N holding a bad column block; `None` without B scales.
    pub bad_b_scale_blocks: Option<Vec<u64>>,
    /// One line for the report.
    pub summary: String,
}

fn bad(s: &MetricSums, t: &crate::thresholds::ClassThresholds, row_level: bool) -> bool {
    let nonfinite = s.nan_prod + s.inf_prod > s.nan_ref + s.inf_ref;
    let cos_min = if row_level { t.row_cosine_min } else { t.cosine_min };
    nonfinite || s.cosine() < cos_min || (1.0 - s.norm_ratio()).abs() > 5.0 * t.norm_ratio_tol
}

fn outer_block(spec: &Option<ScaleSpec>, outer: u64, k: u64) -> Option<u64> {
    spec.map(|s| s.granularity.block_shape(outer, k).0)
}

/// Error map of `rows.len() x cols` production values against the reference (row-major, row
/// t is D row `rows[t]`, any batch item). Row and block verdicts use the default thresholds of
/// the problem's format class (per-row cosine bound for rows).
pub fn error_map(
    prod: &[f64],
    reference: &[f64],
    rows: &[u64],
    cols: usize,
    problem: &GemmProblem,
) -> ErrorMap {
    assert_eq!(prod.len(), rows.len() * cols, "production has the wrong size");
    assert_eq!(reference.len(), rows.len() * cols, "reference has the wrong size");
    let thresholds = Thresholds::default();
    let t = thresholds.for_class(problem.class());
    let b_block = match problem.b_scale.map(|s| s.granularity) {
        Some(ScaleGranularity::Block { outer, .. }) if outer > 1 => outer as u64,
        _ => 128,
    };
    let col_block = b_block.min(cols.max(1) as u64);
    let col_blocks = (cols as u64).div_ceil(col_block);
    let mut row_sums: std::collections::BTreeMap<u64, MetricSums> = Default::default();
    let mut col_sums = vec![MetricSums::default(); col_blocks as usize];
    for (tpos, &i) in rows.iter().enumerate() {
        let span = tpos * cols..(tpos + 1) * cols;
        let (p, r) = (&prod[span.clone()], &reference[span]);
        row_sums.entry(i).or_default().merge(&MetricSums::from_pairs(p, r));
        for (cb, sums) in col_sums.iter_mut().enumerate() {
            let lo = cb * col_block as usize;
            let hi = (lo + col_block as usize).min(cols);
            sums.merge(&MetricSums::from_pairs(&p[lo..hi], &r[lo..hi]));
        }
    }
    let checked: Vec<(u64, bool)> = row_sums.iter().map(|(i, s)| (*i, bad(s, t, true))).collect();
    let bad_rows: Vec<u64> = checked.iter().filter(|c| c.1).map(|c| c.0).collect();
    let bad_col_blocks: Vec<u64> =
        col_sums.iter().enumerate().filter(|(_, s)| bad(s, t, false)).map(|(c, _)| c as u64).collect();
    let row_period = find_period(&checked, problem.m);
    let bad_a_scale_blocks = outer_block(&problem.a_scale, problem.m, problem.k).map(|bo| {
        let mut v: Vec<u64> = bad_rows.iter().map(|i| i / bo).collect();
        v.dedup();
        v
    });
    let bad_b_scale_blocks = outer_block(&problem.b_scale, problem.n, problem.k).map(|bo| {
        let mut v: Vec<u64> = vec![];
        for &cb in &bad_col_blocks {
            let (lo, hi) = (cb * col_block, ((cb + 1) * col_block).min(cols as u64));
            v.extend(lo / bo..=(hi - 1) / bo);
        }
        v.dedup();
        v
    });
    let list = |v: &[u64], total: u64| -> String {
        if v.is_empty() {
            "none".into()
        } else if v.len() as u64 == total {
            format!("all {total}")
        } else if v.len() <= 12 {
            v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", ")
        } else {
            format!(
                "{} of {total} (first {})",
                v.len(),
                v[..8].iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", ")
            )
        }
    };
    let rows_text = match row_period {
        Some(p) => format!(
            "bad rows: every {}th row (i = {} mod {}) from row {} ({} of {} checked, M = {})",
            p.period,
            p.offset,
            p.period,
            p.first_row,
            bad_rows.len(),
            checked.len(),
            problem.m
        ),
        None => format!(
            "bad rows: {} of {} checked (M = {})",
            list(&bad_rows, checked.len() as u64),
            checked.len(),
            problem.m
        ),
    };
    let mut summary =
        format!("{rows_text}; bad column blocks ({col_block} wide): {}", list(&bad_col_blocks, col_blocks));
    if let Some(a) = &bad_a_scale_blocks {
        let total = problem.a_scale.unwrap().granularity.grid(problem.m, problem.k).0;
        summary.push_str(&format!("; A scale blocks along M: {}", list(a, total)));
    }
    if let Some(b) = &bad_b_scale_blocks {
        let total = problem.b_scale.unwrap().granularity.grid(problem.n, problem.k).0;
        summary.push_str(&format!("; B scale blocks along N: {}", list(b, total)));
    }
    ErrorMap {
        m: problem.m,
        rows_checked: checked.len() as u64,
        bad_rows,
        row_period,
        col_block,
        col_blocks,
        bad_col_blocks,
        bad_a_scale_blocks,
        bad_b_scale_blocks,
        summary,
    }
}

/// Smallest period p (2 <= p < M) with an offset such that, among the checked rows from the
/// first bad one on, the bad ones are exactly those i = offset mod p. Needs two bad rows and a
/// good row after the first bad one (else any period fits).
fn find_period(checked: &[(u64, bool)], m: u64) -> Option<RowPeriod> {
    let first = checked.iter().position(|c| c.1)?;
    let tail = &checked[first..];
    if tail.iter().filter(|c| c.1).count() < 2 || tail.iter().all(|c| c.1) {
        return None;
    }
    let first_row = checked[first].0;
    (2..m.max(2)).find_map(|p| {
        let offset = first_row % p;
        tail.iter().all(|&(i, b)| b == (i % p == offset)).then_some(RowPeriod {
            period: p,
            offset,
            first_row,
        })
    })
}

/// The smallest M from which calls fail while every call with a smaller M passes, from
/// (M, failed) per call of one site; `None` when the failures do not split by M that way.
pub fn onset_m(calls: &[(u64, bool)]) -> Option<u64> {
    let first_bad = calls.iter().filter(|c| c.1).map(|c| c.0).min()?;
    let consistent = calls.iter().all(|&(m, failed)| failed == (m >= first_bad));
    let any_good = calls.iter().any(|c| !c.1);
    (consistent && any_good).then_some(first_bad)
}

fn storage_label(s: ScaleStorage) -> &'static str {
    match s {
        ScaleStorage::OuterMajor => "OuterMajor",
        ScaleStorage::InnerMajor => "InnerMajor",
        ScaleStorage::Swizzled128x4 => "Swizzled128x4",
    }
}

fn one_scale(name: &str, spec: Option<&ScaleSpec>, outer: u64, k: u64, batch: u64) -> String {
    let Some(s) = spec else { return format!("{name} scales: none") };
    let (go, gi) = s.granularity.grid(outer, k);
    let (bo, bi) = s.granularity.block_shape(outer, k);
    let what = match s.granularity {
        ScaleGranularity::Tensor => "per-tensor".to_string(),
        ScaleGranularity::PerOuter => format!("per-{} (1x{k})", if name == "A" { "row" } else { "column" }),
        ScaleGranularity::PerInner => format!("per-K ({outer}x1)"),
        ScaleGranularity::Block { .. } => format!("{bo}x{bi} blocks"),
        ScaleGranularity::Mx32 => "MX 1x32 blocks".to_string(),
        ScaleGranularity::Nvfp4 => "NVFP4 1x16 blocks".to_string(),
    };
    let ld = match (s.storage, s.ld) {
        (ScaleStorage::Swizzled128x4, _) => "128x4 tiles of 512".to_string(),
        (ScaleStorage::OuterMajor, 0) => format!("ld {gi}"),
        (ScaleStorage::InnerMajor, 0) => format!("ld {go}"),
        (_, ld) => format!("ld {ld}"),
    };
    let mut t =
        format!("{name} scales: {what}, grid {go}x{gi}, {}, {}, {ld}", s.format, storage_label(s.storage));
    if batch > 1 {
        if s.batch_stride == 0 {
            t.push_str(", shared by all batch items");
        } else {
            t.push_str(&format!(", batch stride {}", s.batch_stride));
        }
    }
    t.push_str(&format!(", {} entries", s.required_entries(outer, k, batch)));
    t
}

/// "A scales: 1x128 blocks, grid 57x32, f32, OuterMajor, ld 32, 1824 entries; B scales: ..."
pub fn scale_layout_summary(problem: &GemmProblem) -> String {
    format!(
        "{}; {}",
        one_scale("A", problem.a_scale.as_ref(), problem.m, problem.k, problem.batch),
        one_scale("B", problem.b_scale.as_ref(), problem.n, problem.k, problem.batch)
    )
}

/// [`scale_layout_summary`] of a recorded problem, one line per operand: what the report shows
/// as the "scale layout analysis" of a site that has no diagnosis record (a record keeps the
/// problem as a [`ProblemSummary`], not a [`GemmProblem`]).
pub fn scale_layout_lines(problem: &crate::record::ProblemSummary) -> Vec<String> {
    vec![
        one_scale("A", problem.a_scale.as_ref(), problem.m, problem.k, problem.batch),
        one_scale("B", problem.b_scale.as_ref(), problem.n, problem.k, problem.batch),
    ]
}
