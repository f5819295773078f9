#!/usr/bin/env python3
"""make_corpus.py - (re)write the seed corpus of tests/fuzz/corpus/<target>/ from ../shared/fixtures and
hand-written edge cases. Run from anywhere: python3 tests/fuzz/make_corpus.py [FIXTURES]. The output is
committed; rerun only to change the seeds (files a fuzzer found, named crash-* or regress-*, are left alone).

Seeds are small on purpose (each well under 64 KB): libFuzzer mutates them, and a short CI run can only explore
near what it starts from. Fixture-derived seeds keep the fixtures' structure (keys, dtypes, names, pipeline
steps) with their sizes cut down."""
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "..", "..", "shared", "fixtures")
OUT = os.path.join(HERE, "corpus")


def put(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def clear(target):
    d = os.path.join(OUT, target)
    if os.path.isdir(d):
        for n in os.listdir(d):
            if not n.startswith(("crash-", "regress-")):
                os.remove(os.path.join(d, n))


def js(o):
    return json.dumps(o, separators=(",", ":"))


# ---- safetensors ----------------------------------------------------------------------------------------------

DSIZE = {"F32": 4, "BF16": 2, "F16": 2, "F64": 8, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
         "F8_E4M3": 1}


def st_file(tensors, meta=None, header=None, pad=0):
    """tensors: [(name, dtype, shape)] packed in order; header overrides the JSON text."""
    h, off = {}, 0
    if meta is not None:
        h["__metadata__"] = meta
    for name, dt, shape in tensors:
        n = DSIZE[dt]
        for s in shape:
            n *= s
        h[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    text = (header if header is not None else js(h)).encode()
    return struct.pack("<Q", len(text)) + text + bytes(range(256)) * (off // 256) + bytes(off % 256 + pad)


def fixture_header(path, keep):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
    return [(k, v["dtype"], [min(s, 3) for s in v["shape"]]) for k, v in h.items() if k != "__metadata__"][:keep]


def safetensors_seeds():
    clear("safetensors")
    for fam in ("llama-tiny", "qwen2-tiny", "qwen3-tiny"):
        put("safetensors", f"fixture-{fam}", st_file(fixture_header(f"{FIX}/hf/{fam}/model.safetensors", 6),
                                                      meta={"format": "pt"}))
    put("safetensors", "empty-header", st_file([], header="{}"))
    put("safetensors", "dtypes", st_file([(d, d, [2]) for d in DSIZE]))
    put("safetensors", "scalar-and-zero", st_file([("s", "F32", []), ("z", "F16", [0, 4]), ("e", "BF16", [1, 1, 1])]))
    put("safetensors", "holes", st_file([], header=js({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]},
                                                       "b": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}}),
                                        pad=8))
    put("safetensors", "overlap", st_file([], header=js({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                                         "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}),
                                          pad=8))
    put("safetensors", "past-end", st_file([], header=js({"a": {"dtype": "F32", "shape": [4],
                                                                "data_offsets": [0, 16]}}), pad=8))
    put("safetensors", "subbyte", st_file([], header=js({"a": {"dtype": "F4", "shape": [2], "data_offsets": [0, 1]}}),
                                          pad=1))
    put("safetensors", "overflow-shape", st_file([], header=js({"a": {"dtype": "F32", "shape": [4294967296, 4294967296,
                                                                                                  16],
                                                                      "data_offsets": [0, 0]}})))
    put("safetensors", "duplicate-key", st_file([], header='{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                                                           '"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', pad=1))
    put("safetensors", "header-too-long", struct.pack("<Q", 1000) + b"{}")
    put("safetensors", "header-huge", struct.pack("<Q", 1 << 62) + b"{}")
    put("safetensors", "short", b"\x02\x00\x00")
    put("safetensors", "not-object", st_file([], header="[1,2]"))
    put("safetensors", "negative", st_file([], header=js({"a": {"dtype": "U8", "shape": [-1],
                                                                "data_offsets": [0, 1]}}), pad=1))
    put("safetensors", "unaligned", st_file([], header=js({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
                                                           "b": {"dtype": "F32", "shape": [1],
                                                                 "data_offsets": [1, 5]}}), pad=5))


# ---- config.json ----------------------------------------------------------------------------------------------

def config_seeds():
    clear("config")
    for fam in ("llama-tiny", "qwen2-tiny", "qwen3-tiny"):
        with open(f"{FIX}/hf/{fam}/config.json", "rb") as f:
            put("config", f"fixture-{fam}", f.read())
    base = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 8, "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256}
    cases = {
        "minimal": {},
        "llama3-rope": {"rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                                                                 "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                                 "original_max_position_embeddings": 8192}},
        "rope-parameters": {"rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}},
        "rope-type-old": {"rope_scaling": {"type": "linear", "factor": 2.0}},
        "mistral-window": {"architectures": ["MistralForCausalLM"], "sliding_window": 4096,
                           "max_position_embeddings": 4096},
        "qwen2-layer-types": {"architectures": ["Qwen2ForCausalLM"], "use_sliding_window": False,
                              "layer_types": ["full_attention", "full_attention"]},
        "qwen3-head-dim": {"architectures": ["Qwen3ForCausalLM"], "head_dim": 16, "attention_bias": False},
        "float-ints": {"hidden_size": 64.0, "num_hidden_layers": 2.0, "rms_norm_eps": 1e-300},
        "tokens-lists": {"bos_token_id": [1, 2], "eos_token_id": [], "tie_word_embeddings": True},
        "nulls": {"num_key_value_heads": None, "head_dim": None, "rope_scaling": None, "quantization_config": None},
        "quantized": {"quantization_config": {"quant_method": "gptq"}},
        "bad-types": {"hidden_act": 3, "attention_bias": "yes", "rope_theta": "1e4"},
        "huge": {"hidden_size": 1048576, "num_attention_heads": 65536, "head_dim": 65536,
                 "max_position_embeddings": 1073741824},
    }
    for name, over in cases.items():
        put("config", name, js({**base, **over}))
    put("config", "not-object", "[]")
    put("config", "truncated", js(base)[:40])
    put("config", "dup-key", '{"hidden_size":1,"hidden_size":2}')


# ---- index ----------------------------------------------------------------------------------------------------

def index_seeds():
    clear("index")
    wm = {"x": "a.safetensors", "y": "a.safetensors", "z": "b.safetensors", "w": "b.safetensors"}
    put("index", "valid", js({"metadata": {"total_size": 24}, "weight_map": wm}))
    put("index", "partial", js({"weight_map": {"z": "b.safetensors"}}))
    put("index", "third-shard", js({"weight_map": {"x": "a.safetensors", "q": "c.safetensors"}}).encode() + b"\0" +
        st_file([("q", "F32", [2]), ("r", "U8", [3])]))
    put("index", "third-shard-bad", js({"weight_map": {"q": "c.safetensors"}}).encode() + b"\0" +
        struct.pack("<Q", 4) + b"{}")
    put("index", "wrong-shard", js({"weight_map": {"x": "b.safetensors"}}))
    put("index", "traversal", js({"weight_map": {"x": "../a.safetensors", "y": "..", "z": ".", "w": ""}}))
    put("index", "missing-shard", js({"weight_map": {"x": "nope.safetensors"}}))
    put("index", "not-string", js({"weight_map": {"x": 1}}))
    put("index", "empty-map", js({"weight_map": {}}))
    put("index", "no-map", js({"metadata": {}}))
    put("index", "self", js({"weight_map": {"x": "model.safetensors.index.json"}}))


# ---- a whole HF checkpoint: config.json NUL model.safetensors ---------------------------------------------------

def hf_tensors(arch, L, dim, heads, kv, hd, ffn, vocab, tied):
    t = [("model.embed_tokens.weight", "F32", [vocab, dim])]
    for l in range(L):
        p = f"model.layers.{l}."
        t += [(p + "input_layernorm.weight", "F32", [dim]), (p + "self_attn.q_proj.weight", "BF16", [heads * hd, dim]),
              (p + "self_attn.k_proj.weight", "F16", [kv * hd, dim]), (p + "self_attn.v_proj.weight", "F32", [kv * hd, dim]),
              (p + "self_attn.o_proj.weight", "F32", [dim, heads * hd]),
              (p + "post_attention_layernorm.weight", "F32", [dim]), (p + "mlp.gate_proj.weight", "F32", [ffn, dim]),
              (p + "mlp.up_proj.weight", "F32", [ffn, dim]), (p + "mlp.down_proj.weight", "F32", [dim, ffn])]
        if arch == "Qwen2ForCausalLM":
            t += [(p + "self_attn.q_proj.bias", "F32", [heads * hd]), (p + "self_attn.k_proj.bias", "F32", [kv * hd]),
                  (p + "self_attn.v_proj.bias", "F32", [kv * hd])]
        if arch == "Qwen3ForCausalLM":
            t += [(p + "self_attn.q_norm.weight", "F32", [hd]), (p + "self_attn.k_norm.weight", "F32", [hd])]
    t.append(("model.norm.weight", "F32", [dim]))
    if not tied:
        t.append(("lm_head.weight", "F32", [vocab, dim]))
    return t


def ckpt_seeds():
    clear("ckpt")
    for arch, tied in (("LlamaForCausalLM", False), ("Qwen2ForCausalLM", True), ("Qwen3ForCausalLM", True),
                       ("MistralForCausalLM", False)):
        cfg = {"architectures": [arch], "hidden_size": 4, "num_hidden_layers": 2, "num_attention_heads": 2,
               "num_key_value_heads": 1, "head_dim": 2, "intermediate_size": 6, "vocab_size": 5,
               "tie_word_embeddings": tied, "max_position_embeddings": 16}
        t = hf_tensors(arch, 2, 4, 2, 1, 2, 6, 5, tied)
        put("ckpt", arch, js(cfg).encode() + b"\0" + st_file(t, meta={"format": "pt"}))
        if arch == "LlamaForCausalLM":
            put("ckpt", "extra-layer", js(cfg).encode() + b"\0" +
                st_file(t + [("model.layers.2.mlp.up_proj.weight", "F32", [6, 4])]))
            put("ckpt", "layer-01", js(cfg).encode() + b"\0" +
                st_file(t + [("model.layers.01.mlp.up_proj.weight", "F32", [1])]))
            put("ckpt", "inv-freq", js(cfg).encode() + b"\0" +
                st_file(t + [("model.layers.0.self_attn.rotary_emb.inv_freq", "F32", [1]),
                             ("model.rotary_emb.inv_freq", "F32", [1])]))
            put("ckpt", "bias-on-llama", js(cfg).encode() + b"\0" +
                st_file(t + [("model.layers.1.self_attn.q_proj.bias", "F32", [4])]))
            put("ckpt", "wrong-shape", js(cfg).encode() + b"\0" + st_file([(n, d, s[::-1]) for n, d, s in t]))
            put("ckpt", "wrong-dtype", js(cfg).encode() + b"\0" + st_file([(n, "I32", s) for n, d, s in t]))
            put("ckpt", "unaligned", js(cfg).encode() + b"\0" + st_file([("pad", "U8", [1])] + t))
            put("ckpt", "config-only", js(cfg))


# ---- llama2.c -------------------------------------------------------------------------------------------------

def l2c(dim, hidden, L, heads, kv, vocab, seq, extra=0, cut=0):
    hs = dim // heads
    n = abs(vocab) * dim + L * dim + L * dim * heads * hs + 2 * L * dim * kv * hs + L * heads * hs * dim + L * dim
    n += 3 * L * dim * hidden + dim + seq * hs + (abs(vocab) * dim if vocab < 0 else 0)
    body = struct.pack("<7i", dim, hidden, L, heads, kv, vocab, seq) + struct.pack("<f", 0.5) * n + bytes(extra)
    return body[:len(body) - cut] if cut else body


def llama2c_seeds():
    clear("llama2c")
    with open(f"{FIX}/llama2c/stories260K.bin", "rb") as f:
        hdr = f.read(28)
    put("llama2c", "stories260K-header-only", hdr)
    put("llama2c", "stories260K-head", hdr + bytes(1024))
    put("llama2c", "tiny-shared", l2c(4, 6, 1, 2, 1, 8, 2))
    put("llama2c", "tiny-unshared", l2c(4, 6, 2, 2, 2, -8, 3))
    put("llama2c", "tiny-trailing", l2c(4, 6, 1, 2, 1, 8, 2, extra=4))
    put("llama2c", "tiny-short", l2c(4, 6, 1, 2, 1, 8, 2, cut=4))
    put("llama2c", "ak42", b"ak42" + bytes(24))
    put("llama2c", "odd-head", l2c(6, 6, 1, 2, 1, 8, 2))
    put("llama2c", "huge", struct.pack("<7i", 65536, 1 << 20, 4096, 4096, 4096, -(1 << 24), 1 << 24))
    put("llama2c", "zero", bytes(28))


# ---- tokenizer.json [NUL tokenizer_config.json] ---------------------------------------------------------------

def shrink_tokenizer(tok, keep):
    """The fixture's pipeline with its vocabulary cut to ids < keep (and the merges among them)."""
    m = tok["model"]
    vocab = {k: v for k, v in m["vocab"].items() if v < keep}
    merges = []
    for mg in m.get("merges", []):
        a, b = mg.split(" ", 1) if isinstance(mg, str) else mg
        if a in vocab and b in vocab and (a + b) in vocab:
            merges.append(mg)
    m = {**m, "vocab": vocab, "merges": merges}
    added = [a for a in tok.get("added_tokens", [])][:8]
    return {**tok, "model": m, "added_tokens": added}


def tokenizer_seeds():
    clear("tokenizer")
    for fam, keep in (("llama2", 600), ("llama3", 400), ("qwen2", 400)):
        with open(f"{FIX}/tok/{fam}/tokenizer.json", encoding="utf-8") as f:
            tok = json.load(f)
        with open(f"{FIX}/tok/{fam}/tokenizer_config.json", encoding="utf-8") as f:
            cfg = json.load(f)
        cfg.pop("added_tokens_decoder", None)
        cfg.pop("chat_template", None)
        small = shrink_tokenizer(tok, keep)
        # added tokens keep their real (large) ids: the table then has holes, which decode must refuse
        put("tokenizer", f"fixture-{fam}", js(small))
        put("tokenizer", f"fixture-{fam}-config", js(small).encode() + b"\0" + js(cfg).encode())
    byte_level = {"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "\u0120": 3, "\u0120a": 4},
                            "merges": [["a", "b"], ["\u0120", "a"]], "ignore_merges": False},
                  "added_tokens": [{"id": 5, "content": "<|x|>", "special": True, "lstrip": True, "rstrip": True}],
                  "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFC"}]},
                  "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": True, "use_regex": True},
                  "decoder": {"type": "ByteLevel"}, "post_processor": None}
    put("tokenizer", "byte-level", js(byte_level))
    spm = {"model": {"type": "BPE", "vocab": {"<unk>": 0, "\u2581": 1, "a": 2, "\u2581a": 3, "<0x41>": 4},
                     "merges": ["\u2581 a"], "byte_fallback": True, "fuse_unk": True, "unk_token": "<unk>"},
           "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
                                                              {"type": "Replace", "pattern": {"String": " "},
                                                               "content": "\u2581"}]},
           "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first"},
           "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "\u2581"},
                                                         "content": " "}, {"type": "ByteFallback"},
                                                        {"type": "Fuse"}, {"type": "Strip", "content": " ",
                                                                           "start": 1, "stop": 0}]},
           "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<unk>",
                                                                                         "type_id": 0}},
                                                                       {"Sequence": {"id": "A", "type_id": 0}}],
                              "special_tokens": {"<unk>": {"id": "<unk>", "ids": [0], "tokens": ["<unk>"]}}}}
    put("tokenizer", "spm", js(spm))
    put("tokenizer", "spm-config", js(spm).encode() + b"\0" +
        js({"bos_token": {"content": "<unk>"}, "eos_token": "a", "add_bos_token": True, "add_eos_token": True}).encode())
    split = {"model": {"type": "BPE", "vocab": {"x": 0, "y": 1}, "merges": []},
             "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                 {"type": "Split", "pattern": {"Regex": "(?i:'s|'t)|\\p{L}+|\\s+(?!\\S)"}, "behavior": "Isolated",
                  "invert": False}, {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]},
             "decoder": {"type": "ByteLevel"}}
    put("tokenizer", "split-regex", js(split))
    put("tokenizer", "empty-vocab", js({"model": {"type": "BPE", "vocab": {}, "merges": []}}))
    put("tokenizer", "wordpiece", js({"model": {"type": "WordPiece", "vocab": {"a": 0}}}))
    put("tokenizer", "huge-id", js({"model": {"type": "BPE", "vocab": {"a": 2147483647}, "merges": []}}))
    put("tokenizer", "dup-ids", js({"model": {"type": "BPE", "vocab": {"a": 0, "b": 0}, "merges": ["a b"]},
                                    "added_tokens": [{"id": 0, "content": "a", "special": False}]}))
    put("tokenizer", "bad-config", js(byte_level).encode() + b"\0" + b'{"bos_token": 7}')


