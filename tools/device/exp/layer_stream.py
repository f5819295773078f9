#!/usr/bin/env python3
"""Experiment: layer_stream.cu on the 8B's four decode GEMMs at 16 tokens, on the GPU machine. Not part of ppn: it
asks how close to the copy floor a persistent kernel that streams every weight of several layers in one launch comes,
against the same k-loop launched once a GEMM (docs/PERF.md 2026-12-07: "a persistent kernel per stage", not built).

Compiles layer_stream.cu (nvcc -cubin -arch=sm_90a), loads it through the CUDA driver (ctypes; torch's primary
context). L layers of the 8B (q|k|v 6144 x 4096, o 4096 x 4096, gate|up 28672 x 4096, down 4096 x 14336, bf16,
uniform in +-0.05), x of 16 tokens a GEMM. Checks each phase of one launch against an f32 product (bf16-rounding
tolerance), then times, per kernel form (WARPS consumer warps, S ring stages), median of REPS after a warm-up, bursts
of BURST launches replayed as one CUDA graph (the counters zeroed before each replay, outside the timing):
  chain  one launch of all 4 L GEMMs, each GEMM's x read only once every CTA has finished the GEMM before it
  free   the same launch without that wait (the weights' stream alone: the ceiling)
  layer  one launch a layer (L launches of its 4 GEMMs, chained as above): attention's place, between layers here,
         breaks the stream once a layer (what a persistent kernel around attention would pay)
  split  one launch a GEMM (4 L launches, the same k-loop and shares)
Each as us a layer and its share of the copy floor (the layer's W bytes over a 512 MiB device copy's bytes read +
written a second, as cublas_ref.py measures it).

usage: layer_stream.py [--layers 8] [--m 16] [--json FILE]
"""
import argparse
import ctypes
import json
import os
import statistics
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
from cublas_ref import copy_gbs  # noqa: E402
from gemm_ws import build_module, ck, cu  # noqa: E402
from gemm_wk import LaunchAttr, LaunchConfig  # noqa: E402  (cuLaunchKernelEx's structures)

LAYER = [("q|k|v", 6144, 4096), ("o", 4096, 4096), ("gate|up", 28672, 4096), ("down", 4096, 14336)]
FORMS = [(4, 16), (8, 6), (8, 9), (8, 12), (16, 6)]  # (WARPS, S): layer_stream.cu's kernels
BURST, REPS = 4, 7


class Params(ctypes.Structure):
    _fields_ = [("ph", ctypes.c_uint64), ("count", ctypes.c_uint64), ("nph", ctypes.c_int), ("m", ctypes.c_int),
                ("barrier", ctypes.c_int)]


ATTR_COOP, ATTR_PDL = 2, 6  # CU_LAUNCH_ATTRIBUTE_COOPERATIVE, _PROGRAMMATIC_STREAM_SERIALIZATION


class Form:
    """Kernel PREFIX_WARPS_S of mod (ls_stream's shape: WARPS consumer warps and two producers, S stages of a
    16 WARPS x 64 W k-tile and a 16 x 64 x k-tile), launched on one CTA an SM with its one struct argument."""

    def __init__(self, mod, warps, s, prefix="ls_layer"):
        self.warps, self.s = warps, s
        self.smem = s * (16 * warps * 128 + 16 * 128)
        self.fn = ctypes.c_void_p()
        ck(cu.cuModuleGetFunction(ctypes.byref(self.fn), mod, f"{prefix}_{warps}_{s}".encode()), "cuModuleGetFunction")
        ck(cu.cuFuncSetAttribute(self.fn, 8, self.smem), "cuFuncSetAttribute")  # MAX_DYNAMIC_SHARED_SIZE_BYTES

    def launch(self, p, grid, stream, coop=False, pdl=False):
        args = (ctypes.c_void_p * 1)(ctypes.addressof(p))
        block = 32 * self.warps + 64
        if not coop and not pdl:
            ck(cu.cuLaunchKernel(self.fn, grid, 1, 1, block, 1, 1, self.smem, ctypes.c_void_p(stream), args, None),
               "cuLaunchKernel")
            return
        attrs = (LaunchAttr * 2)()
        n = 0
        for on, aid in ((coop, ATTR_COOP), (pdl, ATTR_PDL)):
            if on:
                attrs[n].id, attrs[n].value[0] = aid, 1
                n += 1
        cfg = LaunchConfig((ctypes.c_uint32 * 3)(grid, 1, 1), (ctypes.c_uint32 * 3)(block, 1, 1), self.smem,
                           ctypes.c_void_p(stream), ctypes.cast(attrs, ctypes.POINTER(LaunchAttr)), n)
        ck(cu.cuLaunchKernelEx(ctypes.byref(cfg), self.fn, args, None), "cuLaunchKernelEx (cooperative / PDL)")


