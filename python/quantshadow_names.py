"""Names for quantshadow's per-layer report.

quantshadow identifies a GEMM site by, among other things, the address of its weight. This
helper writes the map file the shim reads (QUANTSHADOW_NAMES, or `quantshadow run --names`):
a JSON object {"0x7f3a...": "model.layers.0.self_attn.q_proj.weight", ...}.

    import quantshadow_names
    quantshadow_names.write(model, "names.json")      # after the model is on the GPU

Write it after the last `.to(device)` / dtype change (addresses change with them), and before
the run starts checking (the shim reads the file once, at the first intercepted GEMM).
"""
import json
import os


def names_of(model):
    """{address: parameter name} for every parameter and buffer of `model` on a GPU."""
    out = {}
    for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
        if tensor is None or not tensor.is_cuda:
            continue
        out.setdefault(tensor.data_ptr(), name)
    return out


def write(model, path=None):
    """Writes the map to `path` (default: $QUANTSHADOW_NAMES); returns the path, or None."""
    path = path or os.environ.get("QUANTSHADOW_NAMES")
    if not path:
        return None
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump({hex(addr): name for addr, name in names_of(model).items()}, f, indent=0)
    os.replace(tmp, path)
    return path
