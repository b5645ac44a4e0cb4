//! Diagnosis of a failing site (issue 6): which reading of the call's contract explains what
//! production computed, where the errors are, and how the scales are laid out.
//!
//! API for the report / engine (host only, rows mode):
//!
//! - [`alternatives`]`(problem)`: every alternative reading valid for the problem, the declared
//!   one first, each a [`Reading`] (stable `id`, human `description`, `recommendation`) with
//!   the [`GemmProblem`] that states it (plus `swap_scale_buffers` for "A and B scales
//!   swapped", the one reading that rewires buffers rather than the description).
//! - [`diagnose`]`(problem, inputs, prod_rows)`: runs the host oracle under every reading on
//!   the rows production gave (`(global row b * M + i, N values)`), ranks them (fewest
//!   NaN/Inf disagreements, then highest cosine, then smallest |1 - norm ratio|; the declared
//!   reading wins ties) and returns a [`Diagnosis`]: the declared reading's metrics, the
//!   ranking, the best explanation as one sentence ([`Diagnosis::text`]: "production matches
//!   the reference with A scales read column-major (inner-major): cosine 0.99998, norm ratio
//!   1.000; declared layout gives cosine 0.41") and its recommendation.
//! - [`error_map`]`(prod, reference, rows, cols, problem)`: bad rows with periodicity
//!   ("every 16th row, i = 15 mod 16, from row 15"), bad column blocks, bad scale blocks;
//!   [`onset_m`] turns per-call maps into "from M >= 56".
//! - [`scale_layout_summary`]`(problem)`: "A scales: 1x128 blocks, grid 57x32, f32,
//!   OuterMajor, ld 32" for the per-layer "scale layout analysis".

mod error_map;
mod readings;

pub use error_map::{error_map, onset_m, scale_layout_lines, scale_layout_summary, ErrorMap, RowPeriod};
pub use readings::{alternatives, Reading, ReadingKind};

use crate::metrics::{compare_matrix, Metrics};
use crate::oracle::{reference_gemm, OracleOptions};
use crate::problem::{GemmProblem, HostInputs};

/// A reading "explains" production when the reference under it matches this well.
pub const EXPLAIN_COSINE: f64 = 0.999;
pub const EXPLAIN_NORM_TOL: f64 = 0.01;

/// One reading's comparison with production.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadingResult {
    pub reading: Reading,
    pub metrics: Metrics,
    /// Pairs where exactly one side is finite (a reading that invents or hides NaN/Inf).
    pub nonfinite_mismatch: u64,
    /// Of those, the pairs where only the reference is non-finite: values the reading makes
    /// NaN/Inf that production computed (codes without a value in the reading's format, such as
    /// e4m3fn's -0 byte, NaN in e4m3fnuz, and every output its row touches).
    pub invented: u64,
}

impl ReadingResult {
    /// NaN/Inf production has that the reading does not reproduce.
    pub fn missed(&self) -> u64 {
        self.nonfinite_mismatch.saturating_sub(self.invented)
    }

    /// Ranking key, smaller is better: production's NaN/Inf unexplained first; then whether the
    /// reading leaves at least a tenth of the values finite (its cosine and norm ratio, taken
    /// over finite pairs, say little otherwise); then whether it explains production, and among
    /// those that do, fewer invented NaN/Inf; then cosine and norm ratio. A reading that only
    /// adds NaN/Inf where its format has no value for a code still explains the finite values:
    /// e4m3fn data read as e4m3fnuz, whose -0 bytes turn NaN.
    fn key(&self) -> (u64, bool, bool, u64, f64, f64) {
        let mostly_nonfinite = self.invented.saturating_mul(10) > self.metrics.count.saturating_mul(9);
        let explains = self.explains();
        (
            self.missed(),
            mostly_nonfinite,
            !explains,
            if explains { self.invented } else { 0 },
            -self.metrics.cosine,
            (1.0 - self.metrics.norm_ratio).abs(),
        )
    }

