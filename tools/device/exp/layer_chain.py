#!/usr/bin/env python3
"""Experiment: layer_chain.cu, L layers of the 8B's decode GEMMs at 16 tokens with the passes between them (bf16
rounding of each GEMM's input, the residual adds, two RMS norms, SwiGLU; attention and the rotary left out) in one
persistent launch, sums added in an order that does not depend on timing. Not part of ppn: it asks whether
layer_stream.py's chain (one launch streaming every weight) keeps its share of the copy floor once a real layer's
passes and grid-wide barriers stand between the GEMMs (docs/PERF.md, 2026-12-08).

Compiles layer_chain.cu (nvcc -cubin -arch=sm_90a) and loads it through the CUDA driver (ctypes; torch's primary
context). Checks one launch's residual stream and last norm against torch (f32 products, bf16 at the same points:
tolerance 3e-2 of the larger of 1 and the reference's largest value) and that a second launch from the same inputs
gives the same bits, then times (median of REPS after a warm-up, bursts of BURST launches replayed as one CUDA graph,
the barrier counters zeroed before each replay, outside the timing):
  chain  one launch of the L layers
  layer  one launch a layer (attention's place between layers breaks the stream once a layer)
  coop   as layer, each launch cooperative (the driver's promise that every CTA is resident, which a grid-wide
         barrier needs) and with programmatic dependent launch, captured into the graph (can they be?)
as us a layer and the share of the copy floor (the layer's W bytes over a 512 MiB device copy's bytes read + written
a second, as cublas_ref.py measures it).

usage: layer_chain.py [--layers 8] [--m 16] [--json FILE]
"""
import argparse
import ctypes
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
from cublas_ref import copy_gbs  # noqa: E402
from gemm_ws import build_module  # noqa: E402
from layer_stream import Form, finish, timed_us  # noqa: E402  (the kernels' launch, the report, the timing)

D, F, QKV = 4096, 14336, 6144  # the 8B: model width, SwiGLU width, q|k|v rows
FORMS = [(8, 6), (8, 12)]  # (WARPS, S): layer_chain.cu's kernels
BURST, REPS, EPS = 4, 7, 1e-5


class Params(ctypes.Structure):
    _fields_ = [("g", ctypes.c_uint64), ("L", ctypes.c_int), ("m", ctypes.c_int), ("d", ctypes.c_int),
                ("f", ctypes.c_int), ("xn", ctypes.c_uint64), ("xa", ctypes.c_uint64), ("x2", ctypes.c_uint64),
                ("xh", ctypes.c_uint64), ("res", ctypes.c_uint64), ("wn", ctypes.c_uint64), ("ws", ctypes.c_uint64),
                ("bar", ctypes.c_uint64), ("eps", ctypes.c_float)]


def bf(t):
    return t.to(torch.bfloat16).float()


