//! Backend policy (issue 6): which backends may serve which GEMMs, as rules in a TOML file
//! (`QUANTSHADOW_POLICY`), evaluated per site.
//!
//! ```toml
//! [[rule]]
//! name = "no ASM GEMM on gfx950 in CK-free mode"
//! why = "aiter's ASM a8w8 GEMM returned garbage (cosine 0.006) on gfx950"  # quoted in reports
//! when = { arch = "gfx950*", env = { ATOM_CK_FREE = "1" } }   # when the rule is in force
//! sites = { a_format = "e4m3*" }                             # which sites it is about
//! deny = { kernel = "*asm*gemm*" }                            # a site matching this breaks it
//!
//! [[rule]]
//! name = "CK-free: every FP8 GEMM by Triton"
//! when = { env = { ATOM_CK_FREE = "1" } }
//! sites = { a_format = "e4m3*" }
//! require = { kernel = "*triton*" }                           # every such site must match
//! ```
//!
//! Patterns are globs (`*`, `?`) over: `entry` (the interposed symbol, `cublasLtMatmul`,
//! `cuLaunchKernelEx`, ...), `kernel` (the launched kernel's name; BLAS entry points have none,
//! so a `require.kernel` rule fails them), `name` (the site's layer name), and the formats
//! `a_format`, `b_format`, `d_format` (`bf16`, `e4m3fn`, ...). In `when.env`, `"*"` means "set
//! to anything" and `""` means "unset". Every field present must match (AND); a rule with
//! neither `deny` nor `require` is an error. The shim records the environment variables the
//! policy names ([`Policy::env_vars`]) so that a report can evaluate the rules later.

use crate::specs::glob::{glob_matches as glob_match, Glob};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

/// The environment variable naming the policy file.
pub const ENV_VAR: &str = "QUANTSHADOW_POLICY";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("policy {path}: {message}")]
    Invalid { path: String, message: String },
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    #[serde(default)]
    rule: Vec<Rule>,
}

/// One rule of the policy.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    pub name: String,
    #[serde(default)]
    pub why: Option<String>,
    #[serde(default)]
    pub when: Condition,
    #[serde(default)]
    pub sites: SitePattern,
    #[serde(default)]
    pub deny: Option<SitePattern>,
    #[serde(default)]
    pub require: Option<SitePattern>,
}

/// When a rule is in force: the device architecture and the process environment.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Condition {
    #[serde(default)]
    pub arch: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

/// Globs over a site's facts; absent fields match anything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SitePattern {
    #[serde(default)]
    pub entry: Option<String>,
    #[serde(default)]
    pub kernel: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub a_format: Option<String>,
    #[serde(default)]
    pub b_format: Option<String>,
    #[serde(default)]
    pub d_format: Option<String>,
}

/// What a policy is evaluated against for one site.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SiteFacts {
    pub ordinal: u32,
    pub entry: String,
    /// The launched kernel's name (launch interposers); None for BLAS entry points.
    pub kernel: Option<String>,
    pub name: Option<String>,
    pub a_format: String,
    pub b_format: String,
    pub d_format: String,
}

/// The process-wide facts: device architecture and the environment variables the policy names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessFacts {
    pub arch: String,
    pub env: BTreeMap<String, String>,
}

/// One broken rule at one site, with the rule quoted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub rule: String,
    pub why: Option<String>,
    pub site: u32,
    /// One sentence: what served the site and what the rule says.
    pub text: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// A loaded policy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    pub rules: Vec<Rule>,
    /// Where it came from, for messages.
    pub origin: String,
}

