#!/usr/bin/env python3
"""hf_compare.py - compare ppn with Hugging Face transformers on a GPU machine.

  fixture DIR --dtype f32|bf16 --tol T      ppn (cuda) vs a shared fixture's logits.f32
  random  KIND OUTDIR --steps 64 --tol T    build a random bf16 model with transformers (KIND: llama|qwen3),
                                            compute its float32 logits on the GPU, run ppn, compare
  random-batch KIND OUTDIR --prompts 24 --steps 24 --dtype bf16 --tol T
                                            the same model; ppn decodes the prompts as one batch (`ppn run
                                            --ids-file`, the batched decode step); transformers, teacher-forced on
                                            each prompt and what ppn generated, must have ppn's id as its argmax
                                            wherever its top-1/top-2 margin exceeds 2 tol max(1, max|row|)

Tolerance rule (fixtures README): max|ppn - ref| <= tol * max(1, max|ref row|) on every row; greedy ids must
agree wherever the reference top-1/top-2 margin exceeds `margin`. Prints one JSON line per comparison.
"""
import argparse, json, os, subprocess, sys
import numpy as np

PPN = os.environ.get("PPN_BIN", "build/ppn")


def compare(logits, ref, margin, tol):
    """margin < 0: per row 2 * tol * scale, the widest gap a result within tolerance could close."""
    worst, worst_row, checked, mism = 0.0, 0, 0, 0
    for t in range(ref.shape[0]):
        scale = max(1.0, float(np.abs(ref[t]).max()))
        d = float(np.abs(logits[t].astype(np.float64) - ref[t]).max())
        if not np.isfinite(d):
            d = float("inf")
        if d / scale > worst:
            worst, worst_row = d / scale, t
        top2 = np.sort(ref[t])[-2:]
        if top2[1] - top2[0] > (margin if margin >= 0 else 2 * tol * scale):
            checked += 1
            mism += int(np.argmax(ref[t]) != np.argmax(logits[t]))
    return worst, worst_row, checked, mism


