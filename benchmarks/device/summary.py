#!/usr/bin/env python3
"""summary.json of a device run (benchmarks/device/run_h200.sh): one record per step, rewritten after
every step so that a run cut short still leaves what it did.

  summary.py step RECORDS OUT NAME STATUS SECONDS [--rc N] [--log FILE] [--detail TEXT] [--numbers FILE.json]
  summary.py finish RECORDS OUT --mode device|rehearse --wall S      # prints the table; exit 0|1

STATUS: passed, failed, timeout, no_time (the run's budget left too little), missing (the program or
flag the step needs does not exist yet), skipped (no GPU: rehearsal), rehearsed (the GPU command was
printed, not run), info. The run fails on failed, timeout and no_time; missing steps make it
"incomplete" (exit 0: nothing that ran failed, but it proves nothing about them).
"""
import argparse
import json
import os
import subprocess
import sys
import time

BAD = ("failed", "timeout", "no_time")


def load(records):
    if not os.path.exists(records):
        return []
    with open(records) as f:
        return [json.loads(x) for x in f if x.strip()]


def overall(steps):
    if any(s["status"] in BAD for s in steps):
        return "failed"
    if any(s["status"] == "missing" for s in steps):
        return "incomplete"
    return "passed"


def write(records, out, extra):
    steps = load(records)
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    commit = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout
    doc = {"commit": commit.strip() or None, "written_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "status": overall(steps), "steps": steps}
    doc.update(extra)
    tmp = os.path.join(out, "summary.json.tmp")
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, os.path.join(out, "summary.json"))
    return doc


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("step")
    s.add_argument("records")
    s.add_argument("out")
    s.add_argument("name")
    s.add_argument("status", choices=("passed", "failed", "timeout", "no_time", "missing", "skipped", "rehearsed", "info"))
    s.add_argument("seconds", type=float)
    s.add_argument("--rc", type=int)
    s.add_argument("--log")
    s.add_argument("--detail")
    s.add_argument("--numbers", help="a JSON file whose object becomes the step's numbers")
    f = sub.add_parser("finish")
    f.add_argument("records")
    f.add_argument("out")
    f.add_argument("--mode", required=True)
    f.add_argument("--wall", type=float, required=True)
    a = ap.parse_args()
    if a.cmd == "step":
        rec = {"name": a.name, "status": a.status, "seconds": round(a.seconds, 1)}
        if a.rc is not None:
            rec["rc"] = a.rc
        if a.log:
            rec["log"] = a.log
        if a.detail:
            rec["detail"] = a.detail
        if a.numbers and os.path.exists(a.numbers):
            try:
                with open(a.numbers) as nf:
                    rec["numbers"] = json.load(nf)
            except ValueError as e:
                rec["numbers_error"] = f"{a.numbers}: {e}"
        with open(a.records, "a") as rf:
            rf.write(json.dumps(rec) + "\n")
        write(a.records, a.out, {})
        return 0
    doc = write(a.records, a.out, {"mode": a.mode, "wall_s": round(a.wall, 1)})
    print(f"{'step':>12} | {'status':>9} | {'s':>6} | detail")
    for st in doc["steps"]:
        print(f"{st['name']:>12} | {st['status']:>9} | {st['seconds']:>6.1f} | {st.get('detail', '')}")
    print(f"device run ({a.mode}): {doc['status']} in {a.wall:.0f} s (summary.json in {a.out})")
    return 1 if doc["status"] == "failed" else 0


if __name__ == "__main__":
    sys.exit(main())
