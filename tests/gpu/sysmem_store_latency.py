"""How long does a kernel that writes 8 bytes to pinned host memory keep its stream busy?

    python3 tests/gpu/sysmem_store_latency.py

The sketch check publishes its result into a ring in mapped host memory. On the GPU host
(a Firecracker VM) a sketch launch stays ~30 us on its stream while its multiprocessors are
busy for a fraction of that. This isolates the cost: back-to-back launches of one-thread
kernels that store 8 bytes to device memory, or to mapped pinned host memory, with and
without a system-scope fence, timed with events (median of trials).
"""
import statistics

import cupy as cp

SRC = r"""
extern "C" __global__ void store_dev(unsigned long long* p, unsigned long long v) { p[0] = v; }
extern "C" __global__ void store_host(unsigned long long* p, unsigned long long v) { p[0] = v; }
extern "C" __global__ void store_host_fence(unsigned long long* p, unsigned long long v) {
    p[0] = v; __threadfence_system();
}
extern "C" __global__ void load_host(const unsigned long long* p, unsigned long long* out) {
    out[0] = *(volatile const unsigned long long*)p;
}
extern "C" __global__ void empty() {}
"""


def main():
    mod = cp.RawModule(code=SRC)
    dev = cp.zeros(4, dtype=cp.uint64)
    pinned = cp.cuda.alloc_pinned_memory(64)
    host_ptr = pinned.ptr  # UVA: the same address works on the device
    cases = {
        "empty kernel": (mod.get_function("empty"), ()),
        "store 8 B to device memory": (mod.get_function("store_dev"), (dev, cp.uint64(1))),
        "store 8 B to mapped host memory": (mod.get_function("store_host"), (cp.uint64(host_ptr), cp.uint64(1))),
        "store 8 B to host + __threadfence_system": (
            mod.get_function("store_host_fence"),
            (cp.uint64(host_ptr), cp.uint64(1)),
        ),
        "load 8 B from mapped host memory": (mod.get_function("load_host"), (cp.uint64(host_ptr), dev)),
    }
    reps = 2000
    print("| kernel (1 thread, back-to-back) | us per launch |\n| --- | --- |")
    for name, (fn, args) in cases.items():
        for _ in range(50):
            fn((1,), (1,), args)
        cp.cuda.Device().synchronize()
        times = []
        for _ in range(7):
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            for _ in range(reps):
                fn((1,), (1,), args)
            end.record()
            end.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, end) * 1e3 / reps)
        print(f"| {name} | {statistics.median(times):.2f} |")


if __name__ == "__main__":
    main()
