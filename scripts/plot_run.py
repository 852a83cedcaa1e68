#!/usr/bin/env python3
"""Plots a training run from train_gpt's --metrics-jsonl file (docs/TRAINING.md, "Plots").

    plot_run.py m.jsonl [--compare other.jsonl] [-o out.png|out.svg] [--title TEXT]

Draws, against iterations: the loss (training, and validation where the file has it), the learning
rate, the gradient norm, tokens/s, the exposed-communication share of each iteration
((dp_exposed_ms + p2p_wait_ms) / elapsed_ms) and the iteration time. --compare overlays a second
run (dashed). The output format follows the extension of -o (.png or .svg; default: the input's
name with .png). Needs matplotlib (Debian: python3-matplotlib); without it, exits 77 and says so.
Exit codes: 0 written, 1 unreadable or malformed metrics, 2 bad command line, 77 no matplotlib.
"""
import argparse
import json
import math
import os
import sys

PROG = "plot_run.py"


class MetricsError(Exception):
    pass


class Run:
    """The iteration records and the validation records of one JSONL file."""

    def __init__(self, path):
        self.path = path
        self.label = os.path.basename(path)
        self.iters = []   # dicts of iteration records, in file order
        self.valid = []   # dicts of validation records


def load_run(path):
    try:
        with open(path, "r", encoding="utf-8") as f:
            lines = f.readlines()
    except FileNotFoundError:
        raise MetricsError(f"{path}: no such file (write one with train_gpt --metrics-jsonl {path})")
    except IsADirectoryError:
        raise MetricsError(f"{path}: is a directory, not a metrics JSONL file")
    except UnicodeDecodeError as e:
        raise MetricsError(f"{path}: not a text file ({e.reason} at byte {e.start})")
    except OSError as e:
        raise MetricsError(f"{path}: cannot read: {e.strerror}")
    run = Run(path)
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise MetricsError(f"{path}:{no}: not JSON ({e.msg} at column {e.colno}): {line.strip()[:80]}")
        if not isinstance(rec, dict):
            raise MetricsError(f"{path}:{no}: a JSON {type(rec).__name__}, expected one object per line")
        it = rec.get("iteration")
        if not isinstance(it, int) or isinstance(it, bool):
            raise MetricsError(f"{path}:{no}: no integer \"iteration\" key: {line.strip()[:80]}")
        if "valid_loss" in rec:
            check_numbers(path, no, rec, ["valid_loss"])
            run.valid.append(rec)
        elif "loss" in rec:
            check_numbers(path, no, rec, ["loss", "lr", "grad_norm", "tokens_per_s", "elapsed_ms"])
            run.iters.append(rec)
        else:
            raise MetricsError(f"{path}:{no}: neither an iteration record (\"loss\") nor a validation record "
                               f"(\"valid_loss\"): {line.strip()[:80]}")
    if not run.iters:
        what = "is empty" if not any(l.strip() for l in lines) else "has no iteration records"
        raise MetricsError(f"{path}: {what} (expected one JSON object per iteration, as train_gpt "
                           "--metrics-jsonl writes)")
    return run


def check_numbers(path, no, rec, keys):
    for k in keys:
        v = rec.get(k)
        if v is None:
            raise MetricsError(f"{path}:{no}: iteration {rec['iteration']}: no \"{k}\" key")
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise MetricsError(f"{path}:{no}: iteration {rec['iteration']}: \"{k}\" is {json.dumps(v)}, not a number")


def exposed_share(rec, keys=("dp_exposed_ms", "p2p_wait_ms")):
    """Exposed communication over iteration time, in percent (None where the fields are absent).

    train_gpt reports each time as its worst rank's (the maximum over the ranks), so the sum of
    the two can come from two ranks: an upper bound of any one rank's share."""
    t = rec.get("elapsed_ms")
    parts = [rec[k] for k in keys if isinstance(rec.get(k), (int, float))]
    if not parts or not t or t <= 0:
        return None
    return 100.0 * sum(parts) / t


