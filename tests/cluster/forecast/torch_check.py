#!/usr/bin/python3
"""The model file of `triax-forecast train` loads into torch.nn.LSTM(4, 64, batch_first=True) +
torch.nn.Linear(64, 1) (load_state_dict, strict) and gives the same outputs as `triax-forecast
predict` (issue 31: "the exported model loads into torch.nn.LSTM with the same predictions").

  /usr/bin/python3 torch_check.py TRIAX_FORECAST [--days 3] [--epochs 20] [--keep DIR]

Trains on a generated CSV (gen_history.py), standardises each node's last 24 hours with the
file's scaler.mean/std, runs torch, and compares with predict's "model_output" (rel 1e-4 or abs
1e-5) and "predicted_utilisation" (the output scaled back and clamped to [0, 1]). Exit 77 with a
message where torch or numpy cannot be imported (run it with Debian's /usr/bin/python3, which has
torch; pyenv's python3 does not).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "scripts"))
FEATURES = ("compute", "memory_bw", "latency", "iops")


def last_windows(csv_path, hours=24):
    """{node: (hours x 4) list of the node's last `hours` rows}."""
    rows = {}
    with open(csv_path) as f:
        next(f)
        for line in f:
            t, node, *vals = line.strip().split(",")
            rows.setdefault(node, []).append((int(t), [float(v) for v in vals]))
    return {n: [v for _, v in sorted(r)[-hours:]] for n, r in rows.items()}


def run(cmd, timeout=300):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {p.returncode}:\n{p.stderr}")
    return p.stdout


def torch_outputs(model_path, windows):
    import numpy as np
    import torch
    from safetensors_f32 import read_f32
    tensors, meta = read_f32(model_path)
    lstm = torch.nn.LSTM(len(FEATURES), 64, batch_first=True)
    dense = torch.nn.Linear(64, 1)
    names = set(tensors)
    want = {f"lstm.{k}" for k in lstm.state_dict()} | {f"dense.{k}" for k in dense.state_dict()} | {
        "scaler.mean", "scaler.std"}
    if names != want:
        sys.exit(f"FAIL: {model_path} holds {sorted(names)}, torch wants {sorted(want)}")
    lstm.load_state_dict({k[5:]: torch.from_numpy(v) for k, v in tensors.items() if k.startswith("lstm.")}, strict=True)
    dense.load_state_dict({k[6:]: torch.from_numpy(v) for k, v in tensors.items() if k.startswith("dense.")},
                          strict=True)
    mean = tensors["scaler.mean"].astype(np.float64)
    std = tensors["scaler.std"].astype(np.float64)
    nodes = sorted(windows)
    x = (np.array([windows[n] for n in nodes], dtype=np.float64) - mean) / std
    with torch.no_grad():
        h, _ = lstm(torch.from_numpy(x.astype(np.float32)))
        z = dense(h[:, -1, :]).squeeze(1).double().numpy()
    util = np.clip(z * std[0] + mean[0], 0.0, 1.0)
    return {n: (float(z[i]), float(util[i])) for i, n in enumerate(nodes)}, meta


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("exe")
    ap.add_argument("--days", default="3")
    ap.add_argument("--epochs", default="20")
    ap.add_argument("--keep")
    args = ap.parse_args()
    try:
        import numpy
        import torch
        del numpy  # torch_outputs imports it again; here only whether it can be
    except ImportError as e:
        print(f"SKIP: torch/numpy not importable by {sys.executable} ({e}); run with Debian's /usr/bin/python3")
        return 77
    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp(prefix="triax_forecast_torch_")
    try:
        csv, model = os.path.join(tmp, "h.csv"), os.path.join(tmp, "m.safetensors")
        end = int(time.time()) // 3600 * 3600
        run([sys.executable, os.path.join(HERE, "gen_history.py"), "--days", args.days, "--end", str(end),
             "--seed", "5", "--csv", csv])
        run([args.exe, "train", "--csv", csv, "--model", model, "--epochs", args.epochs, "--quiet"])
        out = run([args.exe, "predict", "--csv", csv, "--model", model, "--json", "-"])
        # stdout holds the table, then the JSON object (dump(2): "{" alone on a line).
        start = out.find("{\n")
        if start < 0:
            print(f"FAIL: no JSON object in predict's stdout:\n{out}")
            return 1
        pred = json.JSONDecoder().raw_decode(out[start:])[0]
        ours = {n["node"]: n for n in pred["nodes"]}
        theirs, meta = torch_outputs(model, last_windows(csv))
        print(f"model metadata: {json.dumps(meta, sort_keys=True)}")
        bad = 0
        if sorted(ours) != sorted(theirs):
            print(f"FAIL: predict's nodes {sorted(ours)} != the CSV's {sorted(theirs)}")
            return 1
        for n in sorted(ours):
            z, u = theirs[n]
            zo, uo = ours[n]["model_output"], ours[n]["predicted_utilisation"]
            ok = abs(z - zo) <= max(1e-5, 1e-4 * abs(z)) and abs(u - uo) <= max(1e-5, 1e-4 * abs(u))
            bad += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {n}: model_output triax {zo:+.7f} torch {z:+.7f} (diff {zo - z:+.2e}); "
                  f"utilisation triax {uo:.6f} torch {u:.6f}")
        if bad:
            print(f"FAIL: {bad} node(s) differ beyond rel 1e-4 / abs 1e-5")
            return 1
        print(f"ok: the model loads into torch.nn.LSTM + nn.Linear (strict) and predicts the same "
              f"for {len(ours)} nodes")
        return 0
    finally:
        if args.keep:
            shutil.copytree(tmp, args.keep, dirs_exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
