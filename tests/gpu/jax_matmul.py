"""JAX bf16 matmul on the GPU: XLA reaches cuBLASLt through dlopen + dlsym(handle), never
through a PLT, so only the shim's `dlsym` override can interpose it.

    python3 tests/gpu/jax_matmul.py [OUT.json]
    quantshadow run --label jax --out runs/jax -- python3 tests/gpu/jax_matmul.py OUT.json

Prints the result checksum (and writes it to OUT.json): it must be identical with and without
the shim, and the run under the shim must record checked cublasLtMatmul calls (report.md).
XLA would pick a Triton GEMM for some bf16 dots; --xla_gpu_enable_triton_gemm=false keeps the
dots on cuBLAS(Lt) so that the BLAS hooks are what is exercised here (set XLA_FLAGS yourself
to override).
"""
import hashlib
import json
import os
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_gpu_enable_triton_gemm=false")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402


def main():
    devices = jax.devices()
    if not devices or devices[0].platform != "gpu":
        print(f"no GPU device for JAX: {devices}", file=sys.stderr)
        sys.exit(2)
    ka, kb = jax.random.split(jax.random.PRNGKey(0))
    result = {}
    for m, n, k in [(512, 4096, 4096), (16, 4096, 4096), (256, 1024, 14336)]:
        a = jax.random.normal(ka, (m, k), dtype=jnp.float32).astype(jnp.bfloat16)
        b = (jax.random.normal(kb, (k, n), dtype=jnp.float32) * 0.02).astype(jnp.bfloat16)
        f = jax.jit(lambda x, y: jnp.matmul(x, y, preferred_element_type=jnp.float32).astype(jnp.bfloat16))
        out = np.asarray(jax.device_get(f(a, b)).astype(jnp.float32))
        digest = hashlib.sha256(out.tobytes()).hexdigest()[:16]
        key = f"{m}x{n}x{k}"
        result[key] = {"sha256_16": digest, "sum": float(out.astype(np.float64).sum())}
        print(f"{key}: checksum {digest} sum {result[key]['sum']:.6e}")
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as fh:
            json.dump(result, fh, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
