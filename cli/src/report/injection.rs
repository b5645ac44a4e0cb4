//! Fault injection in the report: the `inject` setting of the session records (the canonical
//! `QUANTSHADOW_INJECT` spec, or `none`) and the closing records' "fault injection not applied"
//! skip reasons become one [`InjectionReport`] per configuration, shown as a banner.
//!
//! The spec is read item by item rather than with `InjectSpec::parse`, so that a class this
//! build does not know (a newer shim, a test fixture's own fault names) is still shown, marked
//! as unknown, instead of hiding the whole banner.

use super::model::{InjectedFault, InjectionReport};
use quantshadow_runtime::inject::FaultClass;
use quantshadow_runtime::record::SkipCount;

/// How the engine words a skip for an injection it could not apply to a call.
pub const NOT_APPLIED_PREFIX: &str = "fault injection not applied: ";

/// Session setting holding the canonical spec.
pub const SETTING: &str = "inject";

/// The spec a session recorded, None when injection was off (or not recorded: older runs).
pub fn active_spec(value: &str) -> Option<&str> {
    let value = value.trim();
    (!value.is_empty() && value != "none").then_some(value)
}

/// The items of a canonical spec with what each does.
pub fn faults_of(spec: &str) -> Vec<InjectedFault> {
    spec.split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(|item| {
            let (class, target) = match item.split_once('@') {
                None => (item, "every site".to_string()),
                Some((class, t)) if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) => {
                    (class, format!("site {t}"))
                }
                Some((class, t)) => (class, format!("sites matching '{t}'")),
            };
            let class = class.trim();
            InjectedFault {
                item: item.to_string(),
                class: class.to_string(),
                target,
                effect: FaultClass::from_name(&class.to_ascii_lowercase()).map(|c| c.describe().to_string()),
            }
        })
        .collect()
}

/// Moves the "not applied" notes out of `skipped` (they are not skips of a check) and builds
/// the configuration's report; None when nothing was injected or attempted.
pub fn build(
    specs: Vec<String>,
    skipped: &mut Vec<SkipCount>,
    injected_calls: u64,
) -> Option<InjectionReport> {
    let mut not_applied = Vec::new();
    skipped.retain(|skip| match skip.reason.strip_prefix(NOT_APPLIED_PREFIX) {
        Some(reason) => {
            not_applied.push(SkipCount { reason: reason.to_string(), count: skip.count });
            false
        }
        None => true,
    });
    if specs.is_empty() && not_applied.is_empty() {
        return None;
    }
    let mut faults: Vec<InjectedFault> = Vec::new();
    for spec in &specs {
        for fault in faults_of(spec) {
            if !faults.contains(&fault) {
                faults.push(fault);
            }
        }
    }
    Some(InjectionReport { specs, faults, not_applied, injected_calls })
}
