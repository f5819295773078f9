#!/usr/bin/env python3
"""smollm2_check.py - ppn on SmolLM2-135M-Instruct against the fixture's references (issue 19), by the rule of
../shared/fixtures/real/smollm2/README.md; run by tools/device/smollm2.sh, on any backend (sim works too).

  smollm2_check.py --ref DIR --model DIR [--backend cuda] [--dtype f32|bf16] [--stages N] [--chunk C]
                   [--prompts 0,1,2] [--modes teacher,greedy] [--work DIR]

--ref holds reference.json and logits-k.f32; --model the converted checkpoint. For each prompt and mode, ppn is run
(PPN_BIN, default build/ppn) and one JSON line printed; the exit status is 1 when any failed.
  teacher  `ppn run --ids all_ids -n 0 --logits-out`: every fed id's row (T rows, all_ids primed --chunk rows at a
           time, or token by token with --chunk 0).
  greedy   `ppn run --prompt TEXT [--chat] -n 64 --json --logits-out`: the prompt through ppn's tokenizer and chat
           template (its prompt_ids must equal the reference's), free-running greedy, stopped at the end token.
Rules: f32, per stored row max|x - ref| <= 1e-3 * max(1, max|ref row|); the argmax equal to row_argmax where the
reference top-2 margin exceeds twice that bound; greedy ids equal up to the first generated position whose
reference margin is < 1e-3 (none here: all must match, EOS included, and the text be greedy_text without the
end token). bf16: rows within 0.1 * max(1, max|ref row|); argmax where the margin is > 0.5; greedy ids equal up to
the first generated position whose reference margin is < 0.5, and only the rows fed the reference's ids (those
before the first different id) are compared.
"""
import argparse, json, os, subprocess, sys
import numpy as np

PPN = os.environ.get("PPN_BIN", "build/ppn")
RULES = {"f32": (1e-3, None, 1e-3), "bf16": (0.1, 0.5, 0.5)}  # row tol, argmax margin (None: 2 x bound), greedy


def run_ppn(args, extra, logits):
    cmd = [PPN, "run", "--model", args.model, "--backend", args.backend, "--dtype", args.dtype, "--chunk",
           str(args.chunk), "--stages", str(args.stages), "--logits-out", logits, "--json", "--quiet"] + extra
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return None, "ppn exit %d: %s" % (r.returncode, r.stderr.strip()[-400:])
    return json.loads(r.stdout), None


def check_rows(p, ref_rows, got, n_valid, dtype):
    """Rows 0 .. n_valid of got (row t: after all_ids[0..t]) against the stored rows and row_argmax."""
    tol, amargin, _ = RULES[dtype]
    worst, worst_row, checked = 0.0, -1, 0
    for i, pos in enumerate(p["logits_rows"]):
        if pos >= n_valid:
            continue
        ref = ref_rows[i].astype(np.float64)
        d = float(np.abs(got[pos].astype(np.float64) - ref).max())
        r = d / (tol * max(1.0, float(np.abs(ref).max()))) if np.isfinite(d) else float("inf")
        if r >= worst:
            worst, worst_row = r, pos
        checked += 1
    a_checked = a_mism = 0
    for t in range(n_valid):
        bound = tol * max(1.0, p["row_max_abs"][t])
        if p["row_top2_margin"][t] > (amargin if amargin is not None else 2 * bound):
            a_checked += 1
            a_mism += int(int(np.argmax(got[t])) != p["row_argmax"][t])
    return {"rows_checked": checked, "worst_ratio_of_bound": worst, "worst_row": worst_row,
            "argmax_checked": a_checked, "argmax_mismatch": a_mism}


def teacher(args, p, ref_rows, V, logits):
    out, err = run_ppn(args, ["--ids", ",".join(map(str, p["all_ids"])), "-n", "0"], logits)
    if err:
        return {"error": err, "pass": False}
    got = np.fromfile(logits, dtype="<f4").reshape(-1, V)
    if got.shape[0] != p["T"]:
        return {"error": "%d rows, want %d" % (got.shape[0], p["T"]), "pass": False}
    res = check_rows(p, ref_rows, got, p["T"], args.dtype)
    res["pass"] = res["worst_ratio_of_bound"] <= 1 and res["argmax_mismatch"] == 0 and res["rows_checked"] > 0
    return res


def greedy(args, p, ref_rows, V, logits):
    extra = ["--prompt", p["text"], "-n", "64"]
    if p["chat"]:
        extra.append("--chat")
    out, err = run_ppn(args, extra, logits)
    if err:
        return {"error": err, "pass": False}
    n_prompt, want, gen = len(p["prompt_ids"]), p["greedy_ids"], out["ids"]
    thr = RULES[args.dtype][2]
    must = next((i for i in range(len(want)) if p["row_top2_margin"][n_prompt - 1 + i] < thr), len(want))
    same = next((i for i in range(min(len(gen), len(want))) if gen[i] != want[i]), min(len(gen), len(want)))
    ids_ok = gen[:must] == want[:must] and (must < len(want) or gen == want)
    want_text = p["greedy_text"][: -len("<|im_end|>")] if p["eos"] else p["greedy_text"]
    text_ok = out["text"] == want_text
    got = np.fromfile(logits, dtype="<f4").reshape(-1, V)
    res = {"prompt_ids_equal": out["prompt_ids"] == p["prompt_ids"], "ids_checked": must, "ids_equal_upto": same,
           "ids_equal": gen == want, "text_equal": text_ok, "stopped": out.get("stopped")}
    if got.shape[0] != n_prompt + len(gen):
        res.update({"error": "%d rows, want %d" % (got.shape[0], n_prompt + len(gen)), "pass": False})
        return res
    res.update(check_rows(p, ref_rows, got, n_prompt + same, args.dtype))
    res["pass"] = (res["prompt_ids_equal"] and ids_ok and (text_ok or must < len(want))
                   and res["worst_ratio_of_bound"] <= 1 and res["argmax_mismatch"] == 0)
    if not text_ok and must == len(want):
        res["text"] = out["text"]
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ref", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--dtype", default="f32", choices=sorted(RULES))
    ap.add_argument("--stages", type=int, default=1)
    ap.add_argument("--chunk", type=int, default=2048)
    ap.add_argument("--prompts", default="0,1,2")
    ap.add_argument("--modes", default="teacher,greedy")
    ap.add_argument("--work", default=os.environ.get("TMPDIR", "/tmp"))
    args = ap.parse_args()
    meta = json.load(open(os.path.join(args.ref, "reference.json")))
    V = meta["vocab_size"]
    fails = 0
    for k in map(int, args.prompts.split(",")):
        p = meta["prompts"][k]
        ref_rows = np.fromfile(os.path.join(args.ref, p["logits_file"]), dtype="<f4").reshape(-1, V)
        for mode in args.modes.split(","):
            logits = os.path.join(args.work, "smollm2_%s_%d.f32" % (mode, k))
            res = (teacher if mode == "teacher" else greedy)(args, p, ref_rows, V, logits)
            head = {"prompt": k, "mode": mode, "backend": args.backend, "dtype": args.dtype, "stages": args.stages,
                    "chunk": args.chunk}
            head.update(res)
            print(json.dumps(head), flush=True)
            fails += not res["pass"]
            if os.path.exists(logits):
                os.remove(logits)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
