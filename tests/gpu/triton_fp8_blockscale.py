#!/usr/bin/env python3
"""A Triton FP8 block-scale GEMM (DeepSeek-V3 / vLLM `w8a8_block_fp8_matmul` style) checked
against a torch dequantize + matmul reference. Its kernel spec is
specs/triton_fp8_blockscale.toml; under the shim:

    QUANTSHADOW_SPECS=specs/triton_fp8_blockscale.toml \
        quantshadow run --mode full -- python3 tests/gpu/triton_fp8_blockscale.py [--bug scale-layout]

A: e4m3 [M, K] with 1x128 per-token-group f32 scales As [M, K/128]; B: e4m3 weight [N, K] with
128x128 f32 block scales Bs [N/128, K/128]; C = (A*As) (B*Bs)^T in bf16.

`--bug scale-layout` plants the bug of issue 5: the activation scales are written column-major
(As^T contiguous) and the launch passes their true strides (1, M), but the kernel's fast path
ignores those strides and reads row-major (m * K/128 + g), as a fallback that ignores a
transpose_scale flag would. The results change for every M > 1; the spec reads the strides
the launch declares, so the shadow reference disagrees with the kernel.

Exit code: without --bug, 0 when every shape matches torch, 1 otherwise. With --bug, 0 when
the bug visibly changed the results of the M > 1 shapes (the planted fault is active), 1 if it
did not.
"""
import argparse
import hashlib
import sys

import torch
import triton
import triton.language as tl

GROUP = 128
INT_ARGS = ["M", "N", "K", "stride_am", "stride_bn", "stride_cm", "stride_As_m", "stride_As_k",
            "stride_Bs_n", "stride_Bs_k"]


