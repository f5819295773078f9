#!/usr/bin/env python3
"""Experiment: gemm_ws.cu (a TMA-fed, warp-specialized GEMM with a deep ring) against cuBLAS on the 8B's and 1B's
matrices at 16-2,048 tokens, on the GPU machine. Not part of ppn: it asks whether that kernel shape closes the gap
docs/PERF.md's cuBLAS table shows, before anything is built into ppn.

Compiles gemm_ws.cu with nvcc (-cubin -arch=sm_90a), loads it through the CUDA driver (ctypes; torch's primary
context), checks every configuration's output against an f32 product (bf16-rounding tolerance) and that a second
run gives the same bits, then times it as tests/gpu's decode table and cublas_ref.py do: bursts of 20 launches on
rotating copies of W, one CUDA graph replay a burst, median of 5. Every (BT, S, WG, ks) that fits the token count
is tried (K splits only up to 64 tokens); the table shows the best and the cuBLAS figure beside it. Results:
docs/PERF.md, 2026-12-06 evening.

usage: gemm_ws.py [--m 64,80,128,256] [--shapes 8b|1b|all] [--json FILE]
"""
import argparse
import ctypes
import json
import os
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from cublas_ref import BURST, POOL_BYTES, REPS, graph_burst_us  # noqa: E402  (tools/device: the same timing)
SHAPES = [("8b qkv", 6144, 4096), ("8b o", 4096, 4096), ("8b gate|up", 28672, 4096), ("8b down", 4096, 14336),
          ("1b qkv", 3072, 2048), ("1b o", 2048, 2048), ("1b gate|up", 16384, 2048), ("1b down", 2048, 8192)]
KERNELS = [(32, 8, 1), (32, 16, 1), (64, 4, 1), (64, 8, 1), (64, 12, 1), (80, 8, 1), (128, 4, 1), (128, 6, 1),
           (128, 8, 1), (256, 5, 1), (128, 6, 2), (256, 4, 2)]  # (BT tokens, S stages, WG consumer warpgroups)

cu = ctypes.CDLL("libcuda.so.1")


def ck(r, what):
    if r != 0:
        s = ctypes.c_char_p()
        cu.cuGetErrorString(r, ctypes.byref(s))
        raise RuntimeError(f"{what}: CUDA error {r} {s.value.decode() if s.value else ''}")


class TMap(ctypes.Structure):
    _fields_ = [("b", ctypes.c_uint64 * 16)]  # CUtensorMap: 128 bytes, 64-byte aligned (ctypes gives 16: copied below)


def tmap(ptr, rows, cols, box_rows):
    """A 2-D bf16 map of a row-major [rows, cols] matrix, boxes of box_rows x 64, the 128-byte swizzle."""
    buf = ctypes.create_string_buffer(128 + 64)
    addr = (ctypes.addressof(buf) + 63) & ~63
    dims = (ctypes.c_uint64 * 2)(cols, rows)
    strides = (ctypes.c_uint64 * 1)(cols * 2)
    box = (ctypes.c_uint32 * 2)(64, box_rows)
    es = (ctypes.c_uint32 * 2)(1, 1)
    ck(cu.cuTensorMapEncodeTiled(ctypes.c_void_p(addr), 9, 2, ctypes.c_void_p(ptr), dims, strides, box, es, 0, 3, 3,
                                 0), "cuTensorMapEncodeTiled")
    return buf, addr


def build_module(src, cubin):
    """src compiled by nvcc (-cubin -arch=sm_90a -O3) into cubin and loaded in torch's primary context."""
    subprocess.run(["nvcc", "-cubin", "-arch=sm_90a", "-O3", "-o", cubin, src], check=True)
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    mod = ctypes.c_void_p()
    ck(cu.cuModuleLoad(ctypes.byref(mod), cubin.encode()), "cuModuleLoad")
    return mod


def report(path, dev, rows, bad):
    """The rows as JSON at path (if given), the count of wrong configurations printed; the exit status."""
    if path:
        with open(path, "w") as f:
            json.dump({"device": dev, "rows": rows, "bad": bad}, f, indent=1)
    print(f"configurations wrong: {bad}")
    return 1 if bad else 0


class Params(ctypes.Structure):
    _fields_ = [("y", ctypes.c_uint64), ("ws", ctypes.c_uint64), ("count", ctypes.c_uint64), ("m", ctypes.c_int),
                ("n", ctypes.c_int), ("k", ctypes.c_int), ("ks", ctypes.c_int), ("tok_fast", ctypes.c_int)]


