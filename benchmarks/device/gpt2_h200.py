#!/usr/bin/env python3
"""gpt2_h200: step 3 of the device run (benchmarks/device/run_h200.sh). bf16 GPT-2 124M for --steps
steps on one GPU: triax (train_gpt --backend cuda --bf16) beside PyTorch eager and torch.compile
(benchmarks/torch_compare.py --gpu-run, bf16 autocast) of the same shape, from the same initial
weights (an HF GPT-2 safetensors file written here, read by train_gpt --init-from and by PyTorch),
on the same tokens in the same order (an llm.c shard written here; train_gpt --no-data-shuffle).

Reported: tokens/s (median step time over the steps after the warm-up), MFU = tokens/s x (6N + 6LCT)
/ 989 TFLOP/s (H200 dense bf16), triax's peak memory against the planner's prediction (triax-plan
--json), the loss curves of all three. Targets, one "TARGET ... pass|FAIL" line each: MFU >= 45%,
>= 1.2x PyTorch eager, >= 1.0x torch.compile, memory within 10% of the prediction; and a check that
the sides start from the same model: triax's first loss within 1% of PyTorch eager's.

--rehearse (no GPU): writes the data and the weights, asks the planner, checks that train_gpt --help
offers every flag the GPU run passes, then trains 2 fp32 steps of the same model and data on the
CPU in both triax (--backend cpu) and PyTorch and compares the losses (1e-4 relative): the weight
layout and the sample order that the GPU comparison relies on are checked before any GPU time is
spent. The GPU commands are printed, not run.

Exit: 0 every check passed; 1 a check failed or a program failed; 77 a program or flag the run needs
is missing (train_gpt without --backend cuda or --bf16), or no GPU (the device run reports the step
as "missing"/"skipped"). The numbers go to --result (JSON) for summary.json.
"""
import argparse
import json
import math
import os
import re
import statistics
import struct
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
MISSING, FAILED = 77, 1
PEAK_TFLOPS = 989.0  # H200 SXM dense bf16 (the peak)
LR, BETA1, BETA2, EPS, WD, CLIP = 6e-4, 0.9, 0.95, 1e-8, 0.1, 1.0
# GPT-2 124M (HF gpt2): layers, hidden, heads, vocabulary, positions.
L, C, H, V, MAX_T = 12, 768, 12, 50257, 1024


def log(f, msg):
    print(msg, flush=True)
    f.write(msg + "\n")
    f.flush()


# ---------------------------------------------------------------- inputs shared by every side
def write_shard(path, n_tokens, seed):
    """An llm.c shard (256 int32 header: magic, version, count; then uint16 tokens) of a first-order
    Markov chain with 4 successors per token: a language with structure, so the loss falls."""
    import numpy as np
    rng = np.random.default_rng(seed)
    succ = rng.integers(0, V, size=(V, 4), dtype=np.int64)
    pick = rng.integers(0, 4, size=n_tokens, dtype=np.int64)
    toks = np.empty(n_tokens, dtype=np.int64)
    toks[0] = rng.integers(0, V)
    for i in range(1, n_tokens):  # ~1 s per million tokens
        toks[i] = succ[toks[i - 1], pick[i]]
    header = np.zeros(256, dtype="<i4")
    header[:3] = (20240520, 1, n_tokens)
    with open(path + ".tmp", "wb") as f:
        f.write(header.tobytes())
        f.write(toks.astype("<u2").tobytes())
    os.replace(path + ".tmp", path)


def hf_gpt2_shapes():
    shapes = [("transformer.wte.weight", (V, C)), ("transformer.wpe.weight", (MAX_T, C))]
    for l in range(L):
        p = f"transformer.h.{l}."
        shapes += [(p + "ln_1.weight", (C,)), (p + "ln_1.bias", (C,)), (p + "attn.c_attn.weight", (C, 3 * C)),
                   (p + "attn.c_attn.bias", (3 * C,)), (p + "attn.c_proj.weight", (C, C)),
                   (p + "attn.c_proj.bias", (C,)), (p + "ln_2.weight", (C,)), (p + "ln_2.bias", (C,)),
                   (p + "mlp.c_fc.weight", (C, 4 * C)), (p + "mlp.c_fc.bias", (4 * C,)),
                   (p + "mlp.c_proj.weight", (4 * C, C)), (p + "mlp.c_proj.bias", (C,))]
    return shapes + [("transformer.ln_f.weight", (C,)), ("transformer.ln_f.bias", (C,))]


