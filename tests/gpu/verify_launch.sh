#!/usr/bin/env bash
# GPU verification of kernel-launch interception (issue 5): run from the repo root on the GPU
# host with the release artifacts in .gpu/main (quantshadow + libquantshadow.so). Logs and
# reports go to $OUT.
#   tests/gpu/verify_launch.sh [triton] [bug] [cuda] [jax] [kernels] [overhead]
set -uo pipefail
export PATH=$PWD/.gpu/main:$PATH PYTHONUNBUFFERED=1
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/qscache} QUANTSHADOW_COMPILE=sync QUANTSHADOW_LOG=${QUANTSHADOW_LOG:-info}
OUT=${OUT:-/tmp/qsout}
mkdir -p "$OUT"
steps=${*:-triton bug cuda jax kernels overhead}
digest() { grep '^digest:' "$1" | tail -1 | awk '{print $2}'; }
same_digest() {
  local a b
  a=$(digest "$1")
  b=$(digest "$2")
  if [ -n "$a" ] && [ "$a" = "$b" ]; then echo "identical ($a)"; else echo "DIFFERENT ($a vs $b)"; fi
}
summary() { grep -E "^\*\*Verdict|^- Calls:|skipped|Skips" "$1" | head -8; }
for step in $steps; do
  case $step in
  triton)
    # Every launch of the Triton FP8 block-scale GEMM checked through its spec; results unchanged.
    python3 tests/gpu/triton_fp8_blockscale.py >"$OUT/triton_plain.log" 2>&1
    echo "triton plain: exit $?; $(grep summary "$OUT/triton_plain.log")"
    grep -E "compiled kernel name|non-constexpr" "$OUT/triton_plain.log"
    for mode in sketch full; do
      QUANTSHADOW_SPECS=$PWD/specs/triton_fp8_blockscale.toml \
        quantshadow run --mode "$mode" --label "triton-fp8-blockscale-$mode" --out "$OUT/triton_$mode" -- \
        python3 tests/gpu/triton_fp8_blockscale.py >"$OUT/triton_$mode.log" 2>&1
      echo "triton $mode: run exit $?; outputs $(same_digest "$OUT/triton_plain.log" "$OUT/triton_$mode.log")"
      summary "$OUT/triton_$mode/report.md"
    done
    ;;
  bug)
    # The planted scale-layout bug: the run must fail at the kernel's site.
    python3 tests/gpu/triton_fp8_blockscale.py --bug scale-layout >"$OUT/triton_bug_plain.log" 2>&1
    echo "triton bug plain: exit $?; $(grep summary "$OUT/triton_bug_plain.log")"
    QUANTSHADOW_SPECS=$PWD/specs/triton_fp8_blockscale.toml \
      quantshadow run --mode full --label triton-fp8-scale-layout-bug --out "$OUT/triton_bug" -- \
      python3 tests/gpu/triton_fp8_blockscale.py --bug scale-layout >"$OUT/triton_bug.log" 2>&1
    echo "triton bug under shim: run exit $? (expected non-zero: the report fails)"
    summary "$OUT/triton_bug/report.md"
    grep -E "FAIL" "$OUT/triton_bug/report.md" | head -12
    ;;
  cuda)
    # A CUDA C++ kernel launched with cudaLaunchKernel (runtime API), checked through its spec.
    nvcc -O2 -arch=sm_90 -o /tmp/cuda_gemm tests/gpu/cuda_gemm_kernel.cu >"$OUT/cuda_build.log" 2>&1 || {
      echo "cuda: nvcc failed"
      cat "$OUT/cuda_build.log"
      continue
    }
    /tmp/cuda_gemm >"$OUT/cuda_plain.log" 2>&1
    echo "cuda plain: exit $?; $(grep summary "$OUT/cuda_plain.log")"
    for mode in sketch full; do
      QUANTSHADOW_SPECS=$PWD/specs/cuda_gemm_example.toml \
        quantshadow run --mode "$mode" --label "cuda-gemm-$mode" --out "$OUT/cuda_$mode" -- /tmp/cuda_gemm \
        >"$OUT/cuda_$mode.log" 2>&1
      echo "cuda $mode: run exit $?; outputs $(same_digest "$OUT/cuda_plain.log" "$OUT/cuda_$mode.log")"
      summary "$OUT/cuda_$mode/report.md"
    done
    ;;
  jax)
    # JAX reaches cuBLASLt through dlopen + dlsym(handle): the dlsym hook must route it to us.
    python3 tests/gpu/jax_matmul.py >"$OUT/jax_plain.log" 2>&1
    echo "jax plain: exit $?"
    tail -3 "$OUT/jax_plain.log"
    quantshadow run --mode full --label jax-bf16 --out "$OUT/jax_full" -- python3 tests/gpu/jax_matmul.py \
      >"$OUT/jax_full.log" 2>&1
    echo "jax full: run exit $?; outputs $(same_digest "$OUT/jax_plain.log" "$OUT/jax_full.log")"
    summary "$OUT/jax_full/report.md"
    grep -E "cublasLt|cublas" "$OUT/jax_full/report.md" | head -5
    ;;
  kernels)
    # Observe-mode listing of every launched kernel, with spec suggestions.
    quantshadow kernels --suggest --out "$OUT/kernels" -- python3 tests/gpu/triton_fp8_blockscale.py --quick \
      >"$OUT/kernels.txt" 2>&1
    echo "kernels: exit $?"
    head -30 "$OUT/kernels.txt"
    ;;
  overhead)
    # Launch interception on a workload of many small non-GEMM kernels, no specs: <= 1% goal.
    for round in 1 2; do
      r=$(python3 tests/gpu/launch_overhead.py 2>/dev/null | tail -1)
      echo "overhead round $round plain: $r"
      r=$(QUANTSHADOW_MODE=observe LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so python3 tests/gpu/launch_overhead.py 2>/dev/null | tail -1)
      echo "overhead round $round observe: $r"
    done
    ;;
  *) echo "unknown step $step" ;;
  esac
done
