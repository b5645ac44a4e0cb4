#!/usr/bin/env python3
"""Compile every quantshadow kernel specialisation with NVRTC, without a GPU.

Loads libnvrtc through ctypes (path from $QUANTSHADOW_NVRTC, else the default below), hands
it the kernel source and every kernels/*.h as in-memory headers (exactly how the runtime
compiles them: NVRTC has no file system or system headers), compiles for each architecture
and checks that every expected `extern "C"` entry is in the PTX.

Specialisations come from one of:
  --specs FILE   JSON written by runtime/tests/kernels_compile.rs from the Rust registry
                 (runtime/src/device/abi.rs): [{"source", "defines": [..], "entries": [..]}]
  (default)      the built-in list below: every element format in every format slot of every
                 source, plus the common mixed-format pairs; --all compiles the full cross
                 product of formats instead (slow: ~1.5k programs per architecture).

Options are the runtime's (registry.rs COMPILE_OPTIONS + cuda.rs NVRTC_OPTIONS) plus -DQS_CHECK_LAYOUT, which also
static-asserts every ABI field offset (needs __builtin_offsetof in constant expressions: NVRTC
13.5 has it, the NVRTC 13.0 of the GPU host does not, so the runtime's compile leaves it out).

Prints the NVRTC log of every failure; exit status 1 if anything failed, 2 if NVRTC is missing.
"""

import argparse
import concurrent.futures
import ctypes
import itertools
import json
import os
import re
import sys
import time

DEFAULT_NVRTC = "/opt/nvrtc/nvidia/cu13/lib/libnvrtc.so.13"
KERNEL_DIR = os.path.dirname(os.path.abspath(__file__))

# formats.rs Format discriminants -> entry-name tags (qs_device.h QS_TAG_*).
FORMATS = {
    "f32": 0, "f16": 1, "bf16": 2, "e4m3fn": 3, "e4m3fnuz": 4, "e5m2": 5, "e5m2fnuz": 6,
    "e2m1": 7, "int8": 8, "int4": 9, "ue8m0": 10, "ue4m3": 11, "i32": 12,
}
ELEMENT = [f for f in FORMATS if f not in ("ue8m0", "ue4m3")]
TAG = {v: k for k, v in FORMATS.items()}

# Mixed pairs seen in practice (w4a16, w8a8, fp8 x fp4, int8 -> i32 ...).
MIXED = [
    ("bf16", "int4"), ("f16", "int4"), ("bf16", "e2m1"), ("e4m3fn", "e2m1"), ("bf16", "e4m3fn"),
    ("e4m3fn", "e5m2"), ("e5m2", "e4m3fn"), ("int8", "int8"), ("e4m3fnuz", "e4m3fnuz"), ("f16", "int8"),
]
MIXED_D = ["bf16", "f16", "f32", "e4m3fn", "i32"]


def spec(source, defines, entries):
    return {"source": source, "defines": defines, "entries": entries}


def gemm_spec(a, b):
    d = [f"QS_A_FMT={FORMATS[a]}", f"QS_B_FMT={FORMATS[b]}"]
    return spec("qs_gemm_ref.cu", d, [f"qs_gemm_ref_{a}_{b}", f"qs_gemm_ref_rows_{a}_{b}"])


def sketch_spec(a, b, d):
    defs = [f"QS_A_FMT={FORMATS[a]}", f"QS_B_FMT={FORMATS[b]}", f"QS_D_FMT={FORMATS[d]}"]
    entries = ["qs_sketch_prep", f"qs_sketch_wproj_{b}", f"qs_sketch_check_{a}_{d}"]
    if a in LEAN_A and d in LEAN_D:  # abi.rs lean_sketch_formats
        entries.append(f"qs_sketch_lean_{a}_{d}")
    return spec("qs_sketch.cu", defs, entries)


