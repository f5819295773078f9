#!/usr/bin/env python3
"""ncu_step.py - the decode step's kernels, each timed alone by Nsight Compute, as one table.

Input: the CSV that `ncu --csv --page raw --print-units base --metrics gpu__time_duration.sum,...` prints
for a run of `ppn bench ... --device-greedy --warmup 0 --reps 1` (tools/device/perf.sh, phase ncu). Lines
that are not the report (the program's own output, ==PROF== lines) are skipped.

The decode region is everything after the last ppn_k_matmat (the prompt's kernels); a step starts at each
ppn_k_embed, or at the ppn_k_set_hdr just before it (the device-greedy loop writes the header first). Matvecs are named by their place in a layer: q|k|v, then attention, o, gate|up, SwiGLU, down;
a step's last matvec is the lm head. ncu serializes kernels and times each from its start to its end, so the
sum is the step without launch gaps and without the overlap programmatic dependent launch buys: set beside
the bench's median step it shows how much of the step is kernels and how much is between them.

usage: ncu_step.py REPORT.csv [STEP_MS]
"""
import csv
import gzip
import statistics
import sys


def rows(path):
    """The report's kernel rows as dicts (path may be gzipped: steps.sh keeps them so)."""
    f = gzip.open(path, "rt", errors="replace") if path.endswith(".gz") else open(path, errors="replace")
    lines = [ln for ln in f if ln.startswith('"')]
    rd = csv.reader(lines)
    head = None
    for r in rd:
        if head is None:
            if "Kernel Name" in r and "gpu__time_duration.sum" in r:
                head = r
            continue
        if len(r) != len(head) or not r[head.index("ID")].strip().isdigit():
            continue  # the units row, or a stray line
        yield dict(zip(head, r))


def short(name):
    n = name.split("(")[0].strip()
    return n[len("ppn_k_"):] if n.startswith("ppn_k_") else n


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    ks = [(short(r["Kernel Name"]), float(r["gpu__time_duration.sum"].replace(",", "")) / 1e3,
           r.get("launch__grid_size", "?"), r.get("launch__block_size", "?")) for r in rows(sys.argv[1])]
    if not ks:
        print("ncu_step: no kernel rows in", sys.argv[1], file=sys.stderr)
        return 1
    last_mm = max([i for i, k in enumerate(ks) if k[0] == "matmat"], default=-1)
    dec = ks[last_mm + 1:]
    steps, prev = [], None
    for k in dec:
        if k[0] == "embed":
            head = []
            if prev is not None and prev[0] == "set_hdr":  # it opens this step, not the one before
                if steps and steps[-1][-1] is prev:
                    steps[-1].pop()
                head = [prev]
            steps.append(head)
        if steps:
            steps[-1].append(k)
        prev = k
    # a step cut off by --launch-count lacks its head: keep the whole ones (those with an argmax)
    steps = [s for s in steps if any(k[0] == "argmax" for k in s)]
    if not steps:
        print("ncu_step: no whole decode step (embed .. argmax) after the prompt", file=sys.stderr)
        return 1
    per = {}  # op -> list of (us) over all steps
    order = []
    for s in steps:
        mv = [i for i, k in enumerate(s) if k[0] == "matvec"]
        head = mv[-1] if mv else -1
        nxt = "qkv"
        for i, (n, us, grid, blk) in enumerate(s):
            op = n
            if n == "matvec":
                if i == head:
                    op = "matvec lm head"
                else:
                    op = "matvec " + nxt
                    nxt = {"qkv": "o", "o": "gate|up", "gate|up": "down", "down": "qkv"}[nxt]
            if op not in per:
                per[op] = []
                order.append(op)
            per[op].append((us, grid, blk))
    ns = len(steps)
    tot = sum(us for s in steps for _, us, _, _ in s) / ns
    print("%d whole decode steps profiled (%d kernels a step)" % (ns, round(sum(len(s) for s in steps) / ns)))
    print("| kernel | calls a step | median us a call | min | max | us a step | share | grid x block |")
    print("|---|---|---|---|---|---|---|---|")
    for op in order:
        v = [u for u, _, _ in per[op]]
        g = per[op][0]
        print("| %s | %g | %.2f | %.2f | %.2f | %.1f | %.1f%% | %s x %s |" % (
            op.replace("|", "\\|"), len(v) / ns, statistics.median(v), min(v), max(v), sum(v) / ns, 100 * sum(v) / ns / tot, g[1], g[2]))
    print("| **all kernels, each alone** | | | | | **%.1f** | | |" % tot)
    if len(sys.argv) > 2:
        step = float(sys.argv[2]) * 1e3
        print("bench median step %.1f us: kernels alone %.1f us; between and around them %.1f us (%.1f%%)" % (
            step, tot, step - tot, 100 * (step - tot) / step))
    return 0


if __name__ == "__main__":
    sys.exit(main())
