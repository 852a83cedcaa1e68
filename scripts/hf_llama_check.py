#!/usr/bin/python3
"""Checks triax's Llama block, its HF directory reader and writer, against an fp64 reference.

Builds a small Llama (2 layers, C 64, 8 query heads over 4 key/value heads, SwiGLU F 96, vocab
300, RMSNorm, RoPE theta 10000 with Llama 3.1 frequency scaling, untied head) with every
parameter random, writes it as an HF model directory -- config.json + one float32
model.safetensors, and a bfloat16 variant sharded over two files with model.safetensors.index.json
-- and a random llm.c token shard, then:

  1. gpt_eval --weights DIR at each np (tp = np; and tp2 x pp2 at np 4): the mean loss over K
     batches against a plain-torch float64 Llama written here (1e-5 relative), and via
     --grads-out every parameter's gradient of
     batch 0's mean loss against torch autograd in float64 (max |diff| / max |ref| <= 1e-4);
     the bf16 sharded directory against the reference on the bf16-rounded weights;
  2. train_gpt --init-from DIR for a few iterations at tp2 x pp2 x dp2 (np 8) and at np 1: equal
     training losses (1e-5 relative) and validation losses; --export-hf OUT, then gpt_eval --weights
     OUT gives the trained model's validation loss (1e-5), and the plain-torch reference on OUT too;
  3. the same model with its head tied to the embedding (tie_word_embeddings, no lm_head.weight):
     gpt_eval's loss and gradients at np 2, and the training comparison of 2.;
  4. with transformers importable: LlamaForCausalLM.from_pretrained on a directory without rope
     scaling (transformers 4.36 predates llama3 scaling) agrees with the reference and gpt_eval
     (float32: the float64 attention mask overflows on torch 1.13), and from_pretrained of the
     directory gpt_eval --save writes gives HF's loss again.

Exit 0 when everything agrees, 1 otherwise, 77 (skipped) without torch.

  /usr/bin/python3 scripts/hf_llama_check.py BUILD/examples/gpt_eval/gpt_eval BUILD/examples/train_gpt/train_gpt \\
      [--mpirun mpirun] [--np 1,2,4] [--train-np 8] [--workdir DIR]
"""
import json
import math
import os
import struct
import sys

import hf_common as common  # exits 77 (skipped) without torch and numpy
import numpy as np
import torch
import torch.nn.functional as F

try:
    import transformers
    from transformers import LlamaForCausalLM
    HAVE_HF = True
except Exception as e:  # ImportError, or a transformers too new for this torch
    HAVE_HF = False
    HF_WHY = str(e)

L, C, NH, NKV, FF, V, NPOS = 2, 64, 8, 4, 96, 300, 128
D = C // NH
EPS, THETA = 1e-5, 10000.0
SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 64}
B, T, K = 2, 32, 3
LOSS_TOL, GRAD_TOL = 1e-5, 1e-4
ITERS = 3


def random_state(seed):
    """HF-named Llama tensors, every one random (a wrong mapping of any of them moves the loss)."""
    g = torch.Generator().manual_seed(seed)

    def n(*shape, std=0.1):
        # float32 values (what the f32 file holds), the reference computes with in float64
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * std).to(torch.float32).to(torch.float64)
    sd = {"model.embed_tokens.weight": n(V, C, std=0.5)}
    for i in range(L):
        p = f"model.layers.{i}."
        sd[p + "input_layernorm.weight"] = 1 + n(C, std=0.2)
        sd[p + "self_attn.q_proj.weight"] = n(NH * D, C, std=0.15)
        sd[p + "self_attn.k_proj.weight"] = n(NKV * D, C, std=0.15)
        sd[p + "self_attn.v_proj.weight"] = n(NKV * D, C)
        sd[p + "self_attn.o_proj.weight"] = n(C, C)
        sd[p + "post_attention_layernorm.weight"] = 1 + n(C, std=0.2)
        sd[p + "mlp.gate_proj.weight"] = n(FF, C, std=0.15)
        sd[p + "mlp.up_proj.weight"] = n(FF, C, std=0.15)
        sd[p + "mlp.down_proj.weight"] = n(C, FF)
    sd["model.norm.weight"] = 1 + n(C, std=0.2)
    sd["lm_head.weight"] = n(V, C, std=0.2)
    return sd