# Formats of qs_sketch_lean (qs_sketch.cu QS_LEAN_FORMATS).
LEAN_A = ["bf16", "e4m3fn"]
LEAN_D = ["bf16", "f16"]


def compare_spec(d):
    return spec("qs_compare.cu", [f"QS_D_FMT={FORMATS[d]}"], [f"qs_compare_{d}", f"qs_compare_logits_{d}"])


# Fault injection (qs_inject.cu): D formats the output transforms are compiled for.
INJECT_D = ["f32", "f16", "bf16", "e4m3fn", "e4m3fnuz", "e5m2", "e5m2fnuz", "int8", "i32"]


def inject_spec(d):
    return spec(
        "qs_inject.cu", [f"QS_D_FMT={FORMATS[d]}"], [f"qs_inject_output_{d}", "qs_inject_scale", "qs_inject_permute"]
    )


def builtin_specs(full):
    out = []
    if full:
        out += [gemm_spec(a, b) for a, b in itertools.product(ELEMENT, ELEMENT)]
        out += [sketch_spec(a, b, d) for a, b, d in itertools.product(ELEMENT, ELEMENT, ELEMENT)]
    else:
        # Every format in every slot, then the mixed pairs.
        out += [gemm_spec(f, f) for f in ELEMENT]
        out += [sketch_spec(f, f, f) for f in ELEMENT]
        for (a, b), d in zip(MIXED, itertools.cycle(MIXED_D)):
            out.append(gemm_spec(a, b))
            out.append(sketch_spec(a, b, d))
    out += [compare_spec(d) for d in ELEMENT]
    out.append(spec("qs_selftest.cu", [], ["qs_selftest_decode", "qs_selftest_encode", "qs_selftest_hash", "qs_selftest_scale_entry"]))
    out += [inject_spec(d) for d in INJECT_D]
    return out


def headers():
    names = sorted(n for n in os.listdir(KERNEL_DIR) if n.endswith(".h"))
    return [(n, open(os.path.join(KERNEL_DIR, n), "rb").read()) for n in names]


class Nvrtc:
    def __init__(self, path):
        # libnvrtc opens its builtins library by name at the first compile: load the one beside
        # it first (a pip wheel's copy is on no library path), so that name is already resolved.
        d = os.path.dirname(os.path.abspath(path))
        for f in sorted(os.listdir(d)):
            if f.startswith("libnvrtc-builtins.so.") and ".alt." not in f:
                ctypes.CDLL(os.path.join(d, f), mode=ctypes.RTLD_GLOBAL)
        self.lib = ctypes.CDLL(path)
        self.lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        major, minor = ctypes.c_int(), ctypes.c_int()
        self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
        self.version = (major.value, minor.value)

    def compile(self, name, text, hdrs, options):
        """Returns (ok, log, ptx)."""
        lib = self.lib
        prog = ctypes.c_void_p()
        n = len(hdrs)
        srcs = (ctypes.c_char_p * n)(*[h[1] for h in hdrs])
        names = (ctypes.c_char_p * n)(*[h[0].encode() for h in hdrs])
        rc = lib.nvrtcCreateProgram(ctypes.byref(prog), text, name.encode(), n, srcs, names)
        if rc != 0:
            return False, f"nvrtcCreateProgram: {lib.nvrtcGetErrorString(rc).decode()}", b""
        try:
            opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
            rc = lib.nvrtcCompileProgram(prog, len(options), opts)
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            buf = ctypes.create_string_buffer(size.value + 1)
            lib.nvrtcGetProgramLog(prog, buf)
            log = buf.value.decode(errors="replace")
            if rc != 0:
                return False, f"{lib.nvrtcGetErrorString(rc).decode()}\n{log}", b""
            lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
            ptx = ctypes.create_string_buffer(size.value + 1)
            lib.nvrtcGetPTX(prog, ptx)
            return True, log, ptx.value
        finally:
            lib.nvrtcDestroyProgram(ctypes.byref(prog))