def reference(layers, xn, res, wn, m):
    """The chain in torch: f32 products of bf16 operands, bf16 where the kernel rounds."""
    xn, res = xn.float(), res.clone()

    def norm(r):
        return bf(r * torch.rsqrt((r * r).mean(dim=1, keepdim=True) + EPS) * wn)

    for wqkv, wo, wgu, wd in layers:
        xa = bf((xn @ wqkv.float().t())[:, :D])
        res = res + xa @ wo.float().t()
        x2 = norm(res)
        gu = x2 @ wgu.float().t()
        g, u = gu[:, :F], gu[:, F:]
        xh = bf(g / (1 + torch.exp(-g)) * u)
        res = res + xh @ wd.float().t()
        xn = norm(res)
    return res, xn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--m", type=int, default=16)
    ap.add_argument("--json")
    ap.add_argument("--cubin", default="/tmp/layer_chain.cubin")
    a = ap.parse_args()
    mod = build_module(os.path.join(HERE, "layer_chain.cu"), a.cubin)
    forms = [Form(mod, w, s, prefix="lc_layer") for w, s in FORMS]
    dev = torch.cuda.get_device_name(0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    L, m = a.layers, a.m
    layers = []
    for _ in range(L):
        layers.append(tuple(torch.empty(n, k, dtype=torch.bfloat16, device="cuda").uniform_(-0.02, 0.02)
                            for n, k in ((QKV, D), (D, D), (2 * F, D), (D, F))))
    tab = torch.tensor([[w.data_ptr(), w.shape[0] | (w.shape[1] << 32)] for ly in layers for w in ly],
                       dtype=torch.int64).cuda()
    xn0 = torch.randn(m, D, device="cuda").to(torch.bfloat16)
    res0 = torch.randn(m, D, device="cuda")
    wn = (1 + 0.1 * torch.randn(D, device="cuda")).contiguous()
    xn, xa, x2 = (torch.empty(m, D, dtype=torch.bfloat16, device="cuda") for _ in range(3))
    xh = torch.empty(m, F, dtype=torch.bfloat16, device="cuda")
    res = torch.empty(m, D, device="cuda")
    ws = torch.zeros(sms * 4 * 16 * 16 * 16, device="cuda")  # [G][LC_MAXT][16][BN <= 256]
    bar = torch.zeros(BURST * 10 * L, dtype=torch.int32, device="cuda")
    layer_bytes = 2 * (QKV * D + D * D + 2 * F * D + D * F)
    gbs = copy_gbs(512 << 20)
    floor_us = layer_bytes / (gbs * 1e3)
    print(f"device: {dev}, {sms} SMs; {L} layers of the 8B with their passes, m = {m}; copy {gbs:.0f} GB/s, a "
          f"layer's W {layer_bytes / 1e6:.1f} MB: floor {floor_us:.2f} us a layer", flush=True)
    ref_res, ref_xn = reference(layers, xn0, res0, wn, m)
    tol = 3e-2 * max(1.0, ref_res.abs().max().item())
    stream = torch.cuda.current_stream().cuda_stream
    keep = []

    def params(l0, nl, b0):
        p = Params(tab.data_ptr() + 16 * 4 * l0, nl, m, D, F, xn.data_ptr(), xa.data_ptr(), x2.data_ptr(),
                   xh.data_ptr(), res.data_ptr(), wn.data_ptr(), ws.data_ptr(), bar.data_ptr() + 4 * b0, EPS)
        keep.append(p)
        return p

    def reset():
        xn.copy_(xn0)
        res.copy_(res0)
        bar.zero_()

    bad, rows = 0, []
    for f in forms:
        outs = []
        for _ in range(2):
            reset()
            f.launch(params(0, L, 0), sms, stream)
            torch.cuda.synchronize()
            outs.append((res.clone(), xn.clone()))
        err = (outs[0][0] - ref_res).abs().max().item()
        errn = (outs[0][1].float() - ref_xn).abs().max().item()
        same = torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
        if not (err <= tol) or not (errn <= 3e-2 * max(1.0, ref_xn.abs().max().item())) or not same:
            bad += 1
            print(f"  BAD WARPS={f.warps} S={f.s}: residual max err {err:.4g} (tol {tol:.3g}), norm {errn:.4g}, "
                  f"second launch same bits {same}", flush=True)
            continue
        r = {"warps": f.warps, "stages": f.s, "res_err": err, "xn_err": errn}
        for mode in ("chain", "layer", "coop"):
            def issue(st, f=f, mode=mode):
                for b in range(BURST):
                    if mode == "chain":
                        f.launch(params(0, L, b * 10 * L), sms, st)
                    else:
                        for l0 in range(L):
                            f.launch(params(l0, 1, b * 10 * L + 10 * l0), sms, st, coop=mode == "coop",
                                     pdl=mode == "coop")

            try:
                r[mode] = round(timed_us(issue, bar.zero_) / (BURST * L), 3)
            except RuntimeError as e:
                r[mode] = None
                print(f"  WARPS={f.warps} S={f.s} {mode}: {e}", flush=True)
        print(f"  WARPS={f.warps} S={f.s:<2d} us a layer: " + "  ".join(
              f"{k} {r[k]:7.2f} ({floor_us / r[k]:6.1%})" if r[k] else f"{k} -" for k in ("chain", "layer", "coop")) +
              f"  [residual err {err:.3g}, norm {errn:.3g}]", flush=True)
        rows.append(r)
    return finish(a.json, {"device": dev, "sms": sms, "layers": L, "m": m, "copy_gbs": gbs, "floor_us": floor_us}, rows,
                  bad)

if __name__ == "__main__":
    sys.exit(main())
