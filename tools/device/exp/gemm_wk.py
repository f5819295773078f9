#!/usr/bin/env python3
"""Experiment: gemm_wk.cu on the 8B's matrices at 16-128 tokens, on the GPU machine. Not part of ppn: it asks (1)
how much of gemm_tc_w's decode-table figure is the bursts' doing (programmatic dependent launch letting a launch fetch
its first W stages under the one before; no residual) against what it costs behind a predecessor kernel, as inside
a step (docs/PERF.md 2026-12-06 night: ~51 us a launch in the step, 33.6 in bursts), and (2) whether a K split over a
thread-block cluster, partial sums added in k order through distributed shared memory, moves W faster than one CTA
a 64-row tile for all of K.

Compiles gemm_wk.cu (nvcc -cubin -arch=sm_90a), loads it through the CUDA driver (ctypes; torch's primary context),
checks every configuration against an f32 product (bf16-rounding tolerance) and a second run's bits, then times
bursts of 20 launches on rotating copies of W (one CUDA graph replay a burst, median of 5, as cublas_ref.py), five ways:
  plain    the GEMM alone, no PDL, bf16 out (gemm_ws's harness)
  pdl      the GEMM alone, launched with PDL (W's first S stages before its launch wait), bf16 out
  res      as pdl, f32 out = sums + f32 res (the forward's o and down)
  seq      20 x (wk_pre, then the GEMM as res), both with PDL, minus 20 wk_pre alone: the GEMM behind a predecessor
  seq0     the same without PDL
Each line: configuration (BT tokens, S stages, WG warpgroups, ks CTAs a cluster, CTAs), us a launch each way.

--xpad asks (3): x allocated and mapped to whole boxes of the form's tokens (zeros past m), so no box reaches past
the matrix (docs/PERF.md 2026-12-07: 128-row boxes past it were slow here); --tcw times gemm_tc_w's forms alone.

usage: gemm_wk.py [--m 16,64,128] [--json FILE] [--xpad] [--tcw]
"""
import argparse
import ctypes
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
from cublas_ref import BURST, POOL_BYTES, REPS, graph_burst_us  # noqa: E402
from gemm_ws import build_module, ck, cu, report, tmap  # noqa: E402  (the driver, its errors, the maps, nvcc)

SHAPES = [("8b qkv", 6144, 4096), ("8b o", 4096, 4096), ("8b gate|up", 28672, 4096), ("8b down", 4096, 14336)]
FORMS = [(32, 16, 1), (32, 4, 1), (64, 12, 1), (64, 4, 1), (128, 8, 1), (128, 3, 1), (128, 4, 2), (128, 3, 2)]
GEMM_TC_W = {32: (32, 16, 1), 64: (64, 12, 1), 128: (128, 8, 1)}  # kparams.h's forms at up to 128 tokens
KS = (1, 2, 4, 8)


class LaunchAttr(ctypes.Structure):  # CUlaunchAttribute: id, pad to 8, a 64-byte value
    _fields_ = [("id", ctypes.c_uint32), ("pad", ctypes.c_uint32), ("value", ctypes.c_uint32 * 16)]


class LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint32 * 3), ("block", ctypes.c_uint32 * 3), ("smem", ctypes.c_uint32),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(LaunchAttr)), ("nattrs", ctypes.c_uint32)]


ATTR_CLUSTER, ATTR_PDL = 4, 6  # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, _PROGRAMMATIC_STREAM_SERIALIZATION


def launch(fn, grid, block, smem, stream, args, cluster=1, pdl=False):
    attrs = (LaunchAttr * 2)()
    n = 0
    if cluster > 1:
        attrs[n].id = ATTR_CLUSTER
        attrs[n].value[0], attrs[n].value[1], attrs[n].value[2] = cluster, 1, 1
        n += 1
    if pdl:
        attrs[n].id = ATTR_PDL
        attrs[n].value[0] = 1
        n += 1
    cfg = LaunchConfig((ctypes.c_uint32 * 3)(*grid), (ctypes.c_uint32 * 3)(*block), smem, ctypes.c_void_p(stream),
                       ctypes.cast(attrs, ctypes.POINTER(LaunchAttr)), n)
    ck(cu.cuLaunchKernelEx(ctypes.byref(cfg), fn, args, None), "cuLaunchKernelEx")


