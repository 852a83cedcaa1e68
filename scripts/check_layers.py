#!/usr/bin/env python3
"""The layers of triax, bottom to top, and a check that every #include points down (or sideways
within its own folder). A folder may include its own headers and those of any lower layer;
folders of one layer may not include each other. docs/ARCHITECTURE.md draws this table.

Usage: check_layers.py [--root DIR]   exit 0 when every include points down, 1 otherwise.
"""
import argparse
import os
import re
import sys

# Bottom first. kernels/ (the CUDA code behind include/triax/cuda) counts as cuda.
LAYERS = [
    ["core"],                          # errors, dtypes, logging, hashing, env: no triax includes
    ["tensor", "io", "ops", "plan"],   # storage, file formats, CPU kernels, the planner (needs no runtime)
    ["distributed"],                   # bootstrap, communicators, grid, failure reports
    ["backend"],                       # the Backend seam and the CPU backends
    ["cuda"],                          # the CUDA pieces behind the seam (and kernels/)
    ["params", "forecast"],            # the parameter store (on a Backend); the load forecaster's LSTM
    ["parallel", "data"],              # TP mappings; datasets and sample order
    ["model"],                         # GPT layers, MoE, weight files, the Stage interface
    ["pipeline"],                      # schedules and the executor (runs any Stage)
    ["optim"],                         # grad buffers, ZeRO, optimizer (implements GradReadySink)
    ["faults", "config"],              # fault checks/injection/watchdog; the training configuration
    ["train"],                         # the Trainer and its metrics exporter
    ["checkpoint", "probe"],           # checkpoints of a Trainer; the node probe
]
LEVEL = {f: i for i, layer in enumerate(LAYERS) for f in layer}
INCLUDE = re.compile(r'^\s*#\s*include\s+"triax/([A-Za-z0-9_]+)/')
SOURCE = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh")


def folder_of(root, path):
    rel = os.path.relpath(path, root).split(os.sep)
    if rel[0] == "include" and len(rel) > 3 and rel[1] == "triax":
        return rel[2]
    if rel[0] == "src" and len(rel) > 2:
        return rel[1]
    if rel[0] == "kernels":
        return "cuda"  # kernels/ implements include/triax/cuda
    return None


def check(root):
    problems = []
    for top in ("include/triax", "src", "kernels"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
                if not name.endswith(SOURCE):
                    continue
                path = os.path.join(dirpath, name)
                here = folder_of(root, path)
                rel = os.path.relpath(path, root)
                if here not in LEVEL:
                    problems.append(f"{rel}: folder '{here}' has no layer in scripts/check_layers.py")
                    continue
                with open(path, errors="replace") as f:
                    for lineno, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m or m.group(1) == here:
                            continue
                        there = m.group(1)
                        if there not in LEVEL:
                            problems.append(f"{rel}:{lineno}: includes folder '{there}', which has no layer")
                        elif LEVEL[there] >= LEVEL[here]:
                            way = "a higher" if LEVEL[there] > LEVEL[here] else "a sibling"
                            problems.append(f"{rel}:{lineno}: {here} (layer {LEVEL[here]}) includes {way} "
                                            f"layer: {there} (layer {LEVEL[there]})")
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    args = ap.parse_args()
    problems = check(os.path.abspath(args.root))
    for p in problems:
        print(p)
    print(f"layers: {len(problems)} include(s) pointing up or sideways" if problems else "layers: every include points down")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