def run_ppn(model, dtype, prompt, n, out):
    cmd = [PPN, "run", "--model", model, "--backend", "cuda", "--dtype", dtype, "--ids",
           ",".join(map(str, prompt)), "-n", str(n), "--logits-out", out, "--quiet", "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("ppn failed: %s\n%s" % (" ".join(cmd), r.stderr))
    return json.loads(r.stdout)


def fixture(args):
    """Teacher-forced: feed the reference's all_ids (-n 0) so every row sees the reference's inputs; then, for
    f32, a free greedy generation from the prompt must give the reference's greedy ids."""
    ref_meta = json.load(open(os.path.join(args.dir, "reference.json")))
    ids, prompt = ref_meta["all_ids"], ref_meta["prompt_ids"]
    T, V = ref_meta["logits_shape"]
    ref = np.fromfile(os.path.join(args.dir, "logits.f32"), dtype="<f4").reshape(T, V)
    out = "/tmp/ppn_fixture_logits.f32"
    run_ppn(args.dir, args.dtype, ids, 0, out)
    got = np.fromfile(out, dtype="<f4").reshape(-1, V)
    worst, row, checked, mism = compare(got, ref, 1e-3 if args.dtype == "f32" else -1, args.tol)
    gen = run_ppn(args.dir, args.dtype, prompt, T - len(prompt), out)["ids"]
    ids_equal = gen == ids[len(prompt):]
    ok = worst <= args.tol and mism == 0 and (ids_equal or args.dtype != "f32")
    print(json.dumps({"fixture": os.path.basename(args.dir.rstrip("/")), "dtype": args.dtype, "rows": T,
                      "worst_ratio_of_tol": worst / args.tol, "worst_row": row, "greedy_checked": checked,
                      "greedy_mismatch": mism, "generated_ids_equal": ids_equal, "pass": bool(ok)}))
    return 0 if ok else 1


def llama2c(args):
    """stories260K.bin: run.c's 256 greedy ids from BOS and its logits [255, 512]."""
    ids = [int(x) for x in open(args.ids).read().replace(",", " ").split()]
    ref = np.fromfile(args.logits, dtype="<f4").reshape(-1, 512)
    out = "/tmp/ppn_llama2c_logits.f32"
    res = run_ppn(args.bin, "f32", ids[:1], len(ids) - 1, out)
    got = np.fromfile(out, dtype="<f4").reshape(-1, 512)[: ref.shape[0]]
    worst, row, checked, mism = compare(got, ref, 1e-3, args.tol)
    ok = worst <= args.tol and mism == 0 and res["ids"] == ids[1:]
    print(json.dumps({"llama2c": os.path.basename(args.bin), "rows": int(ref.shape[0]),
                      "worst_ratio_of_tol": worst / args.tol, "worst_row": row, "greedy_checked": checked,
                      "greedy_mismatch": mism, "ids_equal": res["ids"] == ids[1:], "pass": bool(ok)}))
    return 0 if ok else 1


def build_random(kind, outdir):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM
    torch.manual_seed(1234)
    if kind == "llama":
        cfg = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
                          num_key_value_heads=4, vocab_size=32000, max_position_embeddings=4096,
                          tie_word_embeddings=False, rms_norm_eps=1e-5,
                          rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                           "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                           "original_max_position_embeddings": 1024})
        model = LlamaForCausalLM(cfg)
    else:
        cfg = Qwen3Config(hidden_size=1024, intermediate_size=3072, num_hidden_layers=8, num_attention_heads=16,
                          num_key_value_heads=8, head_dim=128, vocab_size=32000, max_position_embeddings=4096,
                          tie_word_embeddings=True, rms_norm_eps=1e-6,
                          rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
        model = Qwen3ForCausalLM(cfg)
    with torch.no_grad():  # spread weights so logits are well separated (fixtures do the same)
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 1.0 / np.sqrt(p.shape[1]))
            elif "norm" in name:
                p.normal_(1.0, 0.1)
            else:
                p.normal_(0.0, 0.02)
        model.get_input_embeddings().weight.normal_(0.0, 1.0)
    model.to(torch.bfloat16).save_pretrained(outdir)
    return cfg


def reference_logits(outdir, prompt, steps):
    import torch
    from transformers import AutoModelForCausalLM
    torch.backends.cuda.matmul.allow_tf32 = False
    model = AutoModelForCausalLM.from_pretrained(outdir, dtype=torch.float32, attn_implementation="eager").cuda()
    model.eval()
    ids, rows = list(prompt), []
    with torch.no_grad():
        out = model(torch.tensor([prompt], device="cuda"), use_cache=True)
        past = out.past_key_values
        rows.extend(out.logits[0].float().cpu().numpy())
        for _ in range(steps):
            nxt = int(np.argmax(rows[-1]))
            ids.append(nxt)
            out = model(torch.tensor([[nxt]], device="cuda"), past_key_values=past, use_cache=True)
            past = out.past_key_values
            rows.append(out.logits[0, -1].float().cpu().numpy())
    return ids, np.stack(rows)


def random_model(args):
    os.makedirs(args.outdir, exist_ok=True)
    build_random(args.kind, args.outdir)
    prompt = [1, 307, 4012, 29, 9981, 12, 700, 31999]
    if args.prompt_len > len(prompt):  # a longer prompt primes many rows a GEMM (ppn's prefill tiles at that m)
        import random
        rng = random.Random(args.prompt_len)
        prompt += [rng.randrange(1, 32000) for _ in range(args.prompt_len - len(prompt))]
    ids, ref = reference_logits(args.outdir, prompt, args.steps)
    out = "/tmp/ppn_random_logits.f32"
    # f32: the bf16 weights widened exactly and an f32 KV cache, so ppn and the f32 reference differ only by
    # reduction order. bf16 keeps the KV cache in bf16 as well (as transformers keeps a bf16 model's), so row 0
    # alone already differs by the rounding of v (2^-9 relative): compare it at the bf16 fixtures' tolerance.
    res = run_ppn(args.outdir, args.dtype, prompt, args.steps, out)
    forced = args.prompt_len > 8
    if forced:  # teacher-forced, as fixture(): every row sees the reference's inputs, so a near tie that turns the
        # free run's ids aside (bf16) does not count against the rows after it; the free run's ids are reported
        run_ppn(args.outdir, args.dtype, ids, 0, out)
    got = np.fromfile(out, dtype="<f4").reshape(-1, ref.shape[1])
    worst, row, checked, mism = compare(got, ref, 1e-3 if args.dtype == "f32" else -1, args.tol)
    ok = worst <= args.tol and mism == 0
    apart = next((i for i, (x, y) in enumerate(zip(res["ids"], ids[len(prompt):])) if x != y), None)
    print(json.dumps({"random": args.kind, "dtype": args.dtype, "prompt": len(prompt), "teacher_forced": forced,
                      "params_mb": round(sum(os.path.getsize(os.path.join(args.outdir, f))
                      for f in os.listdir(args.outdir)) / 1e6), "rows": int(ref.shape[0]),
                      "worst_ratio_of_tol": worst / args.tol, "tol": args.tol, "worst_row": row,
                      "greedy_checked": checked, "greedy_mismatch": mism,
                      "ids_equal": res["ids"] == ids[len(prompt):], "first_id_apart": apart, "pass": bool(ok)}))
    return 0 if ok else 1


def random_batch(args):
    """ppn's batched greedy ids against transformers' argmax on the same sequences (no logits leave a batch run).
    Every generated id after the first comes from a batched decode step; each is checked where the reference's
    margin exceeds the widest gap a result within tolerance could close."""
    import random
    import torch
    from transformers import AutoModelForCausalLM
    os.makedirs(args.outdir, exist_ok=True)
    if not os.path.exists(os.path.join(args.outdir, "config.json")):
        build_random(args.kind, args.outdir)
    rng = random.Random(99)
    prompts = [[rng.randrange(1, 32000) for _ in range(3 + (i * 5) % 11)] for i in range(args.prompts)]
    ids_file = os.path.join(args.outdir, "batch_prompts.txt")
    with open(ids_file, "w") as f:
        f.write("".join(",".join(map(str, p)) + "\n" for p in prompts))
    cmd = [PPN, "run", "--model", args.outdir, "--backend", "cuda", "--dtype", args.dtype, "--ids-file", ids_file,
           "-n", str(args.steps)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("ppn failed: %s\n%s" % (" ".join(cmd), r.stderr))
    gens = [[int(x) for x in line.split(",")] for line in r.stdout.strip().splitlines()]
    assert len(gens) == len(prompts), "ppn printed %d lines for %d prompts" % (len(gens), len(prompts))
    torch.backends.cuda.matmul.allow_tf32 = False
    model = AutoModelForCausalLM.from_pretrained(args.outdir, dtype=torch.float32, attn_implementation="eager").cuda()
    model.eval()
    checked = mism = 0
    worst_first = None
    with torch.no_grad():
        for i, (p, g) in enumerate(zip(prompts, gens)):
            seq = p + g
            logits = model(torch.tensor([seq], device="cuda")).logits[0].float().cpu().numpy()
            for t in range(len(g)):
                row = logits[len(p) - 1 + t]
                scale = max(1.0, float(np.abs(row).max()))
                top2 = np.sort(row)[-2:]
                if top2[1] - top2[0] > 2 * args.tol * scale:
                    checked += 1
                    if int(np.argmax(row)) != g[t]:
                        mism += 1
                        worst_first = worst_first or (i, t)
    ok = mism == 0 and checked > 0
    print(json.dumps({"random_batch": args.kind, "dtype": args.dtype, "prompts": len(prompts), "steps": args.steps,
                      "attn_tc": os.environ.get("PPN_ATTN_TC", "default"), "ids_checked": checked,
                      "ids_mismatch": mism, "first_mismatch": worst_first, "pass": bool(ok)}))
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fixture")
    f.add_argument("dir")
    f.add_argument("--dtype", default="f32")
    f.add_argument("--tol", type=float, default=1e-3)
    r = sub.add_parser("random")
    r.add_argument("kind", choices=["llama", "qwen3"])
    r.add_argument("outdir")
    r.add_argument("--steps", type=int, default=64)
    r.add_argument("--dtype", default="f32")
    r.add_argument("--tol", type=float, default=1e-3)
    r.add_argument("--prompt-len", type=int, default=8, help="prompt ids (the first 8 fixed, then seeded random)")
    rb = sub.add_parser("random-batch")
    rb.add_argument("kind", choices=["llama", "qwen3"])
    rb.add_argument("outdir")
    rb.add_argument("--prompts", type=int, default=24)
    rb.add_argument("--steps", type=int, default=24)
    rb.add_argument("--dtype", default="bf16")
    rb.add_argument("--tol", type=float, default=2e-2)
    l2 = sub.add_parser("llama2c")
    l2.add_argument("bin")
    l2.add_argument("ids")
    l2.add_argument("logits")
    l2.add_argument("--tol", type=float, default=1e-3)
    a = ap.parse_args()
    return {"fixture": fixture, "random": random_model, "random-batch": random_batch, "llama2c": llama2c}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
