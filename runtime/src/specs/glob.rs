//! Kernel-name patterns: `*` matches any run of bytes (empty included), `?` exactly one byte;
//! everything else matches itself. Hand-written so matching is allocation-free.

/// A validated name pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob {
    pattern: String,
}

impl Glob {
    /// Checks the pattern: non-empty, and free of `[`, `]`, `{`, `}` and `\`, which other glob
    /// dialects treat as special; rejecting them keeps a pattern from meaning something else
    /// than its author thought.
    pub fn new(pattern: &str) -> Result<Glob, String> {
        if pattern.is_empty() {
            return Err("empty name pattern".into());
        }
        if let Some(c) = pattern.chars().find(|c| matches!(c, '[' | ']' | '{' | '}' | '\\')) {
            return Err(format!(
                "name pattern {pattern:?}: {c:?} is not supported (only `*` and `?` are special)"
            ));
        }
        Ok(Glob { pattern: pattern.to_string() })
    }

    pub fn as_str(&self) -> &str {
        &self.pattern
    }

    /// Whether `name` matches the whole pattern.
    pub fn matches(&self, name: &str) -> bool {
        glob_match(self.pattern.as_bytes(), name.as_bytes())
    }
}

/// Whether `name` matches `pattern` (checked with [`Glob::new`] beforehand).
pub fn glob_matches(pattern: &str, name: &str) -> bool {
    glob_match(pattern.as_bytes(), name.as_bytes())
}

/// Iterative matcher with single-star backtracking: O(len(p) * len(s)) worst case.
fn glob_match(p: &[u8], s: &[u8]) -> bool {
    let (mut pi, mut si) = (0usize, 0usize);
    // Position after the last `*` seen, and the input position it is currently matched up to.
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        if pi < p.len() && (p[pi] == b'?' || (p[pi] != b'*' && p[pi] == s[si])) {
            pi += 1;
            si += 1;
        } else if pi < p.len() && p[pi] == b'*' {
            star = Some((pi + 1, si));
            pi += 1;
        } else if let Some((after, matched)) = star {
            pi = after;
            si = matched + 1;
            star = Some((after, matched + 1));
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == b'*' {
        pi += 1;
    }
    pi == p.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn star_and_question() {
        let cases = [
            ("abc", "abc", true),
            ("abc", "abd", false),
            ("abc", "abcd", false),
            ("a*", "a", true),
            ("a*", "abcdef", true),
            ("*gemm*", "_Z12my_gemm_fp8PKv", true),
            ("*gemm*", "_Z6conv2dPKv", false),
            ("a?c", "abc", true),
            ("a?c", "ac", false),
            ("*a*b*c", "xxaxxbxxbxxc", true),
            ("*a*b*c", "xxaxxbxxbxxd", false),
            ("**", "", true),
            ("*", "anything", true),
            ("?", "", false),
        ];
        for (p, s, want) in cases {
            assert_eq!(Glob::new(p).unwrap().matches(s), want, "{p} vs {s}");
        }
    }

    #[test]
    fn rejects_other_dialects() {
        assert!(Glob::new("").is_err());
        assert!(Glob::new("gemm[0-9]").unwrap_err().contains("'['"));
        assert!(Glob::new("gemm{a,b}").is_err());
        assert!(Glob::new("gemm\\*").is_err());
    }
}
