//! Number formatting and escaping shared by the markdown, SVG and recommendation texts, so a
//! value reads the same everywhere in a report.

/// Cosine with 6 decimals: enough to tell 0.999 (an FP8 bound) from 0.99999 (a BF16 bound).
pub fn cosine(value: f64) -> String {
    if value.is_nan() {
        "NaN".into()
    } else {
        format!("{value:.6}")
    }
}

/// Scientific notation with 3 significant digits and a signed two-digit exponent
/// (`5.30e-04`), the way C and numpy print it, so columns line up.
pub fn sci(value: f64) -> String {
    if !value.is_finite() {
        return non_finite(value);
    }
    let formatted = format!("{value:.2e}");
    let (mantissa, exponent) = formatted.split_once('e').expect("{:e} always writes an exponent");
    let exponent: i32 = exponent.parse().expect("{:e} writes an integer exponent");
    let sign = if exponent < 0 { '-' } else { '+' };
    format!("{mantissa}e{sign}{:02}", exponent.abs())
}

/// Norm ratio with 4 decimals: a factor of 2 reads as 0.5000 or 2.0000.
pub fn ratio(value: f64) -> String {
    if !value.is_finite() {
        return non_finite(value);
    }
    format!("{value:.4}")
}

fn non_finite(value: f64) -> String {
    if value.is_nan() {
        "NaN".into()
    } else if value > 0.0 {
        "inf".into()
    } else {
        "-inf".into()
    }
}

/// Inline code that survives a GitHub table: the fence is longer than any backtick run in the
/// text, and `|` is escaped because GitHub splits table cells before parsing code spans.
pub fn code(text: &str) -> String {
    let longest_run = text.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest_run + 1);
    // A code span that starts or ends with a backtick needs a space to separate it from the fence.
    let pad = if text.starts_with('`') || text.ends_with('`') { " " } else { "" };
    let body = text.replace('|', "\\|").replace(['\n', '\r'], " ");
    format!("{fence}{pad}{body}{pad}{fence}")
}

/// Plain text in a markdown paragraph or table cell: characters that would start markup,
/// HTML or a cell boundary are backslash-escaped.
pub fn plain(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' | '`' | '*' | '_' | '[' | ']' | '<' | '>' | '|' | '#' => {
                out.push('\\');
                out.push(c);
            }
            '\n' | '\r' => out.push(' '),
            _ => out.push(c),
        }
    }
    out
}

/// Text that already marks code with backticks (policy violations, diagnosis notes): the code
/// spans are kept (re-fenced so that `|` cannot split a table cell), the rest is [`plain`].
pub fn code_aware(text: &str) -> String {
    if !text.matches('`').count().is_multiple_of(2) {
        return plain(text);
    }
    text.split('`').enumerate().map(|(i, part)| if i % 2 == 1 { code(part) } else { plain(part) }).collect()
}

/// "1st", "2nd", "16th": how the error map words a row period.
pub fn ordinal(n: u64) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

/// Text for SVG/XML content and attribute values.
pub fn xml(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // Control characters are not allowed in XML 1.0 at all.
            c if (c as u32) < 0x20 && c != '\t' && c != '\n' => out.push(' '),
            _ => out.push(c),
        }
    }
    out
}

/// "a, b, c and 4 more": keeps recommendation sentences short on 100-layer models.
pub fn list_some(items: &[String], shown: usize) -> String {
    match items.len() {
        0 => String::new(),
        n if n <= shown => items.join(", "),
        n => format!("{} and {} more", items[..shown].join(", "), n - shown),
    }
}

/// "1 site" / "3 sites".
pub fn count(n: usize, singular: &str, plural: &str) -> String {
    format!("{n} {}", if n == 1 { singular } else { plural })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_have_one_shape() {
        assert_eq!(cosine(0.4123456789), "0.412346");
        assert_eq!(cosine(1.0), "1.000000");
        assert_eq!(cosine(f64::NAN), "NaN");
        assert_eq!(sci(5.3e-4), "5.30e-04");
        assert_eq!(sci(0.25), "2.50e-01");
        assert_eq!(sci(123456.0), "1.23e+05");
        assert_eq!(sci(0.0), "0.00e+00");
        assert_eq!(sci(9.999e-3), "1.00e-02");
        assert_eq!(sci(f64::INFINITY), "inf");
        assert_eq!(sci(f64::NAN), "NaN");
        assert_eq!(ratio(0.5), "0.5000");
        assert_eq!(ratio(f64::NEG_INFINITY), "-inf");
    }

    #[test]
    fn markdown_escaping_keeps_tables_intact() {
        assert_eq!(code("layers.3.mlp"), "`layers.3.mlp`");
        assert_eq!(code("a|b"), "`a\\|b`");
        assert_eq!(code("x`y"), "``x`y``");
        assert_eq!(code("`x"), "`` `x ``");
        assert_eq!(plain("fp8 | *asm*"), "fp8 \\| \\*asm\\*");
        assert_eq!(plain("<script>"), "\\<script\\>");
    }

    #[test]
    fn code_spans_survive_and_the_rest_is_escaped() {
        assert_eq!(
            code_aware("kernel `a|b` via `hip`, denies (kernel = \"*asm*\")"),
            "kernel `a\\|b` via `hip`, denies (kernel = \"\\*asm\\*\")"
        );
        assert_eq!(code_aware("odd ` tick"), "odd \\` tick");
        assert_eq!(
            [ordinal(1), ordinal(2), ordinal(3), ordinal(11), ordinal(16), ordinal(22)],
            ["1st", "2nd", "3rd", "11th", "16th", "22nd"]
        );
    }

    #[test]
    fn xml_escaping() {
        assert_eq!(xml("a<b & \"c\"'"), "a&lt;b &amp; &quot;c&quot;&apos;");
        assert_eq!(xml("bell\u{7}"), "bell ");
    }

    #[test]
    fn lists_are_shortened() {
        let items: Vec<String> = (0..5).map(|i| format!("l{i}")).collect();
        assert_eq!(list_some(&items[..2], 3), "l0, l1");
        assert_eq!(list_some(&items, 3), "l0, l1, l2 and 2 more");
        assert_eq!(count(1, "site", "sites"), "1 site");
        assert_eq!(count(0, "site", "sites"), "0 sites");
    }
}
