#!/usr/bin/env python3
"""torch_compare: one CPU training step of triax against PyTorch, the same GPT-2 on the same data.

Two long-lived workers per thread setting, started with the same environment:
  triax    build/benchmarks/torch_compare_triax (GptChunk forward + backward + Optimizer::step)
  torch    this file with --worker: a PyTorch GPT-2 of exactly the same shape, initialised from
           triax's own initial weights (exported as safetensors), AdamW with the same betas, eps,
           weight decay (same parameters decayed) and learning rate, clip_grad_norm_ 1.0.
Both read the same int32 token file and take the same batches in the same order. The driver
alternates them in rounds (A B, then B A, ...), each round K steps per side after a warm-up, and
measures OpenBLAS sgemm on the step's GEMM shapes (one big call each) in every round too; since
this machine's speed drifts, only the per-round ratios mean anything.

  torch_compare.py [--triax PATH] [--triax-b PATH] [--shapes tiny,small,gpt2-124m] [--rounds 5] [--steps 3]
                   [--warmup 2] [--settings tuned,default] [--threads 2] [--json FILE]
  torch_compare.py --smoke [--triax PATH]   # CI: tiny shape, both sides' losses and norms agree

Exit 77 when PyTorch (Debian: python3-torch) is missing, 1 on a failed check.
"""
import argparse
import json
import math
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time

SKIP = 77

# name: (layers, heads, channels, vocab, seq, batch, max_seq)
SHAPES = {
    "tiny": (4, 4, 256, 512, 256, 8, 256),
    "small": (6, 6, 384, 4096, 256, 8, 256),
    "gpt2-124m": (12, 12, 768, 50257, 64, 4, 1024),
    "smoke": (2, 2, 64, 100, 32, 2, 32),  # vocab 100 padded to 128: the padded rows are exercised
}
LR, BETA1, BETA2, EPS, WD, CLIP = 6e-4, 0.9, 0.95, 1e-8, 0.1, 1.0

# The tuned setting: idle OpenMP threads sleep instead of spinning (both sides run in one pool
# each; the side not running must not spin against the one running).
SETTINGS = {
    "tuned": {"OMP_WAIT_POLICY": "passive"},
    "default": {},
}


def load_average():
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "n/a"


# ---------------------------------------------------------------- the PyTorch worker
def read_safetensors(path):
    import numpy as np
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {})
    out = {}
    for name, e in header.items():
        if e["dtype"] != "F32":
            raise SystemExit(f"torch_compare: {path}: {name} has dtype {e['dtype']}, expected F32")
        b, end = e["data_offsets"]
        out[name] = np.frombuffer(data[b:end], dtype="<f4").reshape(e["shape"]).copy()
    return out, meta