# Every integer is do_not_specialize: no value (1, multiples of 16) turns an argument into a
# constexpr, so the compiled parameter list is the same for every shape (the spec relies on it):
#   A, B, C, As, Bs, M, N, K, stride_am, stride_bn, stride_cm, stride_As_m, stride_As_k,
#   stride_Bs_n, stride_Bs_k, + Triton's global_scratch and profile_scratch pointers.
@triton.jit(do_not_specialize=INT_ARGS)
def qs_w8a8_block_fp8_matmul(A, B, C, As, Bs, M, N, K, stride_am, stride_bn, stride_cm,
                             stride_As_m, stride_As_k, stride_Bs_n, stride_Bs_k,
                             GROUP_N: tl.constexpr, GROUP_K: tl.constexpr,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                             SCALES_ASSUME_ROW_MAJOR: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N
    a_ptrs = A + offs_m[:, None] * stride_am + offs_k[None, :]
    b_ptrs = B + offs_n[None, :] * stride_bn + offs_k[:, None]
    k_groups = tl.cdiv(K, GROUP_K)
    offs_bsn = offs_n // GROUP_N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        k_rem = K - kb * BLOCK_K
        a = tl.load(a_ptrs, mask=mask_m[:, None] & (offs_k[None, :] < k_rem), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_rem) & mask_n[None, :], other=0.0)
        g = (kb * BLOCK_K) // GROUP_K
        if SCALES_ASSUME_ROW_MAJOR:
            # The planted bug: the strides the launch passes are ignored.
            a_s = tl.load(As + offs_m * k_groups + g, mask=mask_m, other=0.0)
        else:
            a_s = tl.load(As + offs_m * stride_As_m + g * stride_As_k, mask=mask_m, other=0.0)
        b_s = tl.load(Bs + offs_bsn * stride_Bs_n + g * stride_Bs_k, mask=mask_n, other=0.0)
        acc += tl.dot(a, b) * a_s[:, None] * b_s[None, :]
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    c_ptrs = C + offs_m[:, None] * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, acc.to(C.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


FP8_MAX = 448.0


def quant_act(x):
    """1x128 per-token-group quantization: (e4m3 [M, K], f32 scales [M, K/128])."""
    m, k = x.shape
    g = x.view(m, k // GROUP, GROUP)
    scale = g.abs().amax(dim=-1).clamp(min=1e-12) / FP8_MAX
    q = (g / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.view(m, k), scale.float().contiguous()


def quant_weight(w):
    """128x128 block quantization: (e4m3 [N, K], f32 scales [N/128, K/128])."""
    n, k = w.shape
    blocks = w.view(n // GROUP, GROUP, k // GROUP, GROUP)
    scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / FP8_MAX
    q = (blocks / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.view(n, k), scale.float().contiguous()


def reference(a_q, a_s, b_q, b_s):
    a = a_q.float() * a_s.repeat_interleave(GROUP, dim=1)
    b = b_q.float() * b_s.repeat_interleave(GROUP, dim=0).repeat_interleave(GROUP, dim=1)
    return a @ b.t()


DIGEST = hashlib.sha256()  # every output's bytes: runs with and without the shim must agree


def run_shape(m, n, k, bug, verbose_first, seed=0):
    torch.manual_seed(1000 * m + n + k + 7919 * seed)
    x = torch.randn(m, k, device="cuda")
    w = torch.randn(n, k, device="cuda") * 0.05
    a_q, a_s = quant_act(x)
    b_q, b_s = quant_weight(w)
    if bug:
        # Written column-major (As^T contiguous); the view has shape [M, K/128], strides (1, M).
        a_s_arg = a_s.t().contiguous().t()
    else:
        a_s_arg = a_s
    c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    block_m, block_n, block_k = 64, 128, 128
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    compiled = qs_w8a8_block_fp8_matmul[grid](
        a_q, b_q, c, a_s_arg, b_s, m, n, k, a_q.stride(0), b_q.stride(0), c.stride(0),
        a_s_arg.stride(0), a_s_arg.stride(1), b_s.stride(0), b_s.stride(1),
        GROUP_N=GROUP, GROUP_K=GROUP, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        SCALES_ASSUME_ROW_MAJOR=bug, num_warps=4, num_stages=3)
    torch.cuda.synchronize()
    if verbose_first:
        describe(compiled)
    DIGEST.update(c.view(torch.int16).cpu().numpy().tobytes())
    ref = reference(a_q, a_s, b_q, b_s)
    out = c.float()
    err = (out - ref).abs().max().item()
    rel = err / max(ref.abs().max().item(), 1e-30)
    cos = torch.nn.functional.cosine_similarity(out.flatten(), ref.flatten(), dim=0).item()
    ok = rel <= 2e-2 and cos >= 0.999 and torch.isfinite(out).all().item()
    return ok, err, rel, cos, tuple(a_s_arg.stride())


def describe(compiled):
    """Prints what the spec depends on, as far as this Triton exposes it."""
    try:
        print(f"triton {triton.__version__}; compiled kernel name: {compiled.name}")
        sig = getattr(compiled.src, "signature", None)
        if sig:
            params = [f"{k}:{v}" for k, v in sig.items() if v != "constexpr"]
            print(f"non-constexpr arguments ({len(params)}; Triton appends its scratch pointers): "
                  + ", ".join(params))
    except Exception as e:  # introspection only; never fail the run on it
        print(f"(could not describe the compiled kernel: {e})")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bug", choices=["scale-layout"], help="plant the scale-layout bug")
    p.add_argument("--quick", action="store_true", help="one shape per M (N = K = 4096 only)")
    p.add_argument("--seed", type=int, default=0, help="vary the random data (honest-run repeats)")
    args = p.parse_args()
    bug = args.bug == "scale-layout"
    if not torch.cuda.is_available():
        print("no CUDA device")
        return 2
    nks = [(4096, 4096)] if args.quick else [(4096, 4096), (2048, 7168)]
    print(f"Triton FP8 block-scale GEMM vs torch reference{' (BUG: scale-layout planted)' if bug else ''}")
    print(f"{'M':>5} {'N':>5} {'K':>5}  {'As strides':>12}  {'max abs err':>11}  {'rel err':>9}  {'cosine':>9}  result")
    results = []
    first = True
    for n, k in nks:
        for m in [1, 16, 57, 128, 512]:
            ok, err, rel, cos, strides = run_shape(m, n, k, bug, first, args.seed)
            first = False
            results.append((m, ok))
            print(f"{m:>5} {n:>5} {k:>5}  {str(strides):>12}  {err:>11.4g}  {rel:>9.3g}  {cos:>9.6f}  "
                  f"{'ok' if ok else 'WRONG'}")
    wrong = [m for m, ok in results if not ok]
    print(f"digest: {DIGEST.hexdigest()}")
    if not bug:
        print(f"summary: {len(results) - len(wrong)}/{len(results)} shapes match torch")
        return 0 if not wrong else 1
    wrong_big = [m for m, ok in results if not ok and m > 1]
    expected = sum(1 for m, _ in results if m > 1)
    print(f"summary (bug planted): {len(wrong)}/{len(results)} shapes wrong vs torch "
          f"({len(wrong_big)}/{expected} of the M > 1 shapes; M = 1 has one scale row, unaffected)")
    return 0 if len(wrong_big) == expected else 1


if __name__ == "__main__":
    sys.exit(main())