# ---- chat templates [NUL messages JSON] -------------------------------------------------------------------------

def template_seeds():
    clear("template")
    for fam in ("llama2", "llama3", "llama31", "mistral", "qwen2", "qwen25"):
        with open(f"{FIX}/chat/{fam}.jinja", "rb") as f:
            put("template", f"fixture-{fam}", f.read())
    with open(f"{FIX}/chat/cases.jsonl", encoding="utf-8") as f:
        case = json.loads(f.readline())
    with open(f"{FIX}/chat/{case['family']}.jinja", "rb") as f:
        put("template", "fixture-with-messages", f.read() + b"\0" + js(case["messages"]).encode())
    cases = {
        "loop-controls": "{% for m in messages if m.role != 'system' %}{% if loop.first %}[{% endif %}"
                         "{{ loop.index0 }}:{{ m['content'] | trim }}{% if loop.last %}]{% else %},{% endif %}"
                         "{% if loop.index > 3 %}{% break %}{% endif %}{% else %}none{% endfor %}",
        "namespace": "{% set ns = namespace(n=0, s='') %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
                     "{% set ns.s = ns.s ~ m.role[:2] %}{% endfor %}{{ ns.n }}{{ ns.s | upper }}",
        "filters": "{{ messages | map(attribute='role') | select('equalto', 'user') | list | length }}"
                   "{{ messages[0] | tojson(indent=2) }}{{ 'a,b' .split(',') | join('-') }}{{ (3.5 | int) // 2 }}"
                   "{{ messages | selectattr('content', 'defined') | first | default('x') }}{{ -7 % 3 }}",
        "set-block": "{% set x %}{{ bos_token }}{% for i in range(3) %}{{ i }}{% endfor %}{% endset %}{{ x | length }}"
                     "{{ x[::-1] }}{{ x.startswith('<') }}",
        "raise": "{% if messages | length > 100 %}{{ raise_exception('too many') }}{% endif %}{{ eos_token }}",
        "whitespace": "  {%- for m in messages -%}\n  {{- m.content -}}\n{%- endfor %}\n{# comment #}  \n",
        "dict-methods": "{% for k, v in messages[0].items() %}{{ k }}={{ v }};{% endfor %}{{ {'a': 1}.get('b', 2) }}"
                        "{{ messages[0].keys() | list }}{{ strftime_now('%Y') | length }}",
        "generation": "{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}",
        "tests": "{{ 1 is odd }}{{ none is none }}{{ [] is iterable }}{{ 'a' is string }}{{ 4 is divisibleby(2) }}"
                 "{{ x is undefined }}{{ 1 if true else 2 }}{{ not 'a' in 'abc' }}{{ 'ab' * 3 }}",
        "unsupported": "{% macro m() %}{% endmacro %}",
        "unterminated": "{{ messages[0",
        "percent": "{{ '%s' % 1 }}",
    }
    for name, src in cases.items():
        put("template", name, src)
    put("template", "messages-odd", b"{{ messages }}\0" + js([{"role": None, "content": [1, {"a": None}]}, 3]).encode())
    put("template", "messages-not-list", b"{{ messages }}\0{\"a\":1}")