def torch_worker(args):
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(args.threads)
    L, H, C, V, T, B, _ = args.shape_tuple
    weights, meta = read_safetensors(args.init)
    decay = set(meta.get("decay", "").split(","))
    params = {k: torch.nn.Parameter(torch.from_numpy(v)) for k, v in weights.items()}
    hs = C // H
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)  # True above the diagonal: masked
    scale = 1.0 / math.sqrt(hs)
    P = params

    def forward(idx, tgt):
        x = F.embedding(idx, P["transformer.wte.weight"]) + P["transformer.wpe.weight"][:T]
        for layer in range(L):
            p = f"transformer.h.{layer}."
            h = F.layer_norm(x, (C,), P[p + "ln_1.weight"], P[p + "ln_1.bias"], 1e-5)
            qkv = F.linear(h, P[p + "attn.c_attn.weight"], P[p + "attn.c_attn.bias"])
            q, k, v = qkv.split(C, dim=2)
            q = q.view(B, T, H, hs).transpose(1, 2)
            k = k.view(B, T, H, hs).transpose(1, 2)
            v = v.view(B, T, H, hs).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) * scale
            att = torch.softmax(att.masked_fill(mask, float("-inf")), dim=-1)
            y = (att @ v).transpose(1, 2).reshape(B, T, C)
            x = x + F.linear(y, P[p + "attn.c_proj.weight"], P[p + "attn.c_proj.bias"])
            h = F.layer_norm(x, (C,), P[p + "ln_2.weight"], P[p + "ln_2.bias"], 1e-5)
            h = F.gelu(F.linear(h, P[p + "mlp.c_fc.weight"], P[p + "mlp.c_fc.bias"]), approximate="tanh")
            x = x + F.linear(h, P[p + "mlp.c_proj.weight"], P[p + "mlp.c_proj.bias"])
        x = F.layer_norm(x, (C,), P["transformer.ln_f.weight"], P["transformer.ln_f.bias"], 1e-5)
        logits = F.linear(x, P["transformer.wte.weight"][:V])  # tied head over the real vocabulary
        return F.cross_entropy(logits.view(-1, V), tgt.view(-1))

    groups = [{"params": [p for n, p in P.items() if n in decay], "weight_decay": WD},
              {"params": [p for n, p in P.items() if n not in decay], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=LR, betas=(BETA1, BETA2), eps=EPS)
    import numpy as np
    tokens = torch.from_numpy(np.fromfile(args.data, dtype="<i4").astype(np.int64))
    nseq = (tokens.numel() - 1) // T
    step = 0
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "quit":
            break
        if cmd[0] == "hello":
            reply = {"side": "torch", "version": torch.__version__, "threads": torch.get_num_threads(),
                     "numel": sum(p.numel() for p in P.values())}
        elif cmd[0] == "steps":
            losses, norms, secs = [], [], []
            for _ in range(int(cmd[1])):
                rows = [((step * B + b) % nseq) * T for b in range(B)]
                idx = torch.stack([tokens[r:r + T] for r in rows])
                tgt = torch.stack([tokens[r + 1:r + T + 1] for r in rows])
                t0 = time.perf_counter()
                opt.zero_grad(set_to_none=True)
                loss = forward(idx, tgt)
                loss.backward()
                norm = torch.nn.utils.clip_grad_norm_(P.values(), CLIP)
                opt.step()
                secs.append(time.perf_counter() - t0)
                losses.append(loss.item())
                norms.append(norm.item())
                step += 1
            reply = {"losses": losses, "grad_norms": norms, "seconds": secs}
        else:
            reply = {"error": f"unknown command {line.strip()!r}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


# ---------------------------------------------------------------- the driver
class Worker:
    def __init__(self, name, argv, env):
        self.name = name
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
        self.proc_env = env

    def ask(self, cmd):
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"torch_compare: the {self.name} worker exited (rc {self.proc.wait()}) on '{cmd}'")
        out = json.loads(line)
        if "error" in out:
            raise SystemExit(f"torch_compare: {self.name} worker: {out['error']}")
        return out

    def close(self):
        try:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass
        self.proc.wait(timeout=60)


def have_torch():
    try:
        import torch  # noqa: F401
        return True
    except ImportError:
        return False


def start_pair(triax, shape, threads, setting, tmp, seed=1234, data_steps=64):
    """Starts both workers (data_steps batches of random tokens, then wrapping)."""
    import numpy as np
    L, H, C, V, T, B, max_seq = SHAPES[shape]
    data = os.path.join(tmp, f"{shape}.tokens")
    if not os.path.exists(data):
        rng = np.random.default_rng(seed)
        rng.integers(0, V, size=data_steps * B * T + 1, dtype=np.int32).astype("<i4").tofile(data)
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": str(threads), "OPENBLAS_NUM_THREADS": str(threads)})
    for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_PROC_BIND"):
        env.pop(k, None)
    env.update(SETTINGS[setting])
    common = ["--layers", L, "--heads", H, "--channels", C, "--vocab", V, "--seq", T, "--batch", B]
    common = [str(x) for x in common]
    tx = Worker("triax", [triax] + common + ["--max-seq", str(max_seq), "--threads", str(threads), "--seed", str(seed),
                                             "--lr", str(LR), "--clip", str(CLIP), "--beta1", str(BETA1),
                                             "--beta2", str(BETA2), "--eps", str(EPS), "--weight-decay", str(WD),
                                             "--data", data], env)
    hello = tx.ask("hello")
    init = os.path.join(tmp, f"{shape}.init.safetensors")
    tx.ask(f"export {init}")
    th = Worker("torch", [sys.executable, os.path.abspath(__file__), "--worker", "--shape", shape, "--threads",
                          str(threads), "--init", init, "--data", data], env)
    th_hello = th.ask("hello")
    if th_hello["numel"] != hello["numel"]:
        raise SystemExit(f"torch_compare: PyTorch has {th_hello['numel']} parameters, triax {hello['numel']}")
    return tx, th, hello, th_hello


def compare_losses(a, b, what, tol):
    bad = []
    for i, (x, y) in enumerate(zip(a, b)):
        if not (math.isfinite(x) and math.isfinite(y)) or abs(x - y) > tol * max(1.0, abs(y)):
            bad.append(f"step {i}: {what} triax {x:.7f} vs PyTorch {y:.7f} (|diff| {abs(x - y):.2e} > {tol:g})")
    return bad


def smoke(args):
    """Both sides from the same weights and batches: the same losses and grad norms, step by step."""
    with tempfile.TemporaryDirectory() as tmp:
        # One batch repeated: the loss must fall, so both sides are seen to train, not only to agree.
        tx, th, _, th_hello = start_pair(args.triax, "smoke", 1, "tuned", tmp, data_steps=1)
        steps = 5
        a, b = tx.ask(f"steps {steps}"), th.ask(f"steps {steps}")
        tx.close(), th.close()
        # The same triax run with the baseline x86-64 loops instead of the AVX2 ones (core/cpu_isa.h):
        # the instruction set must change no bit of any loss or norm.
        os.environ["TRIAX_CPU_ISA"] = "baseline"
        try:
            bx, bth, _, _ = start_pair(args.triax, "smoke", 1, "tuned", tmp, data_steps=1)
            base = bx.ask(f"steps {steps}")
            bx.close(), bth.close()
        finally:
            del os.environ["TRIAX_CPU_ISA"]
    print(f"torch_compare smoke: PyTorch {th_hello['version']}, shape {SHAPES['smoke']}, {steps} steps")
    for i in range(steps):
        print(f"  step {i}: loss triax {a['losses'][i]:.7f} torch {b['losses'][i]:.7f} | "
              f"grad norm triax {a['grad_norms'][i]:.6f} torch {b['grad_norms'][i]:.6f}")
    bad = compare_losses(a["losses"], b["losses"], "loss", 1e-4)
    if (base["losses"], base["grad_norms"]) != (a["losses"], a["grad_norms"]):
        bad.append(f"TRIAX_CPU_ISA=baseline changed the bits: losses {base['losses']} vs {a['losses']}, "
                   f"norms {base['grad_norms']} vs {a['grad_norms']}")
    else:
        print("  triax with TRIAX_CPU_ISA=baseline: every loss and norm bit-identical")
    bad += compare_losses(a["grad_norms"], b["grad_norms"], "grad norm", 1e-3)
    # The run must really train (the comparison is not of two constant losses) and clip (the
    # norm > 1.0 on the first step, so both sides' clipping is exercised).
    if not a["losses"][-1] < a["losses"][0]:
        bad.append(f"the loss did not fall over {steps} steps ({a['losses'][0]:.5f} -> {a['losses'][-1]:.5f})")
    if not a["grad_norms"][0] > CLIP:
        bad.append(f"the first grad norm {a['grad_norms'][0]:.4f} does not exceed the clip {CLIP}: clipping untested")
    if abs(a["losses"][0] - math.log(SHAPES["smoke"][3])) > 0.5:
        bad.append(f"initial loss {a['losses'][0]:.4f} is not near ln(vocab) = {math.log(SHAPES['smoke'][3]):.4f}")
    for m in bad:
        print("FAILED: " + m)
    print("torch_compare smoke: " + ("FAILED" if bad else "passed"))
    return 1 if bad else 0


def bench(args):
    results = []
    print(f"torch_compare: one process per side, {args.threads} threads, fp32, AdamW (betas {BETA1},{BETA2}, eps {EPS}, "
          f"wd {WD}, lr {LR}), clip {CLIP}; rounds alternate the sides; load average {load_average()}")
    with tempfile.TemporaryDirectory() as tmp:
        for setting in args.settings:
            for shape in args.shapes:
                L, H, C, V, T, B, _ = SHAPES[shape]
                tx, th, hello, th_hello = start_pair(args.triax, shape, args.threads, setting, tmp)
                flops = hello["flops"]["total"]
                tokens = B * T
                print(f"\n== {shape}: L{L} H{H} C{C} V{V} (padded {hello['padded_vocab']}) T{T} B{B}, "
                      f"{hello['numel'] / 1e6:.2f}M params, {flops / 1e9:.2f} GFLOP/step; setting {setting} "
                      f"({SETTINGS[setting] or 'nothing set'}); PyTorch {th_hello['version']} ==")
                print(f"   OpenBLAS: {hello['openblas']}; triax loops: {hello['isa']}")
                sides = [("triax", tx), ("torch", th)]
                if args.triax_b:
                    tb = Worker("triax-b", [args.triax_b] + tx.proc.args[1:], tx.proc_env)
                    tb.ask("hello")
                    sides.append(("triax-b", tb))
                for _, w in sides:
                    w.ask(f"steps {args.warmup}")
                tx.ask("sgemm 1")
                extra = f" | {'b/triax':>7}" if args.triax_b else ""
                print(f"{'round':>5} | {'side':>7} | {'ms/step':>8} | {'tokens/s':>8} | {'GFLOP/s':>7} | "
                      f"{'% sgemm':>7} | {'sgemm GF/s':>10} | {'torch/triax':>11}{extra} | load")
                rounds = []
                for r in range(args.rounds):
                    # Every round a different side goes first (A B, B A; with three sides a rotation).
                    order = sides[r % len(sides):] + sides[:r % len(sides)]
                    if len(sides) == 2 and r % 2:
                        order = sides[::-1]
                    ms = {}
                    ceiling = tx.ask(f"sgemm {args.sgemm_reps}")["gflops_per_s"]
                    for name, w in order:
                        out = w.ask(f"steps {args.steps}")
                        ms[name] = 1e3 * statistics.median(out["seconds"])
                    ceiling = max(ceiling, tx.ask(f"sgemm {args.sgemm_reps}")["gflops_per_s"])
                    ratio = ms["torch"] / ms["triax"]
                    la = load_average()
                    for name, _ in sides:
                        gf = flops / (ms[name] / 1e3) / 1e9
                        last = name == sides[-1][0]
                        bcol = f"{ms[name] / ms['triax']:.3f}" if name == "triax-b" else ""
                        b = f" | {bcol:>7}" if args.triax_b else ""
                        print(f"{r:>5} | {name:>7} | {ms[name]:>8.1f} | {tokens / ms[name] * 1e3:>8.0f} | {gf:>7.1f} | "
                              f"{100 * gf / ceiling:>6.1f}% | {ceiling:>10.1f} | "
                              f"{(f'{ratio:.3f}' if name == 'torch' else ''):>11}{b} | {la if last else ''}")
                    rounds.append({"triax_ms": ms["triax"], "torch_ms": ms["torch"], "ratio": ratio,
                                   "sgemm_gflops": ceiling, "load": la})
                    if args.triax_b:
                        rounds[-1].update({"triax_b_ms": ms["triax-b"], "b_ratio": ms["triax-b"] / ms["triax"]})
                if args.triax_b:
                    tb.close()
                    bmed = statistics.median(x["b_ratio"] for x in rounds)
                    print(f"   median triax-b/triax step ratio {bmed:.3f} (rounds {min(x['b_ratio'] for x in rounds):.3f}-"
                          f"{max(x['b_ratio'] for x in rounds):.3f}; triax-b = {args.triax_b})")
                tx.close(), th.close()
                med = statistics.median(x["ratio"] for x in rounds)
                frac = statistics.median(flops / (x["triax_ms"] / 1e3) / 1e9 / x["sgemm_gflops"] for x in rounds)
                print(f"   median torch/triax step ratio {med:.3f} (rounds {min(x['ratio'] for x in rounds):.3f}-"
                      f"{max(x['ratio'] for x in rounds):.3f}); triax at {100 * frac:.1f}% of the sgemm ceiling "
                      f"(median of rounds); target >= 1.5: {'met' if med >= 1.5 else 'MISSED'}")
                results.append({"shape": shape, "setting": setting, "dims": SHAPES[shape], "gflop": flops / 1e9,
                                "rounds": rounds, "median_ratio": med, "median_ceiling_fraction": frac})
    print(f"\nload average at the end: {load_average()}")
    print(f"{'shape':>10} | {'setting':>7} | median torch/triax | triax % sgemm")
    for x in results:
        print(f"{x['shape']:>10} | {x['setting']:>7} | {x['median_ratio']:>18.3f} | {100 * x['median_ceiling_fraction']:>12.1f}%")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--triax", default=os.path.join(here, "..", "build", "benchmarks", "torch_compare_triax"))
    ap.add_argument("--triax-b", help="a second triax worker (e.g. the build before a change), timed in the same "
                    "rounds: its step time / triax's is printed per round")
    ap.add_argument("--shapes", default="tiny,small,gpt2-124m")
    ap.add_argument("--settings", default="tuned,default")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per side per round (median taken)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--sgemm-reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--shape", help=argparse.SUPPRESS)
    ap.add_argument("--init", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        args.shape_tuple = SHAPES[args.shape]
        return torch_worker(args)
    if not have_torch():
        system = "/usr/bin/python3"  # Debian's python3-torch lives in the system interpreter
        if os.path.exists(system) and os.path.realpath(sys.executable) != os.path.realpath(system):
            os.execv(system, [system] + sys.argv)
        print("torch_compare: SKIPPED: PyTorch is not installed (Debian: apt-get install python3-torch; "
              "scripts/setup.sh installs it)")
        return SKIP
    if not os.path.exists(args.triax):
        print(f"torch_compare: {args.triax} not found (build the torch_compare_triax target)")
        return 2
    if args.smoke:
        return smoke(args)
    args.shapes = args.shapes.split(",")
    args.settings = args.settings.split(",")
    for s in args.shapes:
        if s not in SHAPES:
            raise SystemExit(f"torch_compare: unknown shape {s!r} ({', '.join(SHAPES)})")
    for s in args.settings:
        if s not in SETTINGS:
            raise SystemExit(f"torch_compare: unknown setting {s!r} ({', '.join(SETTINGS)})")
    return bench(args)


if __name__ == "__main__":
    sys.exit(main() or 0)
