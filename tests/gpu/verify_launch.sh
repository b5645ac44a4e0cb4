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
    # A CUDA C++ kernel launched with cudaLaunchKernel (runtime API), checked through its spec:
    # with the shared CUDA runtime (cudaLaunchKernel interposed by symbol) and with nvcc's
    # default static runtime (no exported cudaLaunchKernel: only the driver entry points it
    # fetches through dlsym + cuGetProcAddress can be reached).
    for rt in shared static; do
      nvcc -O2 -arch=sm_90 -cudart "$rt" -o "/tmp/cuda_gemm_$rt" tests/gpu/cuda_gemm_kernel.cu >"$OUT/cuda_build_$rt.log" 2>&1 || {
        echo "cuda $rt: nvcc failed"
        cat "$OUT/cuda_build_$rt.log"
        continue
      }
      "/tmp/cuda_gemm_$rt" >"$OUT/cuda_${rt}_plain.log" 2>&1
      echo "cuda $rt plain: exit $?; $(grep summary "$OUT/cuda_${rt}_plain.log")"
      for mode in sketch full; do
        QUANTSHADOW_LOG=debug QUANTSHADOW_SPECS=$PWD/specs/cuda_gemm_example.toml \
          quantshadow run --mode "$mode" --label "cuda-gemm-$rt-$mode" --out "$OUT/cuda_${rt}_$mode" -- \
          "/tmp/cuda_gemm_$rt" >"$OUT/cuda_${rt}_$mode.log" 2>&1
        echo "cuda $rt $mode: run exit $?; outputs $(same_digest "$OUT/cuda_${rt}_plain.log" "$OUT/cuda_${rt}_$mode.log")"
        [ -f "$OUT/cuda_${rt}_$mode/report.md" ] && summary "$OUT/cuda_${rt}_$mode/report.md"
      done
      grep -iE "getprocaddress|launch|dlsym" "$OUT/cuda_${rt}_sketch.log" | head -8
    done
    ;;
  jax)
    # JAX reaches cuBLASLt through dlopen + dlsym(handle): the dlsym hook must route it to us.
    python3 tests/gpu/jax_matmul.py "$OUT/jax_plain.json" >"$OUT/jax_plain.log" 2>&1
    echo "jax plain: exit $?"
    quantshadow run --mode full --label jax-bf16 --out "$OUT/jax_full" -- python3 tests/gpu/jax_matmul.py \
      "$OUT/jax_full.json" >"$OUT/jax_full.log" 2>&1
    echo "jax full: run exit $?; outputs $(cmp -s "$OUT/jax_plain.json" "$OUT/jax_full.json" && echo identical || echo DIFFERENT)"
    grep checksum "$OUT/jax_full.log" | head -3
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
    python3 tests/gpu/launch_overhead.py --shim "$PWD/.gpu/main/libquantshadow.so" --rounds 5 >"$OUT/overhead.txt" 2>&1
    echo "overhead: exit $?"
    cat "$OUT/overhead.txt"
    ;;
  *) echo "unknown step $step" ;;
  esac
done