# ---- serve request bodies: a route byte (even: completions, odd: chat) then the body ----------------------------

def serve_seeds():
    clear("serve")
    comp = [("prompt", {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0.7, "top_p": 0.9,
                        "top_k": 40, "seed": 42, "stop": ["\n", "The end"], "stream": True, "model": "m"}),
            ("prompt-ids", {"prompt": [1, 2, 3, 2147483647], "ignore_eos": True, "stop": "x"}),
            ("prompt-list-one", {"prompt": ["hi"], "n": 1}),
            ("prompt-bad", {"prompt": [], "max_tokens": 0, "top_p": 0, "seed": 1e30}),
            ("prompt-empty", {"prompt": ""}),
            ("stop-many", {"prompt": "a", "stop": [str(i) for i in range(17)]}),
            ("stop-bad", {"prompt": "a", "stop": ["", None, "x" * 300]}),
            ("types", {"prompt": "a", "temperature": "hot", "stream": 1, "model": 3, "top_k": 2.5})]
    for name, body in comp:
        put("serve", "completions-" + name, b"\0" + js(body).encode())
    chat = [("basic", {"messages": [{"role": "system", "content": "Be brief."},
                                    {"role": "user", "content": "Hi \u00e9"}], "max_completion_tokens": 16}),
            ("extra-keys", {"messages": [{"role": "user", "content": "x", "name": "bob", "tool_calls": None}],
                            "stream": False, "stop": None, "temperature": None}),
            ("bad-message", {"messages": [{"role": "user"}, "x"]}),
            ("empty", {"messages": []})]
    for name, body in chat:
        put("serve", "chat-" + name, b"\1" + js(body).encode())
    put("serve", "not-json", b"\1{\"messages\": [")
    put("serve", "not-object", b"\0[1,2]")
    put("serve", "empty-body", b"\1")
    put("serve", "nul-in-string", b"\0{\"prompt\": \"a\\u0000b\"}")


if __name__ == "__main__":
    if not os.path.isdir(FIX):
        sys.exit(f"make_corpus.py: fixtures not found at {FIX}")
    for seeds in (safetensors_seeds, config_seeds, index_seeds, ckpt_seeds, llama2c_seeds, tokenizer_seeds,
                  template_seeds, serve_seeds):
        seeds()
    total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(OUT) for f in fs)
    print(f"make_corpus.py: {OUT}: {total} bytes")