def inv_freq(scaling):
    """theta^(-2i/D) with HF's llama3 frequency scaling, in float64."""
    f = 1.0 / (THETA ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    if not scaling:
        return f
    s = scaling
    low_wl = s["original_max_position_embeddings"] / s["low_freq_factor"]
    high_wl = s["original_max_position_embeddings"] / s["high_freq_factor"]
    out = []
    for v in f.tolist():
        wl = 2 * math.pi / v
        if wl > low_wl:
            v = v / s["factor"]
        elif wl >= high_wl:
            sm = (s["original_max_position_embeddings"] / wl - s["low_freq_factor"]) / (
                s["high_freq_factor"] - s["low_freq_factor"])
            v = (1 - sm) * v / s["factor"] + sm * v
        out.append(v)
    return torch.tensor(out, dtype=torch.float64)


def llama_logits(sd, x, scaling):
    """The Llama forward from the HF state dict, written out in the state dict's dtype. x: (b, t)."""
    dt = sd["model.norm.weight"].dtype

    def rms(h, w):
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS) * w

    def rope(z, cos, sin):  # z (b, heads, t, D), rotate-half layout
        z1, z2 = z[..., :D // 2], z[..., D // 2:]
        return z * cos + torch.cat((-z2, z1), dim=-1) * sin
    b, t = x.shape
    freqs = torch.outer(torch.arange(t, dtype=torch.float64), inv_freq(scaling))
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(dt), emb.sin().to(dt)
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    h = sd["model.embed_tokens.weight"][x]
    for i in range(L):
        p = f"model.layers.{i}."
        a = rms(h, sd[p + "input_layernorm.weight"])
        q = (a @ sd[p + "self_attn.q_proj.weight"].T).view(b, t, NH, D).transpose(1, 2)
        k = (a @ sd[p + "self_attn.k_proj.weight"].T).view(b, t, NKV, D).transpose(1, 2)
        v = (a @ sd[p + "self_attn.v_proj.weight"].T).view(b, t, NKV, D).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        k = k.repeat_interleave(NH // NKV, dim=1)  # query head j reads kv head j // (NH/NKV)
        v = v.repeat_interleave(NH // NKV, dim=1)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(D)
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, C)
        h = h + y @ sd[p + "self_attn.o_proj.weight"].T
        m = rms(h, sd[p + "post_attention_layernorm.weight"])
        gate, up = m @ sd[p + "mlp.gate_proj.weight"].T, m @ sd[p + "mlp.up_proj.weight"].T
        h = h + (F.silu(gate) * up) @ sd[p + "mlp.down_proj.weight"].T
    head = sd.get("lm_head.weight", sd["model.embed_tokens.weight"])  # no lm_head: tied
    return rms(h, sd["model.norm.weight"]) @ head.T


def batch(tokens, k):
    return common.batch(tokens, k, B, T)


def mean_loss(logits_fn, tokens):
    return common.mean_loss(logits_fn, tokens, B, T, K, V)


def reference_grads(sd, tokens, scaling):
    """d (batch 0's mean loss) / d every parameter, float64 autograd."""
    p = {k: v.clone().double().requires_grad_(True) for k, v in sd.items()}
    x, y = batch(tokens, 0)
    F.cross_entropy(llama_logits(p, x, scaling).reshape(-1, V), y.reshape(-1)).backward()
    return {k: v.grad for k, v in p.items()}


def bf16_round(t):
    """float64 -> bfloat16 (round to nearest even) -> float64."""
    return t.to(torch.float32).to(torch.bfloat16).to(torch.float64)


# ---------------------------------------------------------------- files (numpy only)

def read_safetensors(path):
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack("<Q", buf[:8])
    header = json.loads(buf[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        raw = buf[8 + n + b:8 + n + end]
        if e["dtype"] == "BF16":
            a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        elif e["dtype"] == "F32":
            a = np.frombuffer(raw, dtype="<f4")
        else:
            raise ValueError(f"{path}: {name}: dtype {e['dtype']}")
        out[name] = torch.from_numpy(a.astype(np.float64).reshape(e["shape"]))
    return out


def read_hf_dir(d):
    if os.path.exists(os.path.join(d, "model.safetensors")):
        return read_safetensors(os.path.join(d, "model.safetensors"))
    with open(os.path.join(d, "model.safetensors.index.json")) as f:
        files = set(json.load(f)["weight_map"].values())
    out = {}
    for fn in files:
        out.update(read_safetensors(os.path.join(d, fn)))
    return out


def config_json(scaling, dtype, tied):
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": C,
            "intermediate_size": FF, "num_hidden_layers": L, "num_attention_heads": NH,
            "num_key_value_heads": NKV, "vocab_size": V, "max_position_embeddings": NPOS, "rms_norm_eps": EPS,
            "rope_theta": THETA, "rope_scaling": scaling, "tie_word_embeddings": tied, "attention_bias": False,
            "mlp_bias": False, "hidden_act": "silu", "torch_dtype": dtype, "bos_token_id": 1, "eos_token_id": 2}


def write_hf_dir(d, sd, scaling, sharded_bf16=False):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config_json(scaling, "bfloat16" if sharded_bf16 else "float32", "lm_head.weight" not in sd), f,
                  indent=2)
    if not sharded_bf16:
        common.write_safetensors(os.path.join(d, "model.safetensors"), sd, "F32")
        return
    names = list(sd)
    parts = [names[:len(names) // 2], names[len(names) // 2:]]
    wmap = {}
    for i, part in enumerate(parts):
        fn = f"model-{i + 1:05d}-of-00002.safetensors"
        common.write_safetensors(os.path.join(d, fn), {k: sd[k] for k in part}, "BF16")
        wmap.update({k: fn for k in part})
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 2 * sum(v.numel() for v in sd.values())}, "weight_map": wmap}, f)


# ---------------------------------------------------------------- runs

def gpt_eval(args, np_, weights, data, extra=(), tp=None):
    return common.gpt_eval_loss(args, np_, weights, data, B, T, K, extra, tp)


def train(args, np_, layout, init, data, wd, tag):
    """train_gpt --init-from for ITERS iterations; returns (training losses, final validation loss)."""
    jsonl = os.path.join(wd, f"metrics_{tag}.jsonl")
    out = os.path.join(wd, f"export_{tag}")
    cmd = [args.mpirun, "-np", str(np_), "--oversubscribe", args.train_gpt, "--init-from", init, "--data", data,
           "--valid-data", data, "--seq-length", str(T), "--micro-batch-size", "1", "--global-batch-size", str(B),
           "--train-iters", str(ITERS), "--eval-interval", str(ITERS), "--eval-iters", str(K), "--lr", "1e-3",
           "--lr-warmup-iters", "0", "--metrics-jsonl", jsonl, "--export-hf", out] + layout
    common.run(cmd, f"train_gpt {tag}")
    losses, valid = [], None
    with open(jsonl) as f:
        for line in f:
            j = json.loads(line)
            if "valid_loss" in j:
                valid = j["valid_loss"]
            elif "loss" in j:
                losses.append(j["loss"])
    if len(losses) != ITERS or valid is None:
        print(f"FAILED: {jsonl} holds {len(losses)} training losses (expected {ITERS}) and valid {valid}")
        sys.exit(1)
    return losses, valid, out


class Report:
    def __init__(self):
        self.failed = []

    def check(self, label, got, ref, tol):
        rel = abs(got - ref) / max(abs(ref), 1e-30)
        ok = rel <= tol
        print(f"  {label:<62} {got:>14.9g} {ref:>14.9g} {rel:>10.3g} {'ok' if ok else 'FAILED'}")
        if not ok:
            self.failed.append(label)


def compare_grads(rep, label, path, ref):
    got = read_safetensors(path)
    worst, where = 0.0, ""
    for name, r in ref.items():
        if name not in got or tuple(got[name].shape) != tuple(r.shape):
            print(f"  {label}: gradient '{name}' missing or of shape "
                  f"{tuple(got[name].shape) if name in got else None}, expected {tuple(r.shape)}")
            rep.failed.append(label)
            return
        rel = (got[name] - r).abs().max().item() / max(r.abs().max().item(), 1e-30)
        if rel > worst:
            worst, where = rel, name
    extra = sorted(set(got) - set(ref))
    if extra:
        print(f"  {label}: unexpected gradients {extra}")
        rep.failed.append(label)
    ok = worst <= GRAD_TOL
    print(f"  {label:<62} worst {worst:.3g} ({where}) {'ok' if ok else 'FAILED'}")
    if not ok:
        rep.failed.append(label)


def check_evals(args, rep, sd, tokens, data, wd):
    nps = [int(s) for s in args.np.split(",")]
    f32 = os.path.join(wd, "llama_f32")
    bf = os.path.join(wd, "llama_bf16_sharded")
    write_hf_dir(f32, sd, SCALING)
    write_hf_dir(bf, sd, SCALING, sharded_bf16=True)
    with torch.no_grad():
        ref = mean_loss(lambda x: llama_logits(sd, x, SCALING), tokens)
        sd_bf = {k: bf16_round(v) for k, v in sd.items()}
        ref_bf = mean_loss(lambda x: llama_logits(sd_bf, x, SCALING), tokens)
    grads = reference_grads(sd, tokens, SCALING)
    print(f"reference (plain torch float64): loss {ref:.12g}; on the bf16-rounded weights {ref_bf:.12g}")
    print(f"  {'run':<62} {'triax':>14} {'reference':>14} {'rel diff':>10}")
    for np_ in nps:
        gpath = os.path.join(wd, f"grads_np{np_}.safetensors")
        loss = gpt_eval(args, np_, f32, data, ["--grads-out", gpath])
        rep.check(f"gpt_eval f32 dir, np {np_} (tp {np_}) loss", loss, ref, LOSS_TOL)
        compare_grads(rep, f"gpt_eval --grads-out np {np_} vs autograd fp64", gpath, grads)
        loss = gpt_eval(args, np_, bf, data)
        rep.check(f"gpt_eval bf16 sharded dir, np {np_} loss", loss, ref_bf, LOSS_TOL)
    if 4 in nps:  # the gradients across pipeline stages too
        gpath = os.path.join(wd, "grads_tp2_pp2.safetensors")
        loss = gpt_eval(args, 4, f32, data, ["--pp", "2", "--grads-out", gpath], tp=2)
        rep.check("gpt_eval f32 dir, np 4 (tp 2 x pp 2) loss", loss, ref, LOSS_TOL)
        compare_grads(rep, "gpt_eval --grads-out tp 2 x pp 2 vs autograd fp64", gpath, grads)
    return f32


def check_tied(args, rep, sd, tokens, data, wd):
    """The same model with the head tied to the embedding (tie_word_embeddings, no lm_head.weight)."""
    sd = {k: v for k, v in sd.items() if k != "lm_head.weight"}
    d = os.path.join(wd, "llama_tied")
    write_hf_dir(d, sd, SCALING)
    with torch.no_grad():
        ref = mean_loss(lambda x: llama_logits(sd, x, SCALING), tokens)
    grads = reference_grads(sd, tokens, SCALING)  # the embedding's: both uses summed
    gpath = os.path.join(wd, "grads_tied.safetensors")
    rep.check("tied head: gpt_eval np 2 (tp 2) loss", gpt_eval(args, 2, d, data, ["--grads-out", gpath]), ref,
              LOSS_TOL)
    compare_grads(rep, "tied head: gpt_eval --grads-out np 2 vs autograd fp64", gpath, grads)
    return d


def check_training(args, rep, tokens, data, wd, init, what=""):
    pre = what.strip() + "_" if what else ""
    l1, v1, out1 = train(args, 1, [], init, data, wd, f"{pre}np1")
    n = args.train_np
    l8, v8, out8 = train(args, n, ["--tp", "2", "--pp", "2"], init, data, wd, f"{pre}np{n}") if n > 1 else (l1, v1, out1)
    for i, (a, b) in enumerate(zip(l8, l1)):
        rep.check(f"{what}train_gpt tp2 x pp2 x dp{n // 4} vs np 1: iteration {i + 1} loss", a, b, LOSS_TOL)
    rep.check(f"{what}train_gpt tp2 x pp2 x dp{n // 4} vs np 1: validation loss", v8, v1, LOSS_TOL)
    for tag, out, valid in ((f"{what}np 1", out1, v1), (f"{what}np {n}", out8, v8)):
        rep.check(f"gpt_eval --weights export ({tag}) vs its validation loss", gpt_eval(args, 2, out, data), valid,
                  LOSS_TOL)
        with torch.no_grad():
            back = read_hf_dir(out)
            with open(os.path.join(out, "config.json")) as f:
                sc = json.load(f)["rope_scaling"]
            rep.check(f"plain torch on the export ({tag}) vs its validation loss",
                      mean_loss(lambda x: llama_logits(back, x, sc), tokens), valid, LOSS_TOL)


def check_transformers(args, rep, sd, tokens, data, wd):
    if not HAVE_HF:
        print(f"transformers not importable ({HF_WHY}): LlamaForCausalLM comparison skipped")
        return
    d = os.path.join(wd, "llama_noscale")
    write_hf_dir(d, sd, None)
    with torch.no_grad():
        ref = mean_loss(lambda x: llama_logits(sd, x, None), tokens)
        model = LlamaForCausalLM.from_pretrained(d, torch_dtype=torch.float32).eval()
        hf = mean_loss(lambda x: model(input_ids=x).logits, tokens)
    print(f"transformers {transformers.__version__} LlamaForCausalLM (float32), directory without rope scaling:")
    rep.check("HF LlamaForCausalLM fp32 vs plain torch fp64", hf, ref, LOSS_TOL)
    out = os.path.join(wd, "llama_noscale_saved")
    rep.check("gpt_eval np 2 (--save OUT) vs HF LlamaForCausalLM", gpt_eval(args, 2, d, data, ["--save", out]), hf,
              LOSS_TOL)
    with torch.no_grad():  # triax's directory through HF's loader
        back = LlamaForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
        rep.check("HF from_pretrained(triax --save OUT) vs HF on the original", mean_loss(
            lambda x: back(input_ids=x).logits, tokens), hf, LOSS_TOL)


def main():
    ap = common.arg_parser(__doc__, ["gpt_eval", "train_gpt"], "1,2,4")
    ap.add_argument("--train-np", type=int, default=8, help="world of the tp2 x pp2 x dp run (8; 1 skips it)")
    ap.add_argument("--skip-train", action="store_true")
    args = ap.parse_args()
    sd = random_state(args.seed)
    tokens = common.random_tokens(args.seed + 1, V, B, T, K)
    tmp, wd = common.workdir(args)  # noqa: F841 (tmp: the temporary directory lives until main returns)
    data = os.path.join(wd, "tokens.bin")
    common.write_tokens(data, tokens)
    print(f"model: layers {L} hidden {C} heads {NH} kv heads {NKV} ffn {FF} vocab {V}, RMSNorm eps {EPS}, RoPE theta "
          f"{THETA:g} with {SCALING}, untied head; data: {K} batches of {B} x {T}")
    rep = Report()
    f32 = check_evals(args, rep, sd, tokens, data, wd)
    if not args.skip_train:
        check_training(args, rep, tokens, data, wd, f32)
    tied = check_tied(args, rep, sd, tokens, data, wd)
    if not args.skip_train:
        check_training(args, rep, tokens, data, wd, tied, "tied ")
    check_transformers(args, rep, sd, tokens, data, wd)
    if rep.failed:
        print(f"FAILED: {len(rep.failed)} checks: {rep.failed}")
        return 1
    print("all checks agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