impl Policy {
    pub fn parse(text: &str, origin: &str) -> Result<Policy, PolicyError> {
        let invalid = |message: String| PolicyError::Invalid { path: origin.to_string(), message };
        let file: PolicyFile = toml::from_str(text).map_err(|e| invalid(e.to_string()))?;
        for r in &file.rule {
            if r.name.trim().is_empty() {
                return Err(invalid("a rule has an empty name".into()));
            }
            if r.deny.is_none() && r.require.is_none() {
                return Err(invalid(format!("rule {:?} has neither `deny` nor `require`", r.name)));
            }
            for p in [Some(&r.sites), r.deny.as_ref(), r.require.as_ref()].into_iter().flatten() {
                p.check().map_err(|m| invalid(format!("rule {:?}: {m}", r.name)))?;
            }
            if let Some(a) = &r.when.arch {
                check_glob(a).map_err(|m| invalid(format!("rule {:?}: when.arch: {m}", r.name)))?;
            }
            for k in r.when.env.keys() {
                if k.is_empty() || !k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                    return Err(invalid(format!("rule {:?}: when.env: bad variable name {k:?}", r.name)));
                }
            }
        }
        Ok(Policy { rules: file.rule, origin: origin.to_string() })
    }

    pub fn load(path: &Path) -> Result<Policy, PolicyError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| PolicyError::Invalid { path: path.display().to_string(), message: e.to_string() })?;
        Policy::parse(&text, &path.display().to_string())
    }

    /// The environment variables the rules look at (to record them with the session).
    pub fn env_vars(&self) -> Vec<String> {
        let mut v: Vec<String> = self.rules.iter().flat_map(|r| r.when.env.keys().cloned()).collect();
        v.sort();
        v.dedup();
        v
    }

    /// Every rule broken at `site`.
    pub fn evaluate(&self, process: &ProcessFacts, site: &SiteFacts) -> Vec<Violation> {
        let mut out = Vec::new();
        for r in &self.rules {
            if !r.when.holds(process) || !r.sites.matches(site) {
                continue;
            }
            let served = site.describe();
            if let Some(d) = r.deny.as_ref().filter(|d| d.matches(site)) {
                out.push(Violation {
                    rule: r.name.clone(),
                    why: r.why.clone(),
                    site: site.ordinal,
                    text: format!(
                        "site {} was served by {served}, which rule \"{}\" denies ({d})",
                        site.ordinal, r.name
                    ),
                });
            }
            if let Some(q) = r.require.as_ref().filter(|q| !q.matches(site)) {
                out.push(Violation {
                    rule: r.name.clone(),
                    why: r.why.clone(),
                    site: site.ordinal,
                    text: format!(
                        "site {} was served by {served}; rule \"{}\" requires {q}",
                        site.ordinal, r.name
                    ),
                });
            }
        }
        out
    }
}

impl Condition {
    fn holds(&self, p: &ProcessFacts) -> bool {
        self.arch.as_deref().is_none_or(|a| glob_match(a, &p.arch))
            && self.env.iter().all(|(k, want)| match (want.as_str(), p.env.get(k)) {
                ("", None) => true,
                ("", Some(_)) => false,
                (_, None) => false,
                (pattern, Some(v)) => glob_match(pattern, v),
            })
    }
}

impl SitePattern {
    fn fields(&self) -> [(&'static str, Option<&String>); 6] {
        [
            ("entry", self.entry.as_ref()),
            ("kernel", self.kernel.as_ref()),
            ("name", self.name.as_ref()),
            ("a_format", self.a_format.as_ref()),
            ("b_format", self.b_format.as_ref()),
            ("d_format", self.d_format.as_ref()),
        ]
    }

    fn check(&self) -> Result<(), String> {
        for (field, p) in self.fields() {
            if let Some(p) = p {
                check_glob(p).map_err(|m| format!("{field}: {m}"))?;
            }
        }
        Ok(())
    }

    /// All present fields match; a `kernel` pattern never matches a site without a kernel name.
    pub fn matches(&self, s: &SiteFacts) -> bool {
        let value = |field: &str| -> Option<&str> {
            match field {
                "entry" => Some(&s.entry),
                "kernel" => s.kernel.as_deref(),
                "name" => s.name.as_deref(),
                "a_format" => Some(&s.a_format),
                "b_format" => Some(&s.b_format),
                _ => Some(&s.d_format),
            }
        };
        self.fields()
            .iter()
            .all(|(field, p)| p.is_none_or(|p| value(field).is_some_and(|v| glob_match(p, v))))
    }
}

impl fmt::Display for SitePattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> =
            self.fields().iter().filter_map(|(k, p)| p.map(|p| format!("{k} = \"{p}\""))).collect();
        f.write_str(&parts.join(", "))
    }
}

impl SiteFacts {
    fn describe(&self) -> String {
        match &self.kernel {
            Some(k) => format!("kernel `{k}` via `{}`", self.entry),
            None => format!("`{}`", self.entry),
        }
    }
}

fn check_glob(p: &str) -> Result<(), String> {
    Glob::new(p).map(|_| ())
}

#[cfg(test)]
mod tests;
