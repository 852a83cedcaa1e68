#!/usr/bin/python3
"""Checks a file written by `train_gpt --export-hf` against HuggingFace on the same tokens.

Reads the safetensors file (by hand: 8-byte header length, JSON header, f32 data), takes the
model shape from its metadata, writes a random llm.c token shard, runs gpt_eval on the file and
compares its loss with HF GPT2LMHeadModel.from_pretrained's (with transformers) or with
scripts/hf_check.py's plain-torch GPT-2 (without it): exit 1 above 1e-5 relative, 77 without torch.

  /usr/bin/python3 scripts/hf_export_check.py GPT_EVAL FILE.safetensors [--mpirun mpirun] [--np 2]
"""
import argparse
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_check as ref  # exits 77 without torch; its GPT-2 reference and gpt_eval runner are reused
from safetensors_f32 import read_f32

import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gpt_eval")
    ap.add_argument("weights")
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--np", type=int, default=2)
    args = ap.parse_args()
    arrays, meta = read_f32(args.weights)
    sd = {k: torch.from_numpy(v) for k, v in arrays.items()}
    # hf_check's reference reads the shape from its module constants.
    ref.L, ref.C, ref.NH = int(meta["n_layer"]), int(meta["n_embd"]), int(meta["n_head"])
    ref.V, ref.NPOS = int(meta["vocab_size"]), int(meta["n_positions"])
    ref.B, ref.T, ref.K = 2, min(16, ref.NPOS), 3
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, ref.V, (ref.K * ref.B * ref.T + 1 + 13,), generator=g)
    with tempfile.TemporaryDirectory() as wd:
        data = os.path.join(wd, "tokens.bin")
        ref.write_tokens(data, tokens)
        triax_loss = ref.run_eval(args, args.np, args.weights, data, [])
        if ref.HAVE_HF:  # from_pretrained: the file as model.safetensors beside a config.json
            from transformers import GPT2Config, GPT2LMHeadModel
            d = os.path.join(wd, "hf")
            os.makedirs(d)
            shutil.copy(args.weights, os.path.join(d, "model.safetensors"))
            GPT2Config(n_layer=ref.L, n_head=ref.NH, n_embd=ref.C, n_inner=int(meta["n_inner"]), vocab_size=ref.V,
                       n_positions=ref.NPOS, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0, layer_norm_epsilon=1e-5,
                       activation_function="gelu_new").save_pretrained(d)
            model = GPT2LMHeadModel.from_pretrained(d).eval()
            with torch.no_grad():
                hf_loss = ref.mean_loss(lambda x: model(input_ids=x).logits, tokens)
            what = "HF GPT2LMHeadModel"
    if not ref.HAVE_HF:
        with torch.no_grad():
            hf_loss = ref.mean_loss(lambda x: ref.plain_torch_logits(sd, x), tokens)
        what = f"plain-torch GPT-2 (transformers not importable: {ref.HF_WHY})"
    rel = abs(triax_loss - hf_loss) / abs(hf_loss)
    print(f"{args.weights}: gpt_eval loss {triax_loss:.9g}, {what} loss {hf_loss:.9g}, relative difference {rel:.3g}")
    sys.exit(0 if rel <= 1e-5 else 1)


if __name__ == "__main__":
    main()
