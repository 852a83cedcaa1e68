#!/usr/bin/python3
"""Checks gpt_eval against HuggingFace's GPT2LMHeadModel on the same weights and tokens.

Builds a small random GPT-2 (2 layers, C 64, 4 heads, vocab 1000, 64 positions) in
transformers' GPT2LMHeadModel with every parameter randomised (not just the default 0.02 init, so
a wrong mapping of any tensor moves the loss), saves it two ways -- save_pretrained()'s
model.safetensors ("transformer." names, no lm_head, no n_head metadata: gpt_eval gets --heads)
and safetensors.torch.save_file() with bare names, an explicit tied lm_head.weight and n_head
metadata -- writes a random llm.c token shard, runs gpt_eval under mpirun at each np (tp = np),
and compares every loss with HF's mean cross-entropy over the same K batches (batch k: inputs
tokens[k*B*T : k*B*T + B*T], targets shifted by one, as llm.c does). Exit 1 above 1e-5 relative.

Without transformers (it is not a Debian package) the reference is a plain-torch GPT-2 written
here (same math: tanh GELU, LayerNorm eps 1e-5, causal softmax attention, tied head); with
transformers both run and must agree. Exit 77 (skipped) without torch.

  /usr/bin/python3 scripts/hf_check.py BUILD/examples/gpt_eval/gpt_eval [--mpirun mpirun] [--np 1,2]
"""
import math
import os
import sys

import hf_common as common  # exits 77 (skipped) without torch and numpy
import torch
import torch.nn.functional as F

try:
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel
    HAVE_HF = True
except Exception as e:  # ImportError, or a transformers too new for this torch
    HAVE_HF = False
    HF_WHY = str(e)

L, C, NH, V, NPOS = 2, 64, 4, 1000, 64
B, T, K = 4, 32, 3
TOL = 1e-5


def random_state(seed):
    """HF-named GPT-2 tensors (Conv1D layout (in, out)), every one random."""
    g = torch.Generator().manual_seed(seed)
    def n(*shape, std=0.1):
        return torch.randn(*shape, generator=g) * std
    sd = {"transformer.wte.weight": n(V, C), "transformer.wpe.weight": n(NPOS, C)}
    for i in range(L):
        p = f"transformer.h.{i}."
        sd[p + "ln_1.weight"] = 1 + n(C, std=0.2)
        sd[p + "ln_1.bias"] = n(C, std=0.05)
        sd[p + "attn.c_attn.weight"] = n(C, 3 * C)
        sd[p + "attn.c_attn.bias"] = n(3 * C, std=0.05)
        sd[p + "attn.c_proj.weight"] = n(C, C)
        sd[p + "attn.c_proj.bias"] = n(C, std=0.05)
        sd[p + "ln_2.weight"] = 1 + n(C, std=0.2)
        sd[p + "ln_2.bias"] = n(C, std=0.05)
        sd[p + "mlp.c_fc.weight"] = n(C, 4 * C)
        sd[p + "mlp.c_fc.bias"] = n(4 * C, std=0.05)
        sd[p + "mlp.c_proj.weight"] = n(4 * C, C)
        sd[p + "mlp.c_proj.bias"] = n(C, std=0.05)
    sd["transformer.ln_f.weight"] = 1 + n(C, std=0.2)
    sd["transformer.ln_f.bias"] = n(C, std=0.05)
    return sd