def series(run, key):
    xs, ys = [], []
    for r in run.iters:
        if key == "exposed":
            v = exposed_share(r)
        elif key.startswith("exposed:"):
            v = exposed_share(r, (key[len("exposed:"):],))
        else:
            v = r.get(key)
        if isinstance(v, (int, float)) and math.isfinite(v):
            xs.append(r["iteration"])
            ys.append(v)
    return xs, ys


# (key, panel title, y label)
PANELS = [
    ("loss", "loss", "LM loss"),
    ("lr", "learning rate", "lr"),
    ("grad_norm", "gradient norm", "norm"),
    ("tokens_per_s", "throughput", "tokens/s"),
    ("exposed", "exposed communication (worst rank)", "% of iteration time"),
    ("elapsed_ms", "iteration time", "ms"),
]


def draw(plt, runs, out, title):
    fig, axes = plt.subplots(3, 2, figsize=(11, 9.5), sharex=True)
    styles = ["-", "--"]
    colours = ["tab:blue", "tab:orange"]
    for ax, (key, name, ylabel) in zip(axes.flat, PANELS):
        for k, run in enumerate(runs):
            tag = f" ({run.label})" if len(runs) > 1 else ""
            xs, ys = series(run, key)
            if xs:
                ax.plot(xs, ys, styles[k], color=colours[k], linewidth=1.2,
                        label={"loss": "train", "exposed": "DP exposed + P2P wait"}.get(key, name) + tag)
            if key == "exposed" and len(runs) == 1:  # one run: its two terms beside their sum
                for part, colour in (("dp_exposed_ms", "tab:green"), ("p2p_wait_ms", "tab:red")):
                    px, py = series(run, "exposed:" + part)
                    if px:
                        ax.plot(px, py, "-", color=colour, linewidth=0.8, alpha=0.8,
                                label=part[:-3].replace("_", " ").replace("p2p", "P2P").replace("dp", "DP"))
            if key == "loss" and run.valid:
                vx = [r["iteration"] for r in run.valid]
                vy = [r["valid_loss"] for r in run.valid]
                ax.plot(vx, vy, styles[k], color="tab:red" if k == 0 else "tab:purple", marker="o",
                        markersize=4, linewidth=1.2, label="validation" + tag)
        ax.set_title(name, fontsize=10)
        ax.set_ylabel(ylabel, fontsize=9)
        ax.grid(True, alpha=0.3)
        if key == "exposed":
            ax.set_ylim(bottom=0)
        if key in ("loss", "exposed") or len(runs) > 1:
            ax.legend(fontsize=8)
    for ax in axes[-1]:
        ax.set_xlabel("iteration")
    fig.suptitle(title or " vs ".join(r.label for r in runs), fontsize=12)
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    plt.close(fig)


def main(argv):
    ap = argparse.ArgumentParser(prog=PROG, description="Plot a train_gpt --metrics-jsonl file.")
    ap.add_argument("metrics", help="train_gpt --metrics-jsonl file")
    ap.add_argument("--compare", help="a second run's metrics file, drawn dashed on the same axes")
    ap.add_argument("-o", "--output", help="out.png or out.svg (default: METRICS with .png)")
    ap.add_argument("--title", help="figure title (default: the file names)")
    args = ap.parse_args(argv)
    out = args.output or os.path.splitext(args.metrics)[0] + ".png"
    ext = os.path.splitext(out)[1].lower()
    if ext not in (".png", ".svg"):
        ap.error(f"-o {out}: the extension must be .png or .svg")
    try:
        runs = [load_run(args.metrics)] + ([load_run(args.compare)] if args.compare else [])
    except MetricsError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"{PROG}: matplotlib is not installed for {sys.executable} (Debian: apt-get install "
              "python3-matplotlib, then run with /usr/bin/python3); nothing drawn", file=sys.stderr)
        return 77
    try:
        draw(plt, runs, out, args.title)
    except OSError as e:
        print(f"{PROG}: error: {out}: cannot write: {e.strerror}", file=sys.stderr)
        return 1
    n = sum(len(r.iters) for r in runs)
    print(f"{PROG}: wrote {out} ({n} iterations, {sum(len(r.valid) for r in runs)} validation passes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