def write_init(path, seed):
    """GPT-2's initialisation (normal 0.02; the residual projections 0.02 / sqrt(2L); LayerNorm 1, 0;
    biases 0) as an F32 HF GPT2LMHeadModel safetensors file (Conv1D: weight (in, out)). N returned."""
    import numpy as np
    rng = np.random.default_rng(seed)
    header, blobs, off = {"__metadata__": {"n_head": str(H), "format": "pt"}}, [], 0
    for name, shape in hf_gpt2_shapes():
        if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name.endswith("ln_f.weight"):
            a = np.ones(shape, dtype=np.float32)
        elif name.endswith(".bias"):
            a = np.zeros(shape, dtype=np.float32)
        else:
            std = 0.02 / math.sqrt(2 * L) if name.endswith("c_proj.weight") else 0.02
            a = (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype("<f4")
        b = a.tobytes()
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
    os.replace(path + ".tmp", path)
    return sum(math.prod(s) for _, s in hf_gpt2_shapes())


def make_inputs(a, logf):
    t0 = time.time()
    a.numel = write_init(a.init, 1234)
    write_shard(a.shard, a.steps * a.batch * a.seq + 1, 1234)
    log(logf, f"inputs: {a.init} ({a.numel} parameters, F32), {a.shard} ({a.steps * a.batch * a.seq + 1} tokens) "
              f"in {time.time() - t0:.1f} s")


# ---------------------------------------------------------------- the programs
def smi(query):
    """nvidia-smi's CSV rows for a query, or [] (no nvidia-smi, an error)."""
    try:
        q = subprocess.run(["nvidia-smi", query, "--format=csv,noheader,nounits"], capture_output=True, text=True,
                           timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [[x.strip() for x in line.split(",")] for line in q.splitlines() if line.strip()]


def gpu_used_mib():
    rows = smi("--query-gpu=memory.used")
    return int(rows[0][0]) if rows and rows[0][0].isdigit() else None


def run(cmd, logf, timeout, env=None, poll_gpu=False):
    """(rc, output, seconds, peak GPU MiB of the process seen by nvidia-smi or None); rc 124 on timeout.
    The process's own row of --query-compute-apps, else (another PID namespace) the growth of the
    GPU's used memory over what it was before the start."""
    log(logf, "$ " + " ".join(cmd))
    base = gpu_used_mib() if poll_gpu else None
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    own, total = [None], [None]
    done = threading.Event()

    def poll():
        while not done.wait(0.25):
            for parts in smi("--query-compute-apps=pid,used_memory"):
                if len(parts) == 2 and parts[0] == str(proc.pid) and parts[1].isdigit():
                    own[0] = max(own[0] or 0, int(parts[1]))
            used = gpu_used_mib()
            if used is not None and base is not None:
                total[0] = max(total[0] or 0, used - base)

    poller = threading.Thread(target=poll, daemon=True) if poll_gpu else None
    if poller:
        poller.start()
    try:
        out, _ = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        rc = 124
    done.set()
    secs = time.time() - t0
    peak = [own[0] if own[0] is not None else total[0]]
    logf.write(out or "")
    log(logf, f"  -> rc {rc} in {secs:.1f} s" + (f", GPU memory peak {peak[0]} MiB (nvidia-smi)" if peak[0] else ""))
    return rc, out or "", secs, peak[0]


def torch_env(base=None):
    """The environment of the PyTorch processes: without the bundle's libraries (run_h200.sh puts
    them on LD_LIBRARY_PATH for triax; PyTorch's own libcrypto, libgfortran, ... must win)."""
    env = dict(base or os.environ)
    skip = os.environ.get("TRIAX_DEPS_LIB")
    if skip and env.get("LD_LIBRARY_PATH"):
        env["LD_LIBRARY_PATH"] = ":".join(p for p in env["LD_LIBRARY_PATH"].split(":") if p and p != skip)
    return env


def torch_python():
    """A Python that imports torch: $TORCH_PYTHON, this one, or Debian's /usr/bin/python3."""
    cands = [os.environ.get("TORCH_PYTHON"), sys.executable, "/usr/bin/python3"]
    for p in cands:
        if p and os.path.exists(p) and subprocess.run([p, "-c", "import torch, numpy"], capture_output=True,
                                                      env=torch_env()).returncode == 0:
            return p
    return None


def check_train_gpt_flags(help_text, gpu):
    """The flags the run passes that train_gpt --help does not offer."""
    need = ["--init-from", "--data", "--no-data-shuffle", "--seq-length", "--micro-batch-size", "--global-batch-size",
            "--train-iters", "--lr-decay-style", "--metrics-jsonl", "--backend"]
    if gpu:
        need.append("--bf16")
    missing = [f for f in need if not re.search(re.escape(f) + r"\b", help_text)]
    if gpu and not re.search(r"\bcuda\b", help_text):
        missing.append("--backend cuda")
    return missing


def model_preset(help_text):
    return "gpt2" if re.search(r"\bgpt2\b(?!-)", help_text) else "gpt2-124m"


def train_gpt_cmd(a, exe, preset, backend, bf16, B, T, steps, jsonl):
    cmd = [exe, "--backend", backend, "--model", preset, "--init-from", a.init, "--data", a.shard, "--no-data-shuffle",
           "--seq-length", str(T), "--micro-batch-size", str(B), "--global-batch-size", str(B), "--train-iters",
           str(steps), "--lr", str(LR), "--lr-warmup-iters", "0", "--lr-decay-style", "constant", "--weight-decay",
           str(WD), "--adam-beta1", str(BETA1), "--adam-beta2", str(BETA2), "--adam-eps", str(EPS), "--clip-grad",
           str(CLIP), "--seed", "1234", "--metrics-jsonl", jsonl]
    return cmd + (["--bf16"] if bf16 else [])


def torch_cmd(a, py, device, precision, B, T, steps, compile_, out):
    cmd = [py, os.path.join(ROOT, "benchmarks", "torch_compare.py"), "--gpu-run", "--device", device, "--precision",
           precision, "--init", a.init, "--data", a.shard, "--batch", str(B), "--seq", str(T), "--gpu-steps", str(steps),
           "--lr", str(LR), "--json", out]
    return cmd + (["--compile"] if compile_ else [])


def read_jsonl(path):
    rows = []
    if os.path.exists(path):
        with open(path) as f:
            rows = [json.loads(x) for x in f if x.strip()]
    return [r for r in rows if "loss" in r]


def peak_from_rows(rows):
    """triax's own peak device memory (bytes), from the last row's first key that names one."""
    for k, v in (rows[-1].items() if rows else []):
        if re.search(r"(peak|high_water|hwm).*(mem|bytes|mib|gib)|(mem|memory).*(peak|high_water|hwm)", k, re.I):
            if isinstance(v, (int, float)):
                return float(v) * (2**20 if k.lower().endswith("mib") else 2**30 if k.lower().endswith("gib") else 1), k
    return None, None


def planner(a, logf, B, T):
    exe = os.path.join(a.build, "examples", "triax_plan", "triax-plan")
    if not os.path.exists(exe):
        log(logf, f"planner: {exe} missing")
        return None
    rc, out, _, _ = run([exe, "--model", "gpt2-small", "--cluster", "dgx-h100", "--tp", "1", "--pp", "1", "--dp", "1",
                         "--mbs", str(B), "--seq", str(T), "--global-batch", str(B), "--json"], logf, 60)
    if rc != 0:
        return None
    j = json.loads(out[out.index("{"):])
    m = j["memory"]
    return {"total_gib": j["memory_gib"], "reserved_gib": m["reserved_gib"],
            "buffers_gib": j["memory_gib"] - m["reserved_gib"], "parts_gib": m, "predicted_mfu": j["mfu"],
            "predicted_tokens_per_s": j["tokens_per_second"]}


# ---------------------------------------------------------------- the rehearsal (CPU)
def rehearse(a, logf, result):
    exe = os.path.join(a.build, "examples", "train_gpt", "train_gpt")
    if not os.path.exists(exe):
        log(logf, f"train_gpt: {exe} missing (not built)")
        return MISSING
    help_text = subprocess.run([exe, "--help"], capture_output=True, text=True).stdout
    missing = check_train_gpt_flags(help_text, gpu=True)
    result["train_gpt_missing_flags"] = missing
    log(logf, "train_gpt --help: " + ("offers every flag the GPU run passes" if not missing else
                                      "LACKS " + ", ".join(missing) + " (the GPU step reports 'missing' until it has them)"))
    preset = model_preset(help_text)
    make_inputs(a, logf)
    result["planner"] = planner(a, logf, a.batch, a.seq)
    py = torch_python()
    if not py:
        log(logf, "no Python with torch and numpy: the CPU comparison is not rehearsed")
        return MISSING
    B, T, steps = 2, 64, 2
    jsonl = os.path.join(a.work, "rehearse_triax.jsonl")
    tj = os.path.join(a.work, "rehearse_torch.json")
    env = dict(os.environ, OMP_NUM_THREADS="2", OPENBLAS_NUM_THREADS="2", OMP_WAIT_POLICY="PASSIVE")
    rc1, *_ = run(train_gpt_cmd(a, exe, preset, "cpu", False, B, T, steps, jsonl), logf, a.timeout_triax, env)
    rc2, *_ = run(torch_cmd(a, py, "cpu", "fp32", B, T, steps, False, tj), logf, a.timeout_eager, torch_env(env))
    if rc1 or rc2:
        log(logf, f"CPU comparison: FAILED (train_gpt rc {rc1}, PyTorch rc {rc2})")
        return FAILED
    mine = [r["loss"] for r in read_jsonl(jsonl)]
    ref = json.load(open(tj))["losses"]
    diffs = [abs(x - y) / abs(y) for x, y in zip(mine, ref)]
    ok = len(mine) == len(ref) == steps and max(diffs) <= 1e-4
    result["cpu_check"] = {"triax": mine, "torch": ref, "max_rel_diff": max(diffs, default=None), "ok": ok}
    log(logf, f"CPU fp32, B{B} T{T}, {steps} steps from the GPU run's weights and data: triax {mine} vs PyTorch {ref}: "
              f"max rel. diff {max(diffs, default=float('nan')):.2e} (limit 1e-4): {'ok' if ok else 'FAIL'}")
    log(logf, "GPU commands (not run here):")
    log(logf, "  " + " ".join(train_gpt_cmd(a, exe, preset, "cuda", True, a.batch, a.seq, a.steps,
                                            os.path.join(a.work, "triax.jsonl"))))
    for c in (False, True):
        log(logf, "  " + " ".join(torch_cmd(a, "python3", "cuda", "bf16", a.batch, a.seq, a.steps, c, "...")))
    if not ok:
        return FAILED
    return MISSING if missing else 0  # the rehearsal passed, but the GPU run cannot pass flags it lacks


# ---------------------------------------------------------------- the GPU run
def side_numbers(secs, losses, B, T, fpt, warm):
    timed = secs[warm:] or secs
    med = statistics.median(timed)
    tps = B * T / med
    return {"median_step_s": med, "tokens_per_s": tps, "mfu": tps * fpt / (PEAK_TFLOPS * 1e12), "losses": losses,
            "steps": len(losses), "first_step_s": secs[0] if secs else None}


def targets(res, plan):
    """[(name, value text, target text, passed)]"""
    t, tx = [], res.get("triax")
    if not tx:
        return [("triax run", f"rc {res.get('triax_rc')} (gpt2.log)", f"{res.get('steps')} iterations", False)]
    t.append(("mfu", f"{100 * tx['mfu']:.1f}%", ">= 45%", tx["mfu"] >= 0.45))
    for side, need in (("torch-eager", 1.2), ("torch-compile", 1.0)):
        if res.get(side):
            r = tx["tokens_per_s"] / res[side]["tokens_per_s"]
            res[f"speedup_vs_{side}"] = r
            t.append((f"speed vs {side}", f"{r:.3f}x", f">= {need}x", r >= need))
        else:
            t.append((f"speed vs {side}", "no result", f">= {need}x", False))
    mem = res.get("memory", {})
    if plan and mem.get("measured_gib") is not None:
        pred = plan["buffers_gib"] if mem["source"] == "triax" else plan["total_gib"]
        err = mem["measured_gib"] / pred - 1
        mem.update(predicted_gib=pred, rel_error=err)
        t.append(("memory vs planner", f"{mem['measured_gib']:.2f} GiB ({mem['source']}) vs {pred:.2f} GiB "
                  f"({100 * err:+.1f}%)", "within 10%", abs(err) <= 0.10))
    else:
        t.append(("memory vs planner", "no measurement or no prediction", "within 10%", False))
    if res.get("torch-eager"):
        a, b = tx["losses"][0], res["torch-eager"]["losses"][0]
        d = abs(a - b) / abs(b)
        t.append(("same start (first loss vs eager)", f"{a:.4f} vs {b:.4f} ({d:.1e})", "within 1%", d <= 0.01))
    return t


def gpu(a, logf, result):
    exe = os.path.join(a.build, "examples", "train_gpt", "train_gpt")
    if not os.path.exists(exe):
        log(logf, f"train_gpt: {exe} missing (not built)")
        return MISSING
    help_text = subprocess.run([exe, "--help"], capture_output=True, text=True).stdout
    missing = check_train_gpt_flags(help_text, gpu=True)
    if missing:
        result["train_gpt_missing_flags"] = missing
        log(logf, "train_gpt --help LACKS " + ", ".join(missing) + ": step 3 is missing")
        return MISSING
    make_inputs(a, logf)
    B, T, S = a.batch, a.seq, a.steps
    fpt = 6 * a.numel + 6 * L * C * T
    warm = min(10, S // 5)
    result.update(batch=B, seq=T, steps=S, warmup_steps_excluded=warm, params=a.numel, flops_per_token=fpt,
                  peak_tflops=PEAK_TFLOPS)
    plan = result["planner"] = planner(a, logf, B, T)
    jsonl = os.path.join(a.work, "triax.jsonl")
    rc, out, secs, smi_peak = run(train_gpt_cmd(a, exe, model_preset(help_text), "cuda", True, B, T, S, jsonl), logf,
                                  a.timeout_triax, poll_gpu=True)
    rows = read_jsonl(jsonl)
    result["triax_rc"] = rc
    if rc == 0 and len(rows) == S:
        result["triax"] = side_numbers([r["elapsed_ms"] / 1e3 for r in rows], [r["loss"] for r in rows], B, T, fpt, warm)
        own, key = peak_from_rows(rows)
        result["memory"] = ({"measured_gib": own / 2**30, "source": "triax", "key": key, "nvidia_smi_mib": smi_peak}
                            if own else {"measured_gib": smi_peak / 1024 if smi_peak else None, "source": "nvidia-smi",
                                         "nvidia_smi_mib": smi_peak})
    else:
        log(logf, f"triax: FAILED (rc {rc}, {len(rows)} of {S} iterations in {jsonl})")
    py = torch_python() or "python3"
    for side, comp, tmo in (("torch-eager", False, a.timeout_eager), ("torch-compile", True, a.timeout_compile)):
        out_json = os.path.join(a.work, side + ".json")
        rc2, *_ = run(torch_cmd(a, py, "cuda", "bf16", B, T, S, comp, out_json), logf, tmo, torch_env())
        result[side + "_rc"] = rc2
        if rc2 == 0:
            j = json.load(open(out_json))
            result[side] = side_numbers(j["seconds"], j["losses"], B, T, fpt, warm)
            result[side].update(peak_mem_gib=j["peak_mem_bytes"] / 2**30, version=j["version"], device=j["device"])
    return report(a, logf, result, plan)


def report(a, logf, result, plan):
    sides = [s for s in ("triax", "torch-eager", "torch-compile") if result.get(s)]
    log(logf, f"\nGPT-2 124M bf16, B{a.batch} T{a.seq}, {a.steps} steps, median of steps "
              f"{result['warmup_steps_excluded']}..{a.steps - 1}; 6N + 6LCT = {result['flops_per_token'] / 1e9:.3f} GFLOP "
              f"per token, peak {PEAK_TFLOPS:.0f} TFLOP/s")
    log(logf, f"{'side':>14} | {'ms/step':>8} | {'tokens/s':>9} | {'MFU':>6} | first step s | loss first -> last")
    for s in sides:
        x = result[s]
        log(logf, f"{s:>14} | {1e3 * x['median_step_s']:>8.2f} | {x['tokens_per_s']:>9.0f} | {100 * x['mfu']:>5.1f}% | "
                  f"{x['first_step_s']:>12.2f} | {x['losses'][0]:.4f} -> {x['losses'][-1]:.4f}")
    mem = result.get("memory") or {}
    if mem.get("measured_gib") is not None:
        torch_mem = ", ".join(f"{s} {result[s]['peak_mem_gib']:.2f} GiB" for s in sides if "peak_mem_gib" in result[s])
        log(logf, f"peak memory: triax {mem['measured_gib']:.2f} GiB ({mem['source']})" +
            (f"; {torch_mem} (torch.cuda.max_memory_allocated)" if torch_mem else ""))
    if plan:
        log(logf, f"planner (triax-plan, dgx-h100 rates): {plan['total_gib']:.2f} GiB per GPU ({plan['buffers_gib']:.2f} "
                  f"without the {plan['reserved_gib']:.1f} GiB reserve), MFU {100 * plan['predicted_mfu']:.1f}%")
    log(logf, "loss curves (every 5th step): step | " + " | ".join(sides))
    for i in range(0, a.steps, 5):
        log(logf, f"  {i:>3} | " + " | ".join(f"{result[s]['losses'][i]:.4f}" if i < len(result[s]["losses"]) else "-"
                                            for s in sides))
    result["targets"] = [{"name": n, "value": v, "target": t, "pass": p} for n, v, t, p in targets(result, plan)]
    for t in result["targets"]:
        log(logf, f"TARGET {t['name']}: {t['value']} (target {t['target']}): {'pass' if t['pass'] else 'FAIL'}")
    ok = result.get("triax") and all(t["pass"] for t in result["targets"])
    if not ok:
        return FAILED
    return MISSING if missing else 0  # the rehearsal passed, but the GPU run cannot pass flags it lacks


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", required=True, help="the build directory (train_gpt, triax-plan)")
    ap.add_argument("--work", required=True, help="where the weights, the data and the runs' files go")
    ap.add_argument("--log", required=True, help="the log file (appended)")
    ap.add_argument("--result", required=True, help="the numbers, as JSON")
    ap.add_argument("--rehearse", action="store_true")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--timeout-triax", type=int, default=150)
    ap.add_argument("--timeout-eager", type=int, default=90)
    ap.add_argument("--timeout-compile", type=int, default=180)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    a.init, a.shard = os.path.join(a.work, "gpt2_init.safetensors"), os.path.join(a.work, "gpt2_data.bin")
    result = {"mode": "rehearse" if a.rehearse else "gpu"}
    with open(a.log, "a") as logf:
        rc = rehearse(a, logf, result) if a.rehearse else gpu(a, logf, result)
    result["rc"] = rc
    with open(a.result, "w") as f:
        json.dump(result, f, indent=1)
    return rc


if __name__ == "__main__":
    sys.exit(main())