def smem_bytes(bt, s, wg):
    stage = 64 * wg * 64 * 2 + bt * 64 * 2
    return s * ((stage + 1023) // 1024 * 1024) + 1024


class Kernel:
    def __init__(self, mod, bt, s, wg):
        self.bt, self.s, self.wg = bt, s, wg
        self.fn = ctypes.c_void_p()
        ck(cu.cuModuleGetFunction(ctypes.byref(self.fn), mod, f"gemm_ws_{bt}_{s}_{wg}".encode()),
           "cuModuleGetFunction")
        self.smem = smem_bytes(bt, s, wg)
        ck(cu.cuFuncSetAttribute(self.fn, 8, self.smem), "cuFuncSetAttribute")

    def launch(self, wmap, xmap, p, n, ks, m, stream):
        args = (ctypes.c_void_p * 3)(wmap[1], xmap[1], ctypes.addressof(p))  # each argument's address
        zt, nt = (m + self.bt - 1) // self.bt, n // (64 * self.wg)
        g = (zt, ks, nt) if p.tok_fast else (nt, ks, zt)
        ck(cu.cuLaunchKernel(self.fn, g[0], g[1], g[2], 128 * self.wg + 32, 1, 1, self.smem, ctypes.c_void_p(stream),
                             args, None), "cuLaunchKernel")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", default="64,80,128,256")
    ap.add_argument("--shapes", default="8b", help="8b, 1b or all")
    ap.add_argument("--json")
    ap.add_argument("--cubin", default="/tmp/gemm_ws.cubin")
    a = ap.parse_args()
    mod = build_module(os.path.join(HERE, "gemm_ws.cu"), a.cubin)
    kernels = [Kernel(mod, bt, s, wg) for bt, s, wg in KERNELS]
    dev = torch.cuda.get_device_name(0)
    pool = torch.empty(POOL_BYTES // 2, dtype=torch.bfloat16, device="cuda").uniform_(-0.05, 0.05)
    ws = torch.empty(64 << 20, dtype=torch.float32, device="cuda")
    count = torch.zeros(1 << 16, dtype=torch.int32, device="cuda")
    rows, bad = [], 0
    print(f"device: {dev}; gemm_ws (BT tokens, S stages, ks K splits) against cuBLAS; us a launch in bursts of "
          f"{BURST} (graph replay, median of {REPS})")
    for m in [int(v) for v in a.m.split(",")]:
        for name, n, k in SHAPES:
            if a.shapes != "all" and not name.startswith(a.shapes):
                continue
            elems = n * k
            slots = max(1, pool.numel() // elems)
            wsl = [pool[i * elems:(i + 1) * elems].view(n, k) for i in range(slots)]
            x = (torch.randn(m, k, device="cuda") * 0.5).to(torch.bfloat16)
            y = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
            ref = (x.float() @ wsl[0].float().t())
            tol = 2e-2 * max(1.0, ref.abs().max().item())
            stream = torch.cuda.current_stream().cuda_stream

            def cublas_burst(_s):
                for i in range(BURST):
                    torch.matmul(x, wsl[i % slots].t(), out=y)

            cub = graph_burst_us(cublas_burst)
            wmaps_by = {wg: [tmap(w.data_ptr(), n, k, 64 * wg) for w in wsl] for wg in (1, 2)}  # W's maps, by box
            best = None
            for kern in kernels:
                if (kern.bt > 32 and m <= 32 or kern.bt < 64 and m > 64 or kern.bt == 80 and m != 80
                        or kern.bt == 256 and m <= 128 or kern.wg == 2 and m < 128 or n % (64 * kern.wg)):
                    continue
                xmap = tmap(x.data_ptr(), m, k, kern.bt)
                wmaps = wmaps_by[kern.wg]
                for ks in ((1, 2, 3, 4, 6) if m <= 64 else (1,)):
                    if ks > k // 64 or ks * m * n > ws.numel():
                        continue
                    p = Params(y.data_ptr(), ws.data_ptr(), count.data_ptr(), m, n, k, ks, int(m > kern.bt))
                    y.fill_(float("nan"))
                    kern.launch(wmaps[0], xmap, p, n, ks, m, stream)
                    torch.cuda.synchronize()
                    err = (y.float() - ref).abs().max().item()
                    y1 = y.clone()
                    kern.launch(wmaps[0], xmap, p, n, ks, m, stream)
                    torch.cuda.synchronize()
                    same = torch.equal(y, y1)
                    if not (err <= tol) or not same or count.abs().sum().item():
                        bad += 1
                        print(f"  BAD {name} m={m} BT={kern.bt} S={kern.s} ks={ks}: max err {err:.4g} (tol {tol:.3g}), "
                              f"second run same bits {same}", flush=True)
                        continue

                    def ws_burst(st, kern=kern, p=p, ks=ks, wmaps=wmaps, xmap=xmap):
                        for i in range(BURST):
                            kern.launch(wmaps[i % slots], xmap, p, n, ks, m, st)

                    us = graph_burst_us(ws_burst)
                    rows.append({"shape": name, "m": m, "bt": kern.bt, "stages": kern.s, "wg": kern.wg, "ks": ks,
                                 "us": round(us, 3),
                                 "cublas_us": round(cub, 3), "max_err": err})
                    if best is None or us < best[0]:
                        best = (us, kern.bt, kern.s, ks, kern.wg)
            wb = 2.0 * n * k
            if best:
                print(f"  {name:<11} m={m:<4d} cublas {cub:8.2f} us ({wb / (cub * 1e3):5.0f} GB/s) | gemm_ws best "
                      f"{best[0]:8.2f} us ({wb / (best[0] * 1e3):5.0f} GB/s, "
                      f"{2e-6 * m * n * k / best[0]:5.0f} TFLOP/s) "
                      f"BT={best[1]} S={best[2]} ks={best[3]} WG={best[4]}  ratio {best[0] / cub:.2f}", flush=True)
    return report(a.json, dev, rows, bad)


if __name__ == "__main__":
    sys.exit(main())
