#!/usr/bin/env python3
"""triax's AdamW against torch.optim.AdamW on real gradients.

Runs adamw_torch_dump (a few serial training steps of a small GPT), then replays the same updates
with torch.optim.AdamW from the same initial weights: each step's synced gradients times that
step's clip coefficient, that step's lr, weight decay only on triax's decay ranges. triax's final
weights and Adam moments must equal PyTorch's (float32 rounding apart). A wrong bias correction,
decay applied to the wrong parameters or coupled into the gradient, or a clip coefficient applied
twice shows here, where the serial reference would share it. Exit 77 (skipped) without torch.

usage: adamw_torch_check.py PATH/TO/adamw_torch_dump
"""
import json
import os
import subprocess
import sys
import tempfile

try:
    import torch
except ImportError:
    print("torch is not installed (Debian: python3-torch); skipped")
    sys.exit(77)


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([sys.argv[1], d], check=True)
        with open(os.path.join(d, "adamw.json")) as f:
            meta = json.load(f)
        with open(os.path.join(d, "adamw.f32"), "rb") as f:
            data = torch.frombuffer(bytearray(f.read()), dtype=torch.float32)
    n = meta["numel"]

    def array(offset):
        return data[offset:offset + n]

    ranges = meta["ranges"]
    init, final = array(meta["init"]), array(meta["final"])
    params = [torch.nn.Parameter(init[r["offset"]:r["offset"] + r["count"]].clone()) for r in ranges]
    groups = [
        {"params": [p for p, r in zip(params, ranges) if r["decay"]], "weight_decay": meta["weight_decay"]},
        {"params": [p for p, r in zip(params, ranges) if not r["decay"]], "weight_decay": 0.0},
    ]
    assert groups[0]["params"] and groups[1]["params"], "need parameters with and without decay"
    opt = torch.optim.AdamW(groups, lr=1.0, betas=(meta["beta1"], meta["beta2"]), eps=meta["eps"])
    for step in meta["steps"]:
        grads = array(step["grads"])
        for p, r in zip(params, ranges):
            p.grad = grads[r["offset"]:r["offset"] + r["count"]].clone() * step["clip_coef"]
        for g in opt.param_groups:
            g["lr"] = step["lr"]
        opt.step()

    def worst(name, got, want, scale):
        err = (got - want).abs().max().item() / scale
        print(f"{name}: largest difference {err:.3g} of the scale {scale:.3g}")
        return err

    moved = max((final[r["offset"]:r["offset"] + r["count"]] - init[r["offset"]:r["offset"] + r["count"]])
                .abs().max().item() for r in ranges)
    errs = []
    for key, which in (("weights", None), ("exp_avg", "exp_avg"), ("exp_avg_sq", "exp_avg_sq")):
        mine = final if which is None else array(meta[which])
        got = torch.cat([mine[r["offset"]:r["offset"] + r["count"]] for r in ranges])
        want = torch.cat([p.detach() if which is None else opt.state[p][which] for p in params])
        # Weights: in units of the largest movement over the run (~ steps x lr); moments: of their own size.
        errs.append(worst(key, got, want, moved if which is None else want.abs().max().item()))
    clipped = meta["clipped_steps"]
    print(f"{len(meta['steps'])} steps, {clipped} clipped; lr {[round(s['lr'], 6) for s in meta['steps']]}, "
          f"grad norms {[round(s['grad_norm'], 4) for s in meta['steps']]}")
    ok = clipped >= 1 and clipped < len(meta["steps"]) and max(errs) <= 1e-4
    print("OK" if ok else "MISMATCH (or clipping acted on every step or none)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
