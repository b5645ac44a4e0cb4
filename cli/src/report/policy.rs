//! Backend policy in the report: the rules a run recorded (`QUANTSHADOW_POLICY`, kept in its
//! session records with the environment variables they name) and the rules of
//! `quantshadow report --policy FILE`, evaluated per session against the sites that session
//! saw and the kernels that served them.
//!
//! Decisions:
//! - **Per session**: the architecture and the environment are facts of one process; ranks of
//!   one configuration may differ. Violations are merged over the sessions, one per (rule,
//!   site, serving kernel); the same rule in a recorded policy and in `--policy` counts once.
//! - **Serving kernel**: the observation's `backend`, as an opaque string (a BLAS call that
//!   launched two kernels is served by "k1 + k2"); a site served by several is evaluated once
//!   per distinct value, and calls with no `backend` as "no kernel name".
//! - **Undecidable rules**: a rule whose `when.env` names a variable the session did not record
//!   (its `policy.env` list; a name in that list without an `env.NAME` setting was unset), or
//!   whose `when.arch` needs an architecture the input does not have (no session record), is
//!   neither passed nor failed: the configuration gets a warning naming the missing facts.
//!   A rule whose known conditions already fail is simply not in force, without a warning.
//! - A recorded policy this build cannot parse is a warning, not bad input: the run's other
//!   results are still worth reporting.

use super::model::{EnvFact, PolicyReport, PolicySource, PolicySummary, PolicyViolation, SiteKey};
use quantshadow_runtime::policy::{Condition, Policy, ProcessFacts, Rule, SiteFacts, SitePattern};
use quantshadow_runtime::record::SessionRecord;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

/// One site as one session saw it.
pub(super) struct SiteServing {
    pub key: SiteKey,
    /// Everything but the kernel.
    pub facts: SiteFacts,
    /// Distinct serving kernels (None: calls without a kernel name).
    pub kernels: Vec<Option<String>>,
}

/// What a session recorded about its process, as far as policies go.
struct Known {
    process: ProcessFacts,
    arch_known: bool,
    /// Variables whose value (or absence) the session recorded.
    recorded: BTreeSet<String>,
}

impl Known {
    fn of(session: Option<&SessionRecord>) -> Known {
        let Some(session) = session else {
            return Known { process: ProcessFacts::default(), arch_known: false, recorded: BTreeSet::new() };
        };
        let setting =
            |key: &str| session.settings.iter().find(|kv| kv.key == key).map(|kv| kv.value.as_str());
        let recorded: BTreeSet<String> = setting("policy.env")
            .unwrap_or("")
            .split(',')
            .map(str::trim)
            .filter(|name| !name.is_empty())
            .map(str::to_string)
            .collect();
        let env = session
            .settings
            .iter()
            .filter_map(|kv| kv.key.strip_prefix("env.").map(|name| (name.to_string(), kv.value.clone())))
            .filter(|(name, _)| recorded.contains(name))
            .collect();
        Known { process: ProcessFacts { arch: session.device_arch.clone(), env }, arch_known: true, recorded }
    }
}

enum Decision {
    InForce,
    NotInForce,
    /// The facts the rule needs and the session did not record, in words.
    Undecided(Vec<String>),
}

/// Whether `rule` is in force for a session, judged on what it recorded. The known part of
/// the condition is evaluated by the policy engine itself (a probe rule that denies
/// everything), so the semantics of globs, `"*"` and `""` stay in one place.
fn decide(rule: &Rule, known: &Known) -> Decision {
    let mut missing = Vec::new();
    let mut when = Condition::default();
    match &rule.when.arch {
        Some(arch) if known.arch_known => when.arch = Some(arch.clone()),
        Some(_) => missing.push("the device architecture (no session record)".to_string()),
        None => {}
    }
    for (name, want) in &rule.when.env {
        if known.recorded.contains(name) {
            when.env.insert(name.clone(), want.clone());
        } else {
            missing.push(name.clone());
        }
    }
    let probe = Rule {
        name: rule.name.clone(),
        why: None,
        when,
        sites: SitePattern::default(),
        deny: Some(SitePattern::default()),
        require: None,
    };
    let policy = Policy { rules: vec![probe], origin: String::new() };
    if policy.evaluate(&known.process, &SiteFacts::default()).is_empty() {
        Decision::NotInForce
    } else if missing.is_empty() {
        Decision::InForce
    } else {
        Decision::Undecided(missing)
    }
}

/// Parsed recorded policies, by text (ranks record the same one).
#[derive(Default)]
pub(super) struct PolicyCache {
    parsed: HashMap<(String, String), Result<Policy, String>>,
}

impl PolicyCache {
    fn get(&mut self, origin: &str, text: &str) -> &Result<Policy, String> {
        self.parsed
            .entry((origin.to_string(), text.to_string()))
            .or_insert_with(|| Policy::parse(text, origin).map_err(|e| e.to_string()))
    }
}

