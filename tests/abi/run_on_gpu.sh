#!/usr/bin/env bash
# Compiles the generated vendor-header checks (cuda_abi_check.c, hip_abi_check.c) against the
# headers installed on this host, runs them and writes one dump per vendor stack found to
# $OUT (or to the directory given as the first argument), named after the header versions,
# e.g. cuda-13.0-cublas-13.1.0.txt. Commit the dump under tests/abi/dumps/: the test
# `header_dumps_match_the_tables` (runtime/tests/vendor_abi.rs) then checks the Rust tables
# against it on every CI run. Nothing is linked against a vendor library; the lines starting
# with '#' record where the dump came from (and, where python3 can load it, the version the
# installed library reports at run time).
#
# Environment: CUDA_HOME (default /usr/local/cuda), ROCM_PATH (default /opt/rocm), CC, CXX.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=${1:-${OUT:-}}
if [[ -z "$out" ]]; then
    echo "usage: $0 OUTPUT_DIR (or set OUT)" >&2
    exit 2
fi
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

key() { awk -v k="$1" '$1 == k { print $2 }' "$2"; }
found=0

cuda_home=${CUDA_HOME:-/usr/local/cuda}
if [[ -f "$cuda_home/include/cublasLt.h" ]]; then
    found=1
    cc=${CC:-gcc}
    "$cc" -std=c11 -Wall -Wextra -Wpedantic -Werror -I"$cuda_home/include" \
        "$here/cuda_abi_check.c" -o "$work/cuda_abi_check"
    "$work/cuda_abi_check" >"$work/cuda.txt"
    cuda=$(key CUDA_VERSION "$work/cuda.txt")
    name="cuda-$((cuda / 1000)).$((cuda % 1000 / 10))-cublas-$(key CUBLAS_VER_MAJOR "$work/cuda.txt").$(key CUBLAS_VER_MINOR "$work/cuda.txt").$(key CUBLAS_VER_PATCH "$work/cuda.txt").txt"
    runtime=$(python3 - "$cuda_home" 2>/dev/null <<'EOF' || true
import ctypes, glob, sys
for path in sorted(glob.glob(sys.argv[1] + "/lib64/libcublasLt.so.*")) or ["libcublasLt.so"]:
    try:
        lib = ctypes.CDLL(path)
    except OSError:
        continue
    lib.cublasLtGetVersion.restype = ctypes.c_size_t
    print(f"{path}: cublasLtGetVersion() = {lib.cublasLtGetVersion()}")
    break
EOF
)
    {
        echo "# Produced by tests/abi/run_on_gpu.sh on $(uname -n) ($(uname -m)), $(date -u +%Y-%m-%dT%H:%MZ)"
        echo "# compiler: $("$cc" --version | head -1); headers: $cuda_home/include"
        if command -v nvcc >/dev/null; then echo "# $(nvcc --version | tail -1)"; fi
        if [[ -n "$runtime" ]]; then echo "# run time: $runtime"; fi
        cat "$work/cuda.txt"
    } >"$out/$name"
    echo "wrote $out/$name ($(grep -vc '^#' "$out/$name") lines)"
fi

rocm=${ROCM_PATH:-/opt/rocm}
if [[ -f "$rocm/include/hipblaslt/hipblaslt.h" ]]; then
    found=1
    # hipblaslt.h is C++ only; hipcc defines __HIP_PLATFORM_AMD__ itself.
    if command -v hipcc >/dev/null; then
        cxx=(hipcc)
    else
        cxx=("${CXX:-g++}" -D__HIP_PLATFORM_AMD__)
    fi
    "${cxx[@]}" -x c++ -std=c++17 -Wall -Wextra -I"$rocm/include" \
        "$here/hip_abi_check.c" -o "$work/hip_abi_check"
    "$work/hip_abi_check" >"$work/hip.txt"
    name="rocm-$(key HIP_VERSION_MAJOR "$work/hip.txt").$(key HIP_VERSION_MINOR "$work/hip.txt")-hipblaslt-$(key HIPBLASLT_VERSION_MAJOR "$work/hip.txt").$(key HIPBLASLT_VERSION_MINOR "$work/hip.txt").$(key HIPBLASLT_VERSION_PATCH "$work/hip.txt").txt"
    {
        echo "# Produced by tests/abi/run_on_gpu.sh on $(uname -n) ($(uname -m)), $(date -u +%Y-%m-%dT%H:%MZ)"
        echo "# compiler: $("${cxx[0]}" --version | head -1); headers: $rocm/include"
        cat "$work/hip.txt"
    } >"$out/$name"
    echo "wrote $out/$name ($(grep -vc '^#' "$out/$name") lines)"
fi

if ((found == 0)); then
    echo "no CUDA headers under $cuda_home/include and no ROCm headers under $rocm/include" >&2
    exit 1
fi