def finish(path, head, rows, bad):
    """head with rows and bad as JSON at path (if given), the count of wrong forms printed; the exit status."""
    if path:
        with open(path, "w") as fh:
            json.dump(dict(head, rows=rows, bad=bad), fh, indent=1)
    print(f"forms wrong: {bad}")
    return 1 if bad else 0


def timed_us(issue, before):
    """us of one replay of a graph of issue(stream): before() runs ahead of each replay, outside the events."""
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        before()
        issue(s.cuda_stream)
        torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=s):
            issue(s.cuda_stream)
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ms = []
    for r in range(REPS + 1):
        before()
        e0.record()
        g.replay()
        e1.record()
        torch.cuda.synchronize()
        if r:
            ms.append(e0.elapsed_time(e1))
    del g
    return statistics.median(ms) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--m", type=int, default=16)
    ap.add_argument("--json")
    ap.add_argument("--cubin", default="/tmp/layer_stream.cubin")
    a = ap.parse_args()
    mod = build_module(os.path.join(HERE, "layer_stream.cu"), a.cubin)
    forms = [Form(mod, w, s) for w, s in FORMS]
    dev = torch.cuda.get_device_name(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    L, m = a.layers, a.m
    ws, xs, ys, rows = [], [], [], []
    for _ in range(L):
        for _name, n, k in LAYER:
            ws.append(torch.empty(n, k, dtype=torch.bfloat16, device="cuda").uniform_(-0.05, 0.05))
            xs.append((torch.randn(m, k, device="cuda") * 0.5).to(torch.bfloat16))
            ys.append(torch.zeros(m, n, dtype=torch.float32, device="cuda"))
    nph = len(ws)
    tab = torch.tensor([[w.data_ptr(), x.data_ptr(), y.data_ptr(), w.shape[0] | (w.shape[1] << 32)]
                        for w, x, y in zip(ws, xs, ys)], dtype=torch.int64).cuda()
    count = torch.zeros(BURST * nph * 2, dtype=torch.int32, device="cuda")
    layer_bytes = sum(2 * n * k for _name, n, k in LAYER)
    gbs = copy_gbs(512 << 20)
    floor_us = layer_bytes / (gbs * 1e3)
    print(f"device: {dev}, {sms} SMs; {L} layers of the 8B, m = {m}; copy {gbs:.0f} GB/s, a layer's W "
          f"{layer_bytes / 1e6:.1f} MB: floor {floor_us:.2f} us a layer", flush=True)
    stream = torch.cuda.current_stream().cuda_stream
    refs = [x.float() @ w.float().t() for w, x in zip(ws, xs)]
    bad = 0
    keep = []  # the launches' params outlive the graphs' capture

    def params(ph0, n, c0, barrier):
        p = Params(tab.data_ptr() + 32 * ph0, count.data_ptr() + 4 * c0, n, m, barrier)
        keep.append(p)
        return p

    for f in forms:
        for y in ys:
            y.zero_()
        count.zero_()
        f.launch(params(0, nph, 0, 1), sms, stream)
        torch.cuda.synchronize()
        errs = [((y - r).abs().max().item(), 2e-2 * max(1.0, r.abs().max().item())) for y, r in zip(ys, refs)]
        wrong = sum(1 for e, tol in errs if not e <= tol)
        counts_ok = bool((count[:nph] == sms).all().item())
        if wrong or not counts_ok:
            bad += 1
            print(f"  BAD WARPS={f.warps} S={f.s}: {wrong} of {nph} GEMMs off (worst {max(e for e, _ in errs):.4g}), "
                  f"counters {'whole' if counts_ok else 'short'}", flush=True)
            continue
        res = {"warps": f.warps, "stages": f.s, "max_err": max(e for e, _ in errs)}
        for mode in ("chain", "free", "layer", "split"):
            def issue(st, f=f, mode=mode):
                for b in range(BURST):
                    if mode == "split":
                        for ph in range(nph):
                            f.launch(params(ph, 1, (b * nph + ph) * 2, 0), sms, st)
                    elif mode == "layer":
                        for ph in range(0, nph, len(LAYER)):
                            f.launch(params(ph, len(LAYER), (b * nph + ph) * 2, 1), sms, st)
                    else:
                        f.launch(params(0, nph, b * nph * 2, int(mode == "chain")), sms, st)

            us = timed_us(issue, count.zero_) / (BURST * L)
            res[mode] = round(us, 3)
        print(f"  WARPS={f.warps} S={f.s:<2d} us a layer: chain {res['chain']:7.2f} ({floor_us / res['chain']:6.1%} of "
              f"the floor)  free {res['free']:7.2f} ({floor_us / res['free']:6.1%})  layer {res['layer']:7.2f} "
              f"({floor_us / res['layer']:6.1%})  split {res['split']:7.2f} "
              f"({floor_us / res['split']:6.1%})", flush=True)
        rows.append(res)
    return finish(a.json, {"device": dev, "sms": sms, "layers": L, "m": m, "copy_gbs": gbs, "floor_us": floor_us}, rows,
                  bad)

if __name__ == "__main__":
    sys.exit(main())