def plain_torch_logits(sd, x):
    """GPT-2 forward from the HF state dict, written out (no transformers). x: (B, T) int64."""
    def ln(h, p):
        return F.layer_norm(h, (C,), sd[p + ".weight"], sd[p + ".bias"], eps=1e-5)
    def conv1d(h, p):  # HF Conv1D: h @ W (in, out) + b
        return h @ sd[p + ".weight"] + sd[p + ".bias"]
    def gelu(h):
        return 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h ** 3)))
    b, t = x.shape
    h = sd["transformer.wte.weight"][x] + sd["transformer.wpe.weight"][:t]
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    for i in range(L):
        p = f"transformer.h.{i}."
        q, k, v = conv1d(ln(h, p + "ln_1"), p + "attn.c_attn").split(C, dim=2)
        q, k, v = (z.view(b, t, NH, C // NH).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-1, -2)) / math.sqrt(C // NH)
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, C)
        h = h + conv1d(y, p + "attn.c_proj")
        h = h + conv1d(gelu(conv1d(ln(h, p + "ln_2"), p + "mlp.c_fc")), p + "mlp.c_proj")
    return ln(h, "transformer.ln_f") @ sd["transformer.wte.weight"].T


def mean_loss(logits_fn, tokens):
    return common.mean_loss(logits_fn, tokens, B, T, K, V)


write_tokens = common.write_tokens


def save_bare(path, sd):
    """Bare names (no "transformer."), an explicit tied lm_head, n_head metadata."""
    out = {k[len("transformer."):]: v.contiguous() for k, v in sd.items()}
    out["lm_head.weight"] = sd["transformer.wte.weight"].clone()
    meta = {"format": "pt", "n_head": str(NH)}
    try:
        from safetensors.torch import save_file
        save_file(out, path, metadata=meta)
        return "safetensors.torch.save_file"
    except ImportError:
        common.write_safetensors(path, out, "F32", meta)
        return "hand-written safetensors"


def run_eval(args, np_, weights, data, extra):
    return common.gpt_eval_loss(args, np_, weights, data, B, T, K, extra)


def main():
    args = common.arg_parser(__doc__, ["gpt_eval"], "1,2").parse_args()
    torch.manual_seed(args.seed)
    sd = random_state(args.seed)
    tokens = common.random_tokens(args.seed + 1, V, B, T, K)

    tmp, wd = common.workdir(args)  # noqa: F841 (tmp: the temporary directory lives until main returns)
    data = os.path.join(wd, "tokens.bin")
    write_tokens(data, tokens)
    bare = os.path.join(wd, "bare.safetensors")
    how = save_bare(bare, sd)

    with torch.no_grad():
        ref_plain = mean_loss(lambda x: plain_torch_logits(sd, x), tokens)
        sd64 = {k: v.double() for k, v in sd.items()}
        ref_plain64 = mean_loss(lambda x: plain_torch_logits(sd64, x), tokens)
        files = [("bare.safetensors (" + how + ")", bare, [])]
        if HAVE_HF:
            cfg = GPT2Config(n_layer=L, n_embd=C, n_head=NH, vocab_size=V, n_positions=NPOS, resid_pdrop=0.0,
                             embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5,
                             activation_function="gelu_new")
            model = GPT2LMHeadModel(cfg).eval()
            missing, unexpected = model.load_state_dict(sd, strict=False)
            missing = [m for m in missing if not m.endswith(("attn.bias", "attn.masked_bias")) and m != "lm_head.weight"]
            assert not missing and not unexpected, (missing, unexpected)
            assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr(), "head not tied"
            hf_dir = os.path.join(wd, "hf")
            model.save_pretrained(hf_dir, safe_serialization=True)
            files.insert(0, ("save_pretrained model.safetensors", os.path.join(hf_dir, "model.safetensors"),
                             ["--heads", str(NH)]))
            ref = mean_loss(lambda x: model(input_ids=x).logits, tokens)
            ref_name = f"HF GPT2LMHeadModel (transformers {transformers.__version__}, torch {torch.__version__}, fp32)"
            agree = abs(ref_plain - ref) / abs(ref)
            print(f"plain-torch reference {ref_plain:.9g} vs HF {ref:.9g}: relative {agree:.3g}")
            if agree > TOL:
                print("FAILED: the plain-torch reference disagrees with HF")
                return 1
        else:
            ref = ref_plain
            ref_name = f"plain-torch GPT-2 (torch {torch.__version__}, fp32; transformers unavailable: {HF_WHY})"
        print(f"reference: {ref_name}")
        print(f"model: layers {L} hidden {C} heads {NH} vocab {V} positions {NPOS}; data: {K} batches of {B} x {T}")
        print(f"reference loss fp32 {ref:.9g}   (plain torch fp64: {ref_plain64:.9g})")

    worst = 0.0
    print(f"{'file':<48} {'np':>3} {'triax loss':>14} {'reference':>14} {'rel diff':>10}")
    for label, path, extra in files:
        for np_ in [int(s) for s in args.np.split(",")]:
            loss = run_eval(args, np_, path, data, extra)
            rel = abs(loss - ref) / abs(ref)
            worst = max(worst, rel)
            print(f"{label:<48} {np_:>3} {loss:>14.9g} {ref:>14.9g} {rel:>10.3g}")
    # The other direction: gpt_eval --save writes the model it loaded (tp = 2) as HF safetensors and
    # as an llm.c checkpoint; HF's from_pretrained reads triax's file, gpt_eval reads the .bin.
    np2 = 2 if 2 in [int(s) for s in args.np.split(",")] else 1
    conv = os.path.join(wd, "triax_out")
    os.makedirs(conv, exist_ok=True)
    for out in ("model.safetensors", "model.bin"):
        run_eval(args, np2, bare, data, ["--save", os.path.join(conv, out)])
    loss = run_eval(args, 1, os.path.join(conv, "model.bin"), data, [])
    rel = abs(loss - ref) / abs(ref)
    worst = max(worst, rel)
    print(f"{'triax --save (np ' + str(np2) + ') -> llm.c .bin':<48} {1:>3} {loss:>14.9g} {ref:>14.9g} {rel:>10.3g}")
    if HAVE_HF:
        cfg.save_pretrained(conv)  # config.json beside triax's model.safetensors
        with torch.no_grad():
            back = GPT2LMHeadModel.from_pretrained(conv).eval()
            hf_loss = mean_loss(lambda x: back(input_ids=x).logits, tokens)
        rel = abs(hf_loss - ref) / abs(ref)
        worst = max(worst, rel)
        print(f"{'triax --save -> HF from_pretrained (HF loss)':<48} {'-':>3} {hf_loss:>14.9g} {ref:>14.9g} {rel:>10.3g}")
    print(f"worst relative difference {worst:.3g} (tolerance {TOL:g}): {'ok' if worst <= TOL else 'FAILED'}")
    return 0 if worst <= TOL else 1


if __name__ == "__main__":
    sys.exit(main())