/// Policy results of one configuration, accumulated session by session.
#[derive(Default)]
pub(super) struct ConfigPolicy {
    policies: BTreeSet<(PolicySource, String, usize)>,
    env: BTreeSet<(String, Option<String>)>,
    violations: Vec<PolicyViolation>,
    seen: HashSet<(String, SiteKey, Option<String>)>,
    undecided: BTreeSet<String>,
    warnings: BTreeSet<String>,
}

impl ConfigPolicy {
    /// Evaluates the session's recorded policy and `extra` (`--policy`) on its sites.
    pub fn add_session(
        &mut self,
        session: Option<&SessionRecord>,
        sites: &[SiteServing],
        extra: Option<&Policy>,
        cache: &mut PolicyCache,
    ) {
        let known = Known::of(session);
        let mut policies: Vec<(PolicySource, Policy)> = Vec::new();
        if let Some(session) = session {
            let setting =
                |key: &str| session.settings.iter().find(|kv| kv.key == key).map(|kv| kv.value.clone());
            if let Some(text) = setting("policy.text") {
                let origin = setting("policy").unwrap_or_else(|| "(recorded policy)".to_string());
                match cache.get(&origin, &text) {
                    Ok(policy) => policies.push((PolicySource::Recorded, policy.clone())),
                    Err(e) => {
                        self.warnings.insert(format!(
                            "the backend policy the run recorded could not be read ({e}): its rules were \
                             not evaluated"
                        ));
                    }
                }
            }
            if session.settings.iter().any(|kv| kv.key == "policy.env") {
                for name in &known.recorded {
                    self.env.insert((name.clone(), known.process.env.get(name).cloned()));
                }
            }
        }
        if let Some(extra) = extra {
            policies.push((PolicySource::Report, extra.clone()));
        }
        for (source, policy) in policies {
            self.policies.insert((source, policy.origin.clone(), policy.rules.len()));
            let mut in_force = Vec::new();
            for rule in &policy.rules {
                match decide(rule, &known) {
                    Decision::InForce => in_force.push(rule.clone()),
                    Decision::NotInForce => {}
                    Decision::Undecided(missing) => {
                        let hint = if source == PolicySource::Report {
                            " (a run records the variables its own QUANTSHADOW_POLICY names: run with this \
                             policy to have them recorded)"
                        } else {
                            ""
                        };
                        self.undecided.insert(format!(
                            "policy {}: rule \"{}\" cannot be decided: the run did not record {}{hint}; it is \
                             not held against this configuration",
                            policy.origin,
                            rule.name,
                            missing.join(", ")
                        ));
                    }
                }
            }
            if in_force.is_empty() {
                continue;
            }
            let deciding = Policy { rules: in_force, origin: policy.origin.clone() };
            for site in sites {
                for kernel in &site.kernels {
                    let facts = SiteFacts { kernel: kernel.clone(), ..site.facts.clone() };
                    for v in deciding.evaluate(&known.process, &facts) {
                        if !self.seen.insert((v.rule.clone(), site.key.clone(), kernel.clone())) {
                            continue;
                        }
                        self.violations.push(PolicyViolation {
                            policy: policy.origin.clone(),
                            source,
                            rule: v.rule,
                            why: v.why,
                            site: site.key.clone(),
                            ordinal: site.facts.ordinal,
                            entry_point: site.facts.entry.clone(),
                            kernel: kernel.clone(),
                            text: v.text,
                        });
                    }
                }
            }
        }
    }

    /// The configuration's policy report (None when no policy was seen) and its warnings.
    pub fn finish(mut self) -> (Option<PolicyReport>, Vec<String>) {
        let mut warnings: Vec<String> = std::mem::take(&mut self.warnings).into_iter().collect();
        warnings.extend(self.undecided.iter().cloned());
        if self.policies.is_empty() {
            return (None, warnings);
        }
        // The same origin may come with different rule counts from different sessions: keep each.
        let policies = self
            .policies
            .into_iter()
            .map(|(source, origin, rules)| PolicySummary { origin, source, rules })
            .collect();
        let mut violations = self.violations;
        // Stable: within a site, the order of evaluation (kernel, then the policy's rule order).
        violations.sort_by(|a, b| (a.ordinal, &a.site).cmp(&(b.ordinal, &b.site)));
        let report = PolicyReport {
            policies,
            env: self.env.into_iter().map(|(name, value)| EnvFact { name, value }).collect(),
            violations,
            undecided: self.undecided.into_iter().collect(),
        };
        (Some(report), warnings)
    }
}

/// Rules broken in a configuration: rule name -> distinct sites, in first-violation order.
pub(super) fn broken_rules(violations: &[PolicyViolation]) -> Vec<(&str, Vec<&SiteKey>)> {
    let mut order: Vec<&str> = Vec::new();
    let mut sites: BTreeMap<&str, Vec<&SiteKey>> = BTreeMap::new();
    for v in violations {
        let entry = sites.entry(v.rule.as_str()).or_insert_with(|| {
            order.push(v.rule.as_str());
            Vec::new()
        });
        if !entry.contains(&&v.site) {
            entry.push(&v.site);
        }
    }
    order.into_iter().map(|rule| (rule, sites.remove(rule).unwrap_or_default())).collect()
}
