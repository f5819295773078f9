#!/usr/bin/env python3
"""ncu_rows.py - a batch step's kernels (or a mixed step's: decode rows and prompt rows), each timed alone by
Nsight Compute, as one table: what each kernel costs a step, and how the sum compares with the step time the
bench measured with graphs and programmatic dependent launch.

Input: the CSV that `ncu --csv --page raw --print-units base --metrics
gpu__time_duration.sum,launch__grid_size,launch__block_size` prints for `ppn bench --batch B [--mixed P] -n N
--reps 1 --warmup 0` (tools/device/steps.sh). Lines that are not the report are skipped.

A step ends with its one argmax_rows launch (the batch's greedy ids). The first SKIP steps (default 2: the
prompts' prime ends in the first, the graph's first replay may follow) are dropped; each kernel is then named
with its grid and the kernel before it (a GEMM's grid and predecessor tell its matrix apart: o follows the
attention, down the SwiGLU) and averaged over the steps kept. ncu serializes the
launches and times each from its start to its end, so the sum has no launch gaps and none of the overlap that
programmatic dependent launch buys: STEP_MS - sum is what the boundaries between kernels cost in the real step
(negative where the overlap wins).

usage: ncu_rows.py REPORT.csv[.gz] [STEP_MS] [SKIP]
"""
import sys

from ncu_step import rows, short  # the report's rows and the kernels' short names, as ncu_step.py reads them


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    step_ms = float(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2] else None
    skip = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    ks = [(short(r["Kernel Name"]), float(r["gpu__time_duration.sum"].replace(",", "")) / 1e3,
           r.get("launch__grid_size", "?").replace(",", "")) for r in rows(sys.argv[1])]
    steps, cur = [], []
    for k in ks:
        cur.append(k)
        if k[0] == "argmax_rows":
            steps.append(cur)
            cur = []
    steps = steps[skip:]
    if not steps:
        print("ncu_rows: fewer than %d whole steps (ending in argmax_rows) in %s" % (skip + 1, sys.argv[1]),
              file=sys.stderr)
        return 1
    n = len(steps)
    per, order = {}, []
    for s in steps:
        for i, (name, us, grid) in enumerate(s):
            key = "%s [%s] after %s" % (name, grid, s[i - 1][0] if i else "the step's start")
            if key not in per:
                per[key] = [0, 0.0]
                order.append(key)
            per[key][0] += 1
            per[key][1] += us
    total = sum(v[1] for v in per.values()) / n
    launches = sum(v[0] for v in per.values()) / n
    print("%d steps kept; per step: %.0f launches, kernels alone %.1f us" % (n, launches, total))
    print("| kernel [grid] after its predecessor | launches a step | us a step | us a launch | share |")
    print("|---|---|---|---|---|")
    for key in sorted(order, key=lambda k: -per[k][1]):
        c, us = per[key]
        print("| %s | %.1f | %.1f | %.2f | %.1f%% |" % (key, c / n, us / n, us / c, 100.0 * us / n / total))
    if step_ms:
        gap = step_ms * 1e3 - total
        print("bench step %.1f us; kernels alone %.1f us; step - kernels = %.1f us (%.1f us a launch boundary)" % (
            step_ms * 1e3, total, gap, gap / launches))
    return 0


if __name__ == "__main__":
    sys.exit(main())
