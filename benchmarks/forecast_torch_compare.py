#!/usr/bin/env python3
"""The forecaster's training step in triax (benchmarks/forecast_bench) against the same step in
PyTorch on the CPU: torch.nn.LSTM(4, 64, batch_first=True) + nn.Linear(64, 1), MSE, Adam, one
fixed batch of 24-hour windows. The two sides alternate in rounds (this machine's speed drifts)
with the same number of threads, and each round prints its ratio (triax time / torch time).

  /usr/bin/python3 benchmarks/forecast_torch_compare.py build/benchmarks/forecast_bench \
      [--batch 32] [--steps 50] [--rounds 5] [--threads 2]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

try:
    import torch
except ImportError:
    print("SKIP: torch is not importable by", sys.executable)
    sys.exit(77)


def torch_round(model, head, opt, x, y, steps):
    t0 = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad()
        out, _ = model(x)
        loss = torch.mean((head(out[:, -1, :]).squeeze(1) - y) ** 2)
        loss.backward()
        opt.step()
    return (time.perf_counter() - t0) / steps * 1e3, float(loss)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bench")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(a.threads)
    model = torch.nn.LSTM(4, 64, batch_first=True)
    head = torch.nn.Linear(64, 1)
    opt = torch.optim.Adam(list(model.parameters()) + list(head.parameters()), lr=1e-3)
    x = torch.randn(a.batch, 24, 4)
    y = torch.randn(a.batch)
    torch_round(model, head, opt, x, y, 5)  # warm-up
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), OPENBLAS_NUM_THREADS=str(a.threads))
    print(f"batch {a.batch} x 24 steps x 4 features, LSTM(64) -> Dense(1), Adam; {a.steps} steps per round, "
          f"{a.threads} thread(s); torch {torch.__version__}")
    print(f"{'round':>5} {'triax ms/step':>14} {'torch ms/step':>14} {'triax/torch':>12}")
    ratios = []
    for r in range(a.rounds):
        out = subprocess.run([a.bench, "--batch", str(a.batch), "--steps", str(a.steps), "--rounds", "2", "--json"],
                             capture_output=True, text=True, env=env, timeout=600, check=True)
        triax_ms = json.loads(out.stdout.strip().splitlines()[-1])["ms_per_step"]  # the second round: warm
        torch_ms, _ = torch_round(model, head, opt, x, y, a.steps)
        ratios.append(triax_ms / torch_ms)
        print(f"{r:>5} {triax_ms:>14.3f} {torch_ms:>14.3f} {ratios[-1]:>12.2f}")
    print(f"median triax/torch: {statistics.median(ratios):.2f} (min {min(ratios):.2f}, max {max(ratios):.2f})")


if __name__ == "__main__":
    main()
