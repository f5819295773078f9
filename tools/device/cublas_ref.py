#!/usr/bin/env python3
"""cuBLAS (through torch) on the GEMM shapes ppn's forward runs: the reference ppn's own tiles are measured against.

Timed as tests/gpu's decode table times ppn's tiles (test_gpu_gemm_decode): launches back to back in bursts of 20,
each on another copy of W from a pool, median of 5 bursts after a warm-up; here each burst is one CUDA graph
replay, so no host launch cost is in it. y = x @ W^T with x [m, K] and W [N, K] bf16, y bf16 (torch's F.linear:
cuBLASLt with f32 accumulation). Also the copy floor (a device-to-device copy of 512 MiB, bytes read + written
over time) and, for each shape, the name of the kernel cuBLAS picked (torch.profiler).

usage: cublas_ref.py [--m 16,64,...] [--json FILE]     (prints one line per shape and m)
"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F

SHAPES = [  # name, N (rows of W: outputs), K (columns), as tests/gpu/test_gpu_gemm.c's shapes_1b / shapes_8b
    ("1b qkv", 3072, 2048), ("1b o", 2048, 2048), ("1b gate|up", 16384, 2048), ("1b down", 2048, 8192),
    ("1b lm head", 128256, 2048),
    ("8b qkv", 6144, 4096), ("8b o", 4096, 4096), ("8b gate|up", 28672, 4096), ("8b down", 4096, 14336),
    ("8b lm head", 128256, 4096),
]
BURST, REPS = 20, 5
POOL_BYTES = 3 << 30  # several copies of every W but the lm head, so a burst reads HBM, not L2


def median_ms(run):
    """Device ms of run() (work issued on the current stream), between two events: REPS + 1 runs, the first a
    warm-up, the median of the rest."""
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ms = []
    for r in range(REPS + 1):
        e0.record()
        run()
        e1.record()
        torch.cuda.synchronize()
        if r:
            ms.append(e0.elapsed_time(e1))
    return statistics.median(ms)


def graph_burst_us(issue):
    """us a launch of a burst: issue(stream) puts BURST launches on the stream it is given (a CUDA stream handle);
    it runs once as a warm-up, then once into a CUDA graph, whose replays median_ms times."""
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        issue(s.cuda_stream)
        torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=s):
            issue(s.cuda_stream)
    torch.cuda.synchronize()
    us = median_ms(g.replay) * 1e3 / BURST
    del g
    return us


def copy_gbs(n):
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    return 2.0 * n / (median_ms(lambda: b.copy_(a)) * 1e6)


def kernel_names(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sorted(set(names))


def burst_us(pool, n, k, m):
    elems = n * k
    slots = max(1, pool.numel() // elems)
    ws = [pool[i * elems:(i + 1) * elems].view(n, k) for i in range(slots)]
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    y = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")

    def burst(_stream):  # torch issues on the current stream, the one graph_burst_us gives
        for i in range(BURST):
            torch.matmul(x, ws[i % slots].t(), out=y)

    us = graph_burst_us(burst)
    names = kernel_names(lambda: torch.matmul(x, ws[0].t(), out=y))
    return us, names, slots


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", default="1,16,64,80,128,192,256,512,1024,2048,4096")
    ap.add_argument("--json")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    dev = torch.cuda.get_device_name(0)
    floor = copy_gbs(512 << 20)
    print(f"device: {dev}; torch {torch.__version__}, cuBLAS {torch.backends.cuda.preferred_blas_library()}; "
          f"copy floor {floor:.0f} GB/s (512 MiB device-to-device, read + written)")
    print(f"per launch in bursts of {BURST} (one graph replay, median of {REPS}): us, weight GB/s, % of the copy "
          f"floor, TFLOP/s, the kernel")
    pool = torch.empty(POOL_BYTES // 2, dtype=torch.bfloat16, device="cuda").uniform_(-0.05, 0.05)
    rows = []
    for m in [int(v) for v in a.m.split(",")]:
        for name, n, k in SHAPES:
            us, names, slots = burst_us(pool, n, k, m)
            wb = 2.0 * n * k
            gbs = wb / (us * 1e3)
            tf = 2.0 * m * n * k / (us * 1e6)
            row = {"shape": name, "m": m, "n": n, "k": k, "us": round(us, 3), "weight_gbs": round(gbs, 1),
                   "pct_copy_floor": round(100 * gbs / floor, 1), "tflops": round(tf, 1), "w_copies": slots,
                   "kernels": names}
            rows.append(row)
            print(f"  cublas {name:<11} m={m:<5d} {us:9.2f} us {gbs:6.0f} GB/s {100 * gbs / floor:5.1f}% "
                  f"{tf:6.1f} TFLOP/s  {' + '.join(names)}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": dev, "torch": torch.__version__, "copy_floor_gbs": floor, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
