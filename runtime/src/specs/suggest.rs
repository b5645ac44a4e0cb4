//! Spec skeletons for `quantshadow kernels --suggest`: which observed kernels look like GEMMs,
//! and a `[[kernel]]` entry guessed from their parameter sizes for a human to correct.

use super::KernelStat;
use std::fmt::Write;

/// Name fragments that mark a GEMM-like kernel anywhere in the (lower-cased) name.
const STRONG: &[&str] = &[
    "gemm",
    "matmul",
    "gemv",
    "cutlass",
    "wgmma",
    "a8w8",
    "w8a8",
    "a4w4",
    "w4a16",
    "w4a8",
    "scaled_mm",
    "blockscale",
    "block_scale",
    "mfma",
    "hgmma",
    "xmma",
];
/// Fragments that only count as a whole `_`-separated token (too short to match anywhere).
const TOKENS: &[&str] = &["mm", "bmm", "mmv", "dot", "linear", "fp8", "scaled"];

/// Whether a kernel's name suggests a GEMM (quantizers such as `per_token_group_quant_fp8`
/// mention fp8 but are not: they need a strong fragment to count).
pub fn looks_like_gemm(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    if STRONG.iter().any(|s| lower.contains(s)) {
        return true;
    }
    if lower.contains("quant") {
        return false;
    }
    lower.split(|c: char| !c.is_ascii_alphanumeric()).any(|t| {
        TOKENS.iter().any(|w| {
            t == *w
                || (t.len() > w.len()
                    && t.ends_with(w)
                    && t[..t.len() - w.len()].chars().all(|c| c.is_ascii_digit()))
        })
    })
}

/// A `[[kernel]]` skeleton for one observed kernel. Indexed kernels get guesses that load as
/// they are (first three 8-byte parameters as A, B, D; first three 4-byte ones as M, N, K);
/// every guess is marked, and placeholders that cannot be guessed are `"TODO_..."` names that
/// fail to load until replaced.
pub fn skeleton(stat: &KernelStat) -> String {
    let lower = stat.name.to_ascii_lowercase();
    let fp8 = ["fp8", "f8", "e4m3", "a8w8", "w8a8", "scaled"].iter().any(|s| lower.contains(s));
    let (in_fmt, out_fmt) = if fp8 { ("e4m3fn", "bf16") } else { ("bf16", "bf16") };
    let pattern: String = stat
        .name
        .chars()
        .map(|c| if matches!(c, '[' | ']' | '{' | '}' | '\\' | '"') { '?' } else { c })
        .collect();
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# {} via {}: {} calls, grid {:?}, block {:?}",
        stat.name, stat.entry, stat.calls, stat.grid, stat.block
    );
    let _ = writeln!(s, "# GUESSED from parameter sizes: check every field against the kernel's source.");
    let mut ptrs: Vec<String> = Vec::new();
    let mut ints: Vec<String> = Vec::new();
    let header = match (&stat.param_sizes, stat.packed_bytes) {
        (Some(sizes), _) => {
            let _ = writeln!(s, "# parameters (index: bytes):");
            for (i, sz) in sizes.iter().enumerate() {
                let hint = match sz {
                    8 => {
                        ptrs.push(format!("{{ param = {i}, type = \"ptr\" }}"));
                        "candidate pointer (or i64/u64)"
                    }
                    4 => {
                        ints.push(format!("{{ param = {i}, type = \"i32\" }}"));
                        "i32 / u32 / f32"
                    }
                    _ => "struct or vector: not readable by a spec",
                };
                let _ = writeln!(s, "#   {i}: {sz}  {hint}");
            }
            format!("params = {}", sizes.len())
        }
        (None, Some(bytes)) => {
            let _ = writeln!(s, "# packed argument buffer of {bytes} bytes: fill in byte offsets,");
            let _ =
                writeln!(s, "# e.g. ptr = {{ offset = 16, type = \"ptr\" }}; strides in bytes take `div`.");
            format!("packed_bytes = {bytes}")
        }
        (None, None) => {
            let _ = writeln!(s, "# parameter sizes unknown: fill in `params` and every source.");
            "params = 0  # TODO".into()
        }
    };
    let pick =
        |v: &[String], i: usize, todo: &str| v.get(i).cloned().unwrap_or_else(|| format!("\"TODO_{todo}\""));
    let _ = writeln!(s, "[[kernel]]");
    let _ = writeln!(s, "name = \"{pattern}\"");
    let _ = writeln!(s, "{header}");
    let _ = writeln!(s, "m = {}  # guess", pick(&ints, 0, "m"));
    let _ = writeln!(s, "n = {}  # guess", pick(&ints, 1, "n"));
    let _ = writeln!(s, "k = {}  # guess", pick(&ints, 2, "k"));
    for (i, (what, fmt, extra)) in [
        ("a", in_fmt, "# A: M x K row-major unless trans = \"T\""),
        ("b", in_fmt, "# B: weights stored N x K are trans = \"T\""),
        ("d", out_fmt, "# D: M x N"),
    ]
    .into_iter()
    .enumerate()
    {
        let _ = writeln!(s, "\n[kernel.{what}]  {extra}");
        let _ = writeln!(s, "ptr = {}  # guess", pick(&ptrs, i, &format!("{what}_ptr")));
        let _ = writeln!(s, "format = \"{fmt}\"  # guess");
        if what == "b" {
            let _ = writeln!(s, "trans = \"T\"  # guess");
        }
        let _ = writeln!(s, "# ld = {{ param = ?, type = \"i32\" }}  # default: packed");
    }
    if fp8 {
        let _ = writeln!(s, "\n# FP8 kernels carry scales: uncomment and fill in.");
        let _ = writeln!(s, "# [kernel.a_scale]\n# ptr = {{ param = ?, type = \"ptr\" }}\n# granularity = \"per-token\"  # tensor | per-token | block (block = [1, 128])");
        let _ = writeln!(s, "# [kernel.b_scale]\n# ptr = {{ param = ?, type = \"ptr\" }}\n# granularity = \"per-channel\"  # tensor | per-channel | block (block = [128, 128])");
    }
    s
}