class Params(ctypes.Structure):
    _fields_ = [("y", ctypes.c_uint64), ("res", ctypes.c_uint64), ("m", ctypes.c_int), ("n", ctypes.c_int),
                ("k", ctypes.c_int)]


def func(mod, name, smem=0):
    fn = ctypes.c_void_p()
    ck(cu.cuModuleGetFunction(ctypes.byref(fn), mod, name.encode()), f"cuModuleGetFunction {name}")
    if smem:
        ck(cu.cuFuncSetAttribute(fn, 8, smem), f"cuFuncSetAttribute {name}")  # MAX_DYNAMIC_SHARED_SIZE_BYTES
    return fn


class Form:
    def __init__(self, mod, bt, s, wg):
        self.bt, self.s, self.wg = bt, s, wg
        stage = 64 * wg * 64 * 2 + bt * 64 * 2
        self.smem = s * ((stage + 1023) // 1024 * 1024) + 1024
        self.fn = {v: func(mod, f"gemm_wk_{bt}_{s}_{wg}_{v}", self.smem) for v in ("00", "10", "11")}

    def run(self, v, wmap, xmap, p, n, m, ks, stream):
        args = (ctypes.c_void_p * 3)(wmap[1], xmap[1], ctypes.addressof(p))
        grid = (ks, n // (64 * self.wg), (m + self.bt - 1) // self.bt)
        launch(self.fn[v], grid, (128 * self.wg + 32, 1, 1), self.smem, stream, args, cluster=ks, pdl=v != "00")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", default="16,64,128")
    ap.add_argument("--json")
    ap.add_argument("--cubin", default="/tmp/gemm_wk.cubin")
    ap.add_argument("--xpad", action="store_true", help="x holds whole BT-row boxes (zeros past m) and its map says "
                    "so: no box reaches past the matrix (the question of m = 65's slow launch, docs/PERF.md 12-07)")
    ap.add_argument("--tcw", action="store_true", help="only gemm_tc_w's forms, no K split")
    a = ap.parse_args()
    mod = build_module(os.path.join(HERE, "gemm_wk.cu"), a.cubin)
    forms = [Form(mod, *f) for f in FORMS]
    pre_fn = func(mod, "wk_pre")
    dev = torch.cuda.get_device_name(0)
    pool = torch.empty(POOL_BYTES // 2, dtype=torch.bfloat16, device="cuda").uniform_(-0.05, 0.05)
    rows, bad = [], 0
    print(f"device: {dev}; gemm_wk: us a launch in bursts of {BURST} (graph replay, median of {REPS}); "
          f"plain / pdl / res alone, seq / seq0 behind wk_pre with / without PDL (its own time taken off)")
    for m in [int(v) for v in a.m.split(",")]:
        bt = 32 if m <= 32 else 64 if m <= 64 else 128
        for name, n, k in SHAPES:
            elems = n * k
            slots = max(1, pool.numel() // elems)
            wsl = [pool[i * elems:(i + 1) * elems].view(n, k) for i in range(slots)]
            mx = -(-m // bt) * bt if a.xpad else m  # x's rows as its map gives them
            h = torch.randn(m, k, device="cuda")
            x = torch.zeros(mx, k, dtype=torch.bfloat16, device="cuda")
            res = torch.randn(m, n, device="cuda")
            y16 = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
            y32 = torch.empty(m, n, dtype=torch.float32, device="cuda")
            kk = ctypes.c_int(k)

            def pre(st, pdl):
                pargs = (ctypes.c_void_p * 4)(ctypes.addressof(hp), ctypes.addressof(xp), ctypes.addressof(kk),
                                              ctypes.addressof(pdl_flag[pdl]))
                launch(pre_fn, (m, 1, 1), (256, 1, 1), 0, st, pargs, pdl=bool(pdl))

            hp, xp = ctypes.c_uint64(h.data_ptr()), ctypes.c_uint64(x.data_ptr())
            pdl_flag = {0: ctypes.c_int(0), 1: ctypes.c_int(1)}
            stream = torch.cuda.current_stream().cuda_stream
            pre(stream, 0)
            torch.cuda.synchronize()
            ref = x[:m].float() @ wsl[0].float().t()
            tol = 2e-2 * max(1.0, ref.abs().max().item())
            pre_us = {v: graph_burst_us(lambda st, v=v: [pre(st, v) for _ in range(BURST)]) for v in (0, 1)}
            for f in forms:
                if f.bt != bt or n % (64 * f.wg) or (a.tcw and (f.bt, f.s, f.wg) != GEMM_TC_W[bt]):
                    continue
                wmaps = [tmap(w.data_ptr(), n, k, 64 * f.wg) for w in wsl]
                xmap = tmap(x.data_ptr(), mx, k, f.bt)
                for ks in (1,) if a.tcw else KS:
                    per = -(-(k // 64) // ks)
                    if (ks - 1) * per >= k // 64:
                        continue
                    p16 = Params(y16.data_ptr(), 0, m, n, k)
                    p32 = Params(y32.data_ptr(), res.data_ptr(), m, n, k)
                    ok = True
                    for v, p, y, want in (("00", p16, y16, ref), ("10", p16, y16, ref), ("11", p32, y32, ref + res)):
                        y.fill_(float("nan"))
                        f.run(v, wmaps[0], xmap, p, n, m, ks, stream)
                        torch.cuda.synchronize()
                        err = (y.float() - want).abs().max().item()
                        y1 = y.clone()
                        f.run(v, wmaps[0], xmap, p, n, m, ks, stream)
                        torch.cuda.synchronize()
                        same = torch.equal(y, y1)
                        if not (err <= tol) or not same:
                            ok = False
                            bad += 1
                            print(f"  BAD {name} m={m} BT={f.bt} S={f.s} WG={f.wg} ks={ks} form {v}: max err {err:.4g} "
                                  f"(tol {tol:.3g}), second run same bits {same}", flush=True)
                    if not ok:
                        continue

                    def burst(st, v, p, with_pre=None, f=f, ks=ks, wmaps=wmaps, xmap=xmap):
                        for i in range(BURST):
                            if with_pre is not None:
                                pre(st, with_pre)
                            f.run(v, wmaps[i % slots], xmap, p, n, m, ks, st)

                    us = {"plain": graph_burst_us(lambda st: burst(st, "00", p16)),
                          "pdl": graph_burst_us(lambda st: burst(st, "10", p16)),
                          "res": graph_burst_us(lambda st: burst(st, "11", p32)),
                          "seq": graph_burst_us(lambda st: burst(st, "11", p32, 1)) - pre_us[1],
                          "seq0": graph_burst_us(lambda st: burst(st, "00", p16, 0)) - pre_us[0]}
                    ctas = ks * (n // (64 * f.wg)) * ((m + f.bt - 1) // f.bt)
                    tag = " (gemm_tc_w's form)" if ks == 1 and (f.bt, f.s, f.wg) == GEMM_TC_W[bt] else ""
                    print(f"  {name:<11} m={m:<4d} BT={f.bt:<3d} S={f.s:<2d} WG={f.wg} ks={ks} ctas={ctas:<4d} "
                          + " ".join(f"{kk_}={v_:7.2f}" for kk_, v_ in us.items())
                          + f"  ({2.0 * n * k / (us['seq'] * 1e3):5.0f} GB/s seq){tag}", flush=True)
                    rows.append({"shape": name, "m": m, "bt": f.bt, "stages": f.s, "wg": f.wg, "ks": ks,
                                 "ctas": ctas, "us": {kk_: round(v_, 3) for kk_, v_ in us.items()},
                                 "pre_us": {str(kk_): round(v_, 3) for kk_, v_ in pre_us.items()}})
    return report(a.json, dev, rows, bad)


if __name__ == "__main__":
    sys.exit(main())
