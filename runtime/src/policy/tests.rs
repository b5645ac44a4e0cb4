use super::*;

const POLICY: &str = r#"
[[rule]]
name = "no ASM GEMM on gfx950 in CK-free mode"
why = "aiter's ASM a8w8 GEMM returned garbage on gfx950"
when = { arch = "gfx950*", env = { ATOM_CK_FREE = "1" } }
sites = { a_format = "e4m3*" }
deny = { kernel = "*asm*gemm*" }

[[rule]]
name = "CK-free: every FP8 GEMM by Triton"
when = { env = { ATOM_CK_FREE = "1" } }
sites = { a_format = "e4m3*" }
require = { kernel = "*triton*" }

[[rule]]
name = "no cuBLAS fallback without the flag"
when = { env = { ALLOW_BLAS = "" } }
deny = { entry = "cublas*" }
"#;

fn process(arch: &str, env: &[(&str, &str)]) -> ProcessFacts {
    ProcessFacts { arch: arch.into(), env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect() }
}

fn site(ordinal: u32, entry: &str, kernel: Option<&str>, a: &str) -> SiteFacts {
    SiteFacts {
        ordinal,
        entry: entry.into(),
        kernel: kernel.map(Into::into),
        name: Some(format!("model.layers.{ordinal}.mlp")),
        a_format: a.into(),
        b_format: a.into(),
        d_format: "bf16".into(),
    }
}

#[test]
fn deny_and_require_rules_quote_the_rule_and_the_serving_backend() {
    let p = Policy::parse(POLICY, "policy.toml").unwrap();
    let ck_free = process("gfx950", &[("ATOM_CK_FREE", "1"), ("ALLOW_BLAS", "1")]);
    let asm = site(3, "hipModuleLaunchKernel", Some("_ZN5aiter17asm_a8w8_gemm_128"), "e4m3fn");
    let v = p.evaluate(&ck_free, &asm);
    let rules: Vec<&str> = v.iter().map(|v| v.rule.as_str()).collect();
    assert_eq!(rules, ["no ASM GEMM on gfx950 in CK-free mode", "CK-free: every FP8 GEMM by Triton"]);
    assert!(v[0].text.contains("asm_a8w8_gemm") && v[0].text.contains("denies"), "{}", v[0]);
    assert_eq!(v[0].why.as_deref(), Some("aiter's ASM a8w8 GEMM returned garbage on gfx950"));
    assert!(v[1].text.contains("requires kernel = \"*triton*\""), "{}", v[1]);
    // A Triton kernel satisfies both; bf16 sites are not about these rules at all.
    let triton = site(4, "hipModuleLaunchKernel", Some("_gemm_a8w8_blockscale_triton_kernel"), "e4m3fn");
    assert!(p.evaluate(&ck_free, &triton).is_empty());
    assert!(p.evaluate(&ck_free, &site(5, "hipModuleLaunchKernel", Some("asm_gemm"), "bf16")).is_empty());
    // A BLAS entry point has no kernel name: a `require.kernel` rule fails it.
    let blas = p.evaluate(&ck_free, &site(6, "hipblasLtMatmul", None, "e4m3fnuz"));
    assert_eq!(blas.len(), 1);
    assert!(blas[0].text.contains("`hipblasLtMatmul`"), "{}", blas[0]);
}

#[test]
fn conditions_follow_arch_and_environment() {
    let p = Policy::parse(POLICY, "policy.toml").unwrap();
    let asm = site(1, "hipModuleLaunchKernel", Some("asm_a8w8_gemm"), "e4m3fnuz");
    // Another architecture: only the arch-free rule applies.
    let gfx942 = p.evaluate(&process("gfx942", &[("ATOM_CK_FREE", "1"), ("ALLOW_BLAS", "1")]), &asm);
    assert_eq!(
        gfx942.iter().map(|v| v.rule.as_str()).collect::<Vec<_>>(),
        ["CK-free: every FP8 GEMM by Triton"]
    );
    // CK-free mode off: nothing applies.
    assert!(p.evaluate(&process("gfx950", &[("ALLOW_BLAS", "1")]), &asm).is_empty());
    // `""` means unset: the BLAS rule holds only without ALLOW_BLAS.
    let cublas = site(2, "cublasLtMatmul", None, "bf16");
    assert_eq!(p.evaluate(&process("sm_90", &[]), &cublas).len(), 1);
    assert!(p.evaluate(&process("sm_90", &[("ALLOW_BLAS", "yes")]), &cublas).is_empty());
    assert_eq!(p.env_vars(), ["ALLOW_BLAS", "ATOM_CK_FREE"]);
}

#[test]
fn malformed_policies_are_clear_errors() {
    let cases = [
        ("[[rule]]\nname = \"x\"\ndeny = { kernel = \"a\" }\ntypo = 1\n", "typo"),
        ("[[rule]]\nname = \"x\"\n", "neither `deny` nor `require`"),
        ("[[rule]]\nname = \" \"\ndeny = { kernel = \"a\" }\n", "empty name"),
        ("[[rule]]\nname = \"x\"\ndeny = { kernel = \"a[0]\" }\n", "not supported"),
        ("[[rule]]\nname = \"x\"\ndeny = { colour = \"a\" }\n", "colour"),
        (
            "[[rule]]\nname = \"x\"\nwhen = { env = { \"A-B\" = \"1\" } }\ndeny = { kernel = \"a\" }\n",
            "bad variable",
        ),
        ("[[rule]\n", "policy.toml"),
    ];
    for (text, needle) in cases {
        let e = Policy::parse(text, "policy.toml").unwrap_err().to_string();
        assert!(e.contains(needle) && e.contains("policy.toml"), "{needle:?} not in {e:?}");
    }
    assert!(Policy::load(Path::new("/nonexistent/policy.toml")).is_err());
    assert!(Policy::parse("", "empty.toml").unwrap().rules.is_empty());
}

#[test]
fn shipped_policies_parse_and_say_what_they_are_about() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../specs/policies");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let p = Policy::load(&path).unwrap_or_else(|e| panic!("{e}"));
        assert!(!p.rules.is_empty() && p.rules.iter().all(|r| r.why.is_some()), "{}", path.display());
        seen += 1;
    }
    assert!(seen >= 2);
    let ck = Policy::load(&dir.join("atom_ck_free.toml")).unwrap();
    assert_eq!(ck.env_vars(), ["ATOM_CK_FREE"]);
    let asm = site(3, "hipModuleLaunchKernel", Some("_ZN5aiter19asm_a8w8_gemm_kernel"), "e4m3fnuz");
    let v = ck.evaluate(&process("gfx950", &[("ATOM_CK_FREE", "1")]), &asm);
    assert_eq!(v.len(), 2, "{v:?}");
    let triton = Policy::load(&dir.join("triton_fp8_only.toml")).unwrap();
    let on = process("sm_90", &[("QS_TRITON_FP8", "1")]);
    let lt = site(
        4,
        "cublasLtMatmul",
        Some("sm90_xmma_gemm_e4m3e4m3_e4m3f32_f32_tn_n_tilesize128x128x128"),
        "e4m3fn",
    );
    assert_eq!(triton.evaluate(&on, &lt).len(), 2);
    let ours = site(5, "cuLaunchKernelEx", Some("qs_w8a8_block_fp8_matmul"), "e4m3fn");
    assert!(triton.evaluate(&on, &ours).is_empty());
    assert!(triton.evaluate(&process("sm_90", &[]), &lt).is_empty());
}