# The runtime's NVRTC options (registry.rs COMPILE_OPTIONS + cuda.rs NVRTC_OPTIONS) for the
# built-in list; a --specs file carries the runtime's own list in each entry's "options".
RUNTIME_OPTIONS = ["-std=c++17", "-ftz=false", "-prec-div=true", "-prec-sqrt=true", "-fmad=true", "-default-device"]


def base_options(spec_entry, arch):
    return [f"--gpu-architecture={arch}"] + list(spec_entry.get("options", RUNTIME_OPTIONS))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--specs", help="JSON list of specialisations (from the Rust registry)")
    ap.add_argument("--all", action="store_true", help="full cross product of formats")
    ap.add_argument("--arch", action="append", help="virtual architectures (default compute_90, compute_80)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--ptx-dir", help="write the PTX of every program here")
    ap.add_argument("--filter", help="only sources/defines matching this regex")
    args = ap.parse_args()

    path = os.environ.get("QUANTSHADOW_NVRTC", DEFAULT_NVRTC)
    try:
        nvrtc = Nvrtc(path)
    except OSError as e:
        print(f"check_compile: cannot load NVRTC from {path}: {e}", file=sys.stderr)
        return 2
    specs = json.load(open(args.specs)) if args.specs else builtin_specs(args.all)
    if args.filter:
        rx = re.compile(args.filter)
        specs = [s for s in specs if rx.search(s["source"] + " " + " ".join(s["defines"]))]
    archs = args.arch or ["compute_90", "compute_80"]
    hdrs = headers()
    sources = {}
    jobs = []
    for s in specs:
        if s["source"] not in sources:
            sources[s["source"]] = open(os.path.join(KERNEL_DIR, s["source"]), "rb").read()
        for arch in archs:
            jobs.append((s, arch))

    def run(job):
        s, arch = job
        # QS_CHECK_LAYOUT: also assert the ABI field offsets (needs __builtin_offsetof in constant
        # expressions: NVRTC 13.5 has it; an older NVRTC, such as the GPU host's 13.0, compiles
        # what the runtime compiles, without it).
        layout = ["-DQS_CHECK_LAYOUT"] if nvrtc.version >= (13, 5) else []
        opts = base_options(s, arch) + layout + [f"-D{d}" for d in s["defines"]]
        t0 = time.time()
        ok, log, ptx = nvrtc.compile(s["source"], sources[s["source"]], hdrs, opts)
        missing = []
        if ok:
            text = ptx.decode(errors="replace")
            missing = [e for e in s["entries"] if not re.search(r"\.entry\s+" + re.escape(e) + r"\s*\(", text)]
            if args.ptx_dir:
                tag = "_".join([s["source"].split(".")[0], arch] + [d.replace("=", "") for d in s["defines"]])
                with open(os.path.join(args.ptx_dir, tag + ".ptx"), "wb") as f:
                    f.write(ptx)
        return s, arch, opts, ok, log, missing, time.time() - t0

    failures = 0
    t_start = time.time()
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for s, arch, opts, ok, log, missing, dt in pool.map(run, jobs):
            what = f"{s['source']} {arch} {' '.join(s['defines'])}"
            if not ok:
                failures += 1
                print(f"FAIL {what}\n  options: {' '.join(opts)}\n{log}", flush=True)
            elif missing:
                failures += 1
                print(f"FAIL {what}: entries missing from PTX: {', '.join(missing)}", flush=True)
            else:
                warn = f" (log: {log.strip()})" if log.strip() else ""
                print(f"ok   {what} [{dt:.1f}s]{warn}", flush=True)
    print(
        f"check_compile: NVRTC {nvrtc.version[0]}.{nvrtc.version[1]}, {len(jobs)} programs "
        f"({len(specs)} specialisations x {len(archs)} archs), {failures} failed, "
        f"{time.time() - t_start:.0f}s"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
