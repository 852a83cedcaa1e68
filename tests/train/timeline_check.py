#!/usr/bin/env python3
"""Checks a merged --profile-dir trace.json of a pipeline run (tests/train/timeline_test.sh).

- It parses as JSON with a traceEvents array; every rank 0..R-1 has a track named
  "rank R (tp t, pp p, dp d)", compute spans in every recorded step (2m per stage for 1F1B:
  m forwards, m backwards), p2p and optimizer spans, and one "iteration N" span per recorded step.
- One time axis: a micro-batch's forward on stage s+1 starts after it ended on stage s, and its
  backward on stage s starts after it ended on stage s+1, up to SKEW_US (the ranks' origins are
  taken right after one barrier, so they differ by its exit skew).
- The bubble (idle/compute summed over stages; a stage's idle is its first-to-last compute window
  minus its compute), recomputed here from the spans, equals the one rank 0 stored; the simulator
  with uniform costs gives (p-1)/(2m); and the measured bubble is within REL_TOL of the simulator's
  with the measured mean costs (median over the recorded steps).

Tolerance, measured (2 shared cores, load 7-12, p 4, m 8, messages of 2 KiB, 3 steps per run):
with 40 ms padding per compute (the test's), measured - simulated was +0.8%..+8% of the simulated
0.19 over 6 steps; with 20 ms, +2%..+21%. The simulator has no message latency and no wake-up
delay, which only add idle time, so the error is one-sided and shrinks as compute grows (a
wake-up of about 1 ms per receive wait). REL_TOL = 0.30 of the simulated bubble for the median
step leaves room for a busier machine. A trace whose compute spans included the receive waits
(bubble near 0), or whose messages waited for their sender (2x the simulated bubble with 8 KiB
messages and no single-copy transfer), fails it.
"""
import argparse
import json
import re
import statistics
import sys

SKEW_US = 2000.0
REL_TOL = 0.30


def fail(msg):
    print(f"timeline_check: FAIL: {msg}")
    sys.exit(1)


def window_bubble(spans, stages):
    idle = work = 0.0
    for s in range(stages):
        mine = [x for x in spans if x["stage"] == s]
        if not mine:
            continue
        lo = min(x["ts"] for x in mine)
        hi = max(x["ts"] + x["dur"] for x in mine)
        busy = sum(x["dur"] for x in mine)
        idle += max(0.0, hi - lo - busy)
        work += busy
    return idle / work if work > 0 else 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--ranks", type=int, required=True)
    ap.add_argument("--pp", type=int, required=True)
    ap.add_argument("--micro-batches", type=int, required=True)
    ap.add_argument("--steps", required=True)
    a = ap.parse_args()
    steps = [int(s) for s in a.steps.split(",")]
    with open(a.trace) as f:
        doc = json.load(f)
    evs = doc.get("traceEvents")
    if not isinstance(evs, list):
        fail("no traceEvents array")
    stage_of = {}
    for e in evs:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            m = re.fullmatch(r"rank (\d+) \(tp (\d+), pp (\d+), dp (\d+)\)", e["args"]["name"])
            if not m or int(m.group(1)) != e["pid"]:
                fail(f"track name {e['args']['name']!r} for pid {e['pid']}")
            if int(m.group(2)) == 0 and int(m.group(4)) == 0:
                stage_of[e["pid"]] = int(m.group(3))
    if sorted(stage_of.values()) != list(range(a.pp)) or len(stage_of) != a.ranks:
        fail(f"tracks of the pipeline: {stage_of}, expected one per stage 0..{a.pp - 1}")
    spans = [e for e in evs if e.get("ph") == "X"]
    for r in range(a.ranks):
        for cat in ("compute", "p2p", "optimizer"):
            if not any(e["pid"] == r and e["cat"] == cat for e in spans):
                fail(f"rank {r} has no {cat} spans")
        its = sorted(int(e["name"].split()[1]) for e in spans if e["pid"] == r and e["cat"] == "step")
        if its != steps:
            fail(f"rank {r}: step spans for iterations {its}, expected {steps}")
    other = doc.get("otherData", {})
    stored = {s["step"]: s for s in other.get("steps", [])}
    m, p = a.micro_batches, a.pp
    rel = []
    for step in steps:
        comp = []
        for e in spans:
            if e["cat"] != "compute" or e["args"].get("step") != step:
                continue
            comp.append({"stage": stage_of[e["pid"]], "op": e["name"].split()[0], "mb": e["args"]["mb"],
                         "ts": float(e["ts"]), "dur": float(e["dur"])})
        for s in range(p):
            n = {op: sum(1 for x in comp if x["stage"] == s and x["op"] == op) for op in ("forward", "backward")}
            if n != {"forward": m, "backward": m}:
                fail(f"step {step} stage {s}: {n} compute spans, expected {m} forward and {m} backward")
        at = {(x["stage"], x["op"], x["mb"]): x for x in comp}
        for s in range(p - 1):
            for mb in range(m):
                f0, f1 = at[(s, "forward", mb)], at[(s + 1, "forward", mb)]
                if f1["ts"] + SKEW_US < f0["ts"] + f0["dur"]:
                    fail(f"step {step} mb {mb}: forward on stage {s + 1} starts before it ended on stage {s}")
                b1, b0 = at[(s + 1, "backward", mb)], at[(s, "backward", mb)]
                if b0["ts"] + SKEW_US < b1["ts"] + b1["dur"]:
                    fail(f"step {step} mb {mb}: backward on stage {s} starts before it ended on stage {s + 1}")
        measured = window_bubble(comp, p)
        st = stored.get(step)
        if st is None:
            fail(f"otherData has no bubble for step {step}")
        if abs(st["measured_bubble"] - measured) > 1e-6 * max(1.0, measured):
            fail(f"step {step}: stored measured bubble {st['measured_bubble']} but the spans give {measured}")
        uniform = (p - 1) / (2 * m)
        if abs(st["uniform_bubble"] - uniform) > 1e-9:
            fail(f"step {step}: simulator with uniform costs gives {st['uniform_bubble']}, closed form {uniform}")
        sim = st["simulated_bubble"]
        print(f"step {step}: bubble measured {measured:.4f} simulated {sim:.4f} uniform {uniform:.4f} "
              f"(measured - simulated = {measured - sim:+.4f}, {100 * (measured - sim) / sim:+.1f}%)")
        rel.append((measured - sim) / sim)
    med = statistics.median(rel)
    if abs(med) > REL_TOL:
        fail(f"median relative difference measured vs simulated {med:+.3f} exceeds {REL_TOL}")
    print(f"timeline_check: ok: {a.ranks} ranks, steps {steps}, median measured/simulated difference {100 * med:+.1f}% "
          f"(tolerance {100 * REL_TOL:.0f}%)")


if __name__ == "__main__":
    main()