    /// Whether this reading reproduces production (cosine and norm ratio both close).
    pub fn explains(&self) -> bool {
        self.metrics.cosine >= EXPLAIN_COSINE && (1.0 - self.metrics.norm_ratio).abs() <= EXPLAIN_NORM_TOL
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Diagnosis {
    pub declared: ReadingResult,
    /// Every reading that could be evaluated, best first (the declared one included).
    pub ranked: Vec<ReadingResult>,
    /// Readings that could not be evaluated on these buffers, with the reason (a reading that
    /// needs more scale entries than the buffer holds, ...).
    pub skipped: Vec<(Reading, String)>,
    /// The best alternative when it explains production better than the declared contract.
    pub explanation: Option<ReadingResult>,
    /// Other readings indistinguishable from the explanation on these rows (A vs B read as
    /// fnuz give the same output).
    pub equivalent: Vec<Reading>,
    /// One sentence for the report.
    pub text: String,
    /// What to check, for the explanation's kind (None when the declared reading is best).
    pub recommendation: Option<String>,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DiagnosisError {
    #[error("no production rows to diagnose")]
    NoRows,
    #[error("production row {row} has {have} values, N is {n}")]
    RowLength { row: u64, have: usize, n: u64 },
    #[error("production row {row} is outside batch * M = {total}")]
    RowOutOfRange { row: u64, total: u64 },
    #[error("the declared reading cannot be evaluated: {0}")]
    Declared(String),
}

/// Runs every reading of [`alternatives`] on the rows production gave and ranks them.
pub fn diagnose(
    problem: &GemmProblem,
    inputs: &HostInputs,
    prod_rows: &[(u64, Vec<f64>)],
) -> Result<Diagnosis, DiagnosisError> {
    if prod_rows.is_empty() {
        return Err(DiagnosisError::NoRows);
    }
    let total = problem.batch * problem.m;
    for (row, values) in prod_rows {
        if *row >= total {
            return Err(DiagnosisError::RowOutOfRange { row: *row, total });
        }
        if values.len() as u64 != problem.n {
            return Err(DiagnosisError::RowLength { row: *row, have: values.len(), n: problem.n });
        }
    }
    let mut wanted: Vec<u64> = prod_rows.iter().map(|(r, _)| r % problem.m).collect();
    wanted.sort_unstable();
    wanted.dedup();
    let prod: Vec<f64> = prod_rows.iter().flat_map(|(_, v)| v.iter().copied()).collect();
    let n = problem.n as usize;

    let mut results = vec![];
    let mut skipped = vec![];
    for (reading, p) in alternatives(problem) {
        let mut inp;
        let inputs = if reading.swap_scale_buffers {
            inp = inputs.clone();
            std::mem::swap(&mut inp.a_scale, &mut inp.b_scale);
            &inp
        } else {
            inputs
        };
        let opts = OracleOptions { round_output: true, rows: Some(wanted.clone()) };
        match reference_gemm(&p, inputs, &opts) {
            Ok(out) => {
                let mut reference = Vec::with_capacity(prod.len());
                for (row, _) in prod_rows {
                    let (b, i) = (row / problem.m, row % problem.m);
                    let pos = wanted.binary_search(&i).expect("row was requested");
                    reference.extend_from_slice(out.row(b, pos).expect("row was computed"));
                }
                let metrics = compare_matrix(&prod, &reference, prod_rows.len(), n);
                let nonfinite_mismatch =
                    prod.iter().zip(&reference).filter(|(p, r)| p.is_finite() != r.is_finite()).count()
                        as u64;
                let invented =
                    prod.iter().zip(&reference).filter(|(p, r)| p.is_finite() && !r.is_finite()).count()
                        as u64;
                results.push(ReadingResult { reading, metrics, nonfinite_mismatch, invented });
            }
            Err(e) => {
                if reading.kind == ReadingKind::Declared {
                    return Err(DiagnosisError::Declared(e.to_string()));
                }
                skipped.push((reading, e.to_string()));
            }
        }
    }
    rank(results, skipped)
        .ok_or_else(|| DiagnosisError::Declared("no result for the declared reading".into()))
}

/// Ranks evaluated readings (fewest NaN/Inf disagreements, then highest cosine, then smallest
/// |1 - norm ratio|; the declared reading wins ties) and words the result. Shared by the host
/// diagnosis above and the device backends, which evaluate readings with their own kernels.
/// `None` when `results` has no declared reading.
pub fn rank(mut results: Vec<ReadingResult>, skipped: Vec<(Reading, String)>) -> Option<Diagnosis> {
    let at = results.iter().position(|r| r.reading.kind == ReadingKind::Declared)?;
    let declared = results.remove(at);
    results.insert(0, declared.clone());
    // Stable: the declared reading (first) wins exact ties.
    results.sort_by(|a, b| a.key().partial_cmp(&b.key()).unwrap_or(std::cmp::Ordering::Equal));
    let best = results[0].clone();
    let better = best.reading.kind != ReadingKind::Declared && best.key() < declared.key();
    let explanation = (better && best.explains()).then(|| best.clone());
    let close = |a: &ReadingResult, b: &ReadingResult| {
        a.nonfinite_mismatch == b.nonfinite_mismatch
            && (a.metrics.cosine - b.metrics.cosine).abs() <= 1e-9
            && (a.metrics.norm_ratio - b.metrics.norm_ratio).abs() <= 1e-9
    };
    let equivalent: Vec<Reading> = match &explanation {
        Some(e) => results[1..].iter().filter(|r| close(r, e)).map(|r| r.reading.clone()).collect(),
        None => vec![],
    };
    let dm = &declared.metrics;
    let text = match &explanation {
        Some(e) => {
            let mut t = format!(
                "production matches the reference with {}: cosine {:.5}, norm ratio {:.3}; declared layout gives cosine {:.2}, norm ratio {:.3}",
                e.reading.description, e.metrics.cosine, e.metrics.norm_ratio, dm.cosine, dm.norm_ratio
            );
            if !equivalent.is_empty() {
                let names: Vec<&str> = equivalent.iter().map(|r| r.description.as_str()).collect();
                t.push_str(&format!(" (equally explained by: {})", names.join(", ")));
            }
            if e.invented > 0 {
                t.push_str(&format!(
                    "; that reading also turns {} of {} values NaN/Inf that production computed (codes without a value in its format, e.g. e4m3fn's -0 byte read as e4m3fnuz)",
                    e.invented, e.metrics.count
                ));
            }
            t
        }
        None if declared.explains() && declared.nonfinite_mismatch > 0 => format!(
            "production has {} NaN/Inf values that no reading of the contract produces; its finite values match the declared contract (cosine {:.5}, norm ratio {:.3})",
            declared.nonfinite_mismatch, dm.cosine, dm.norm_ratio
        ),
        None if declared.explains() => format!(
            "the declared contract is the best reading (cosine {:.5}, norm ratio {:.3}); no alternative reading explains production better",
            dm.cosine, dm.norm_ratio
        ),
        None => {
            // An alternative is worth naming only when it comes closer than the declared one.
            let alt = results
                .iter()
                .find(|r| r.reading.kind != ReadingKind::Declared)
                .filter(|a| a.key() < declared.key());
            let alt = alt.map_or(String::new(), |a| {
                format!(
                    "; the closest alternative, {}, gives cosine {:.4}, norm ratio {:.3}",
                    a.reading.description, a.metrics.cosine, a.metrics.norm_ratio
                )
            });
            format!(
                "no reading of the contract explains production: declared gives cosine {:.4}, norm ratio {:.3}{alt}",
                dm.cosine, dm.norm_ratio
            )
        }
    };
    let recommendation = explanation.as_ref().map(|e| e.reading.recommendation().to_string());
    Some(Diagnosis { declared, ranked: results, skipped, explanation, equivalent, text, recommendation })
}

/// The record of a diagnosis pass (`session_id` and timestamp filled by the sender).
pub fn to_record(
    d: &Diagnosis,
    site: (u64, u32),
    call_seq: u64,
    rows: u64,
    map: Option<&ErrorMap>,
    problem: &GemmProblem,
) -> crate::record::DiagnosisRecord {
    use crate::record::{DiagnosisRecord, ErrorMapSummary, KeyValue, ReadingSummary, RowPeriodSummary};
    let summary = |r: &ReadingResult| ReadingSummary {
        id: r.reading.id.clone(),
        description: r.reading.description.clone(),
        declared: r.reading.kind == ReadingKind::Declared,
        cosine: r.metrics.cosine,
        nmse: r.metrics.nmse,
        norm_ratio: r.metrics.norm_ratio,
        nonfinite_mismatch: r.nonfinite_mismatch,
        explains: r.explains(),
    };
    let error_map = map.map(|e| ErrorMapSummary {
        m: e.m,
        rows_checked: e.rows_checked,
        bad_rows: e.bad_rows.iter().copied().take(ErrorMapSummary::MAX_ROWS).collect(),
        bad_rows_total: e.bad_rows.len() as u64,
        row_period: e.row_period.map(|p| RowPeriodSummary {
            period: p.period,
            offset: p.offset,
            first_row: p.first_row,
        }),
        col_block: e.col_block,
        col_blocks: e.col_blocks,
        bad_col_blocks: e.bad_col_blocks.clone(),
        bad_a_scale_blocks: e.bad_a_scale_blocks.clone(),
        bad_b_scale_blocks: e.bad_b_scale_blocks.clone(),
        summary: e.summary.clone(),
    });
    DiagnosisRecord {
        session_id: 0,
        site_id: site.0,
        site_ordinal: site.1,
        call_seq,
        rows,
        readings: d.ranked.iter().map(summary).collect(),
        skipped: d
            .skipped
            .iter()
            .map(|(r, why)| KeyValue { key: r.description.clone(), value: why.clone() })
            .collect(),
        explanation: d.explanation.as_ref().map(|e| e.reading.id.clone()),
        equivalent: d.equivalent.iter().map(|r| r.description.clone()).collect(),
        text: d.text.clone(),
        recommendation: d.recommendation.clone(),
        error_map,
        scale_layout: scale_layout_summary(problem).split("; ").map(str::to_string).collect(),
        timestamp_ns: 0,
    }
}

#[cfg(test)]
mod tests;
