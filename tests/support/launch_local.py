#!/usr/bin/env python3
"""Start N local processes the way torchrun does (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT, a job id), without mpirun: the multi-rank tests of the Gloo backend run this way.

usage: launch_local.py -n N [--timeout S] [--env K=V ...] -- COMMAND [ARGS...]

Exit status: the first failing rank's status (by rank), 0 when every rank succeeded, 77 when
every rank skipped, 124 when the job ran past --timeout. When a rank fails, the others get
--grace seconds to fail on their own (their error names the missing peer) before they are killed.
"""
import argparse
import os
import signal
import socket
import subprocess
import sys
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, required=True)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--grace", type=float, default=10)
    ap.add_argument("--env", action="append", default=[])
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
    if a.n < 1 or not cmd:
        ap.error("need -n >= 1 and a command")
    port = free_port()
    base = dict(os.environ)
    for kv in a.env:
        k, _, v = kv.partition("=")
        base[k] = v
    base.update(WORLD_SIZE=str(a.n), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                TRIAX_JOB_ID=f"launch-local-{os.getpid()}-{port}")
    procs = []
    for r in range(a.n):
        env = dict(base, RANK=str(r), LOCAL_RANK=str(r))
        procs.append(subprocess.Popen(cmd, env=env, start_new_session=True))
    deadline = time.monotonic() + a.timeout
    failed_at = None
    while True:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            break
        now = time.monotonic()
        if failed_at is None and any(c not in (None, 0, 77) for c in codes):
            failed_at = now
        if now > deadline or (failed_at is not None and now > failed_at + a.grace):
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
            for p in procs:
                p.wait()
            if now > deadline and failed_at is None:
                print(f"launch_local: {a.n} ranks ran past {a.timeout:.0f} s; killed", file=sys.stderr)
                return 124
            break
        time.sleep(0.05)
    codes = [p.returncode for p in procs]
    bad = [(r, c) for r, c in enumerate(codes) if c not in (0, 77)]
    if bad:
        print("launch_local: exit status by rank: " + ", ".join(f"{r}:{c}" for r, c in enumerate(codes)), file=sys.stderr)
        r, c = bad[0]
        return c if c > 0 else 128 - c
    if all(c == 77 for c in codes):
        return 77
    return 0


if __name__ == "__main__":
    sys.exit(main())
