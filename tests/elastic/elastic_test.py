#!/usr/bin/python3
"""train_gpt as an elastic worker under the real torchrun (issue 30, docs/FAULTS.md), loopback only.

usage: elastic_test.py SCENARIO TRAIN_GPT LAUNCH_LOCAL
  node_loss  two agents x 2 workers; the second agent's process group gets SIGKILL mid-run; the
             first re-forms at world 2 and finishes; losses after the restart equal a world-2 run
             from a copy of the checkpoint it resumed from; the recovery line's seconds are checked
             against the time measured here from the kill (the MTTR is printed)
  faults     one agent x 2 workers; kill / exit / throw / hang on rank 1 at iteration 3 of the first
             attempt only: the agent restarts the group and the job ends 0; then the same fault in
             every attempt with --max_restarts 1: torchrun ends non-zero and names the fault
  join       two agents x 1 worker (--nnodes 2:3); a third agent joins mid-run: world 2 -> 3 with
             no iteration lost (the SIGTERM save); losses after the join equal a world-3 run from
             a copy of the checkpoint
  errors     one agent x 3 workers with --tp 2 --pp 2,1: the workers refuse with the 'no layout'
             message (exit 2) and torchrun ends non-zero

Every process runs in its own process group, every wait is bounded, and every group still alive
is killed on the way out. Exit 0: passed; 1: a check failed; 77: torchrun (or its Python) absent.
"""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

TORCHRUN = shutil.which("torchrun") or "/usr/bin/torchrun"
TINY = ["--num-layers", "2", "--seq-length", "16"]
ITER_RE = re.compile(r"^\s*iteration\s+(\d+)/\s*(\d+) \|.*\| lm loss: ([0-9.Ee+-]+) \|", re.M)
RECOVERY_RE = re.compile(r"elastic: training resumed ([0-9.]+) s after.*")
LOSS_RTOL = 1e-5
GROUPS = []  # every Popen started here (its own session): killed on exit


class Failed(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Failed(what)
    print(f"ok: {what}", flush=True)


def skip_unless_torchrun():
    if not os.path.exists(TORCHRUN):
        print("SKIP: torchrun is not installed (Debian: python3-torch)")
        sys.exit(77)
    probe = subprocess.run([TORCHRUN, "--help"], capture_output=True, text=True, timeout=60)
    if probe.returncode != 0 or "--rdzv_backend" not in probe.stdout:
        print(f"SKIP: {TORCHRUN} --help failed or lacks --rdzv_backend: {probe.stderr.strip()[-300:]}")
        sys.exit(77)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base_env(extra=None):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE",
               PET_MONITOR_INTERVAL="1")
    for k in ("TRIAX_FAULT", "PET_NNODES", "TORCHELASTIC_RUN_ID", "TRIAX_TEST_FAULT"):
        env.pop(k, None)
    env.update(extra or {})
    return env


def start(cmd, log_path, env):
    """Starts cmd in a new session (its own process group), stdout and stderr to log_path."""
    log = open(log_path, "w")
    # cwd: the flight recorder's dumps (hang, peer failure) land next to the log
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                         cwd=os.path.dirname(log_path))
    log.close()
    p.log_path = log_path
    GROUPS.append(p)
    return p


def kill_group(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def cleanup():
    for p in GROUPS:
        if p.poll() is None:
            kill_group(p)
    for p in GROUPS:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            print(f"warning: process group {p.pid} survived SIGKILL", file=sys.stderr)
    # the workers (same group) are gone too: nothing may be left behind
    for p in GROUPS:
        try:
            os.killpg(p.pid, 0)
            print(f"warning: process group {p.pid} still has members", file=sys.stderr)
        except ProcessLookupError:
            pass


def read(path):
    with open(path, errors="replace") as f:
        return f.read()


def wait_exit(p, seconds, what):
    try:
        return p.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        kill_group(p)
        p.wait()
        show(p.log_path)
        raise Failed(f"{what} did not end within {seconds:.0f} s (killed)")


def wait_for(p, pattern, seconds, what, since=0):
    """Polls p's log (from character `since` on) until pattern matches; returns (match, monotonic
    time first seen)."""
    deadline = time.monotonic() + seconds
    rx = re.compile(pattern, re.M)
    while time.monotonic() < deadline:
        m = rx.search(read(p.log_path)[since:])
        if m:
            return m, time.monotonic()
        if p.poll() is not None:
            m = rx.search(read(p.log_path)[since:])
            if m:
                return m, time.monotonic()
            show(p.log_path)
            raise Failed(f"{what}: the process ended (rc {p.returncode}) before /{pattern}/ appeared")
        time.sleep(0.05)
    show(p.log_path)
    raise Failed(f"{what}: /{pattern}/ did not appear within {seconds:.0f} s")


def show(path, lines=60):
    text = read(path).splitlines()
    keep = [l for l in text if not re.match(r"^(\[default\d+\]:)?\s*([#\w-]+ = |\[\w+\]$|$)", l)]
    print(f"----- {path} (last {lines} informative lines)")
    print("\n".join(keep[-lines:]))
    print("-----", flush=True)


def torchrun_cmd(port, run_id, nproc, max_restarts, entry):
    return [TORCHRUN, "--nproc_per_node", str(nproc), "--max_restarts", str(max_restarts),
            "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", run_id,
            "--redirects", "2", "--tee", "2", "--monitor_interval", "1", "--rdzv_conf", "last_call_timeout=1",
            "--no_python"] + entry


def losses(text):
    return {int(m.group(1)): float(m.group(3)) for m in ITER_RE.finditer(text)}


def elastic_lines(text):
    return [l for l in text.splitlines() if l.startswith("elastic: attempt ")]


def after_last_start(text):
    """The part of a log after its last 'elastic: attempt' line: the last attempt's output."""
    i = text.rfind("elastic: attempt ")
    return text[i:] if i >= 0 else ""


def reference_losses(tmp, train_gpt, launch_local, args, ck, iteration, world):
    """Losses of a run started at `world` ranks (no agent) from a copy of ck/iter_<iteration>."""
    ref = os.path.join(tmp, f"ref{world}")
    name = f"iter_{iteration:07d}"
    shutil.copytree(os.path.join(ck, name), os.path.join(ref, name))
    argv = [a if a != ck else ref for a in args]
    cmd = [sys.executable, launch_local, "-n", str(world), "--timeout", "120", "--", train_gpt] + argv
    p = start(cmd, os.path.join(tmp, f"ref{world}.log"), base_env())
    rc = wait_exit(p, 150, f"the reference run at world {world}")
    if rc != 0:
        show(p.log_path)
    check(rc == 0, f"the reference run at world {world} from a copy of {name} ended 0 (rc {rc})")
    text = read(p.log_path)
    check(f"resumed from {os.path.join(ref, name)}" in text, f"the reference resumed from the copy of {name}")
    return losses(text)


def compare_losses(got, want, first, what):
    its = sorted(i for i in want if i > first)
    check(len(its) > 0 and its[0] == first + 1, f"{what}: the reference printed iterations {first + 1}..")
    worst = 0.0
    for i in its:
        if i not in got:
            raise Failed(f"{what}: iteration {i} of the reference is missing after the restart")
        rel = abs(got[i] - want[i]) / max(abs(want[i]), 1e-30)
        if rel > LOSS_RTOL:
            raise Failed(f"{what}: iteration {i}: lm loss {got[i]:.6E} after the restart vs {want[i]:.6E} "
                         f"in the reference (relative difference {rel:.2e} > {LOSS_RTOL})")
        worst = max(worst, rel)
    check(True, f"{what}: {len(its)} losses (iterations {its[0]}..{its[-1]}) equal the reference "
                f"(largest relative difference {worst:.2e} <= {LOSS_RTOL})")


def wait_listening(agent, port, timeout_s=60):
    """Every agent of a loopback c10d rendezvous tries to host its store; the first to bind the port
    does. Waits until `agent` (started first) holds it, so that the others connect to it and the
    agent the test kills is never the store's host."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if agent.poll() is not None:
            check(False, f"the first agent ended (rc {agent.poll()}) before its c10d store listened")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    check(False, f"the first agent's c10d store did not listen on port {port} within {timeout_s} s")


# ---------------------------------------------------------------------------------------------
def node_loss(tmp, train_gpt, launch_local):
    ck = os.path.join(tmp, "ck")
    save_interval = 4
    args = ["--tp", "2,1", "--train-iters", "24", "--global-batch-size", "8", "--micro-batch-size", "2",
            "--seed", "3", "--save", ck, "--load", ck, "--save-interval", str(save_interval), "--keep-last", "0"] + TINY
    env = base_env({"PET_NNODES": "1:2", "TRIAX_FAULT": "0:1:slow:250"})
    port = free_port()
    cmd = torchrun_cmd(port, "nodeloss", 2, 3, [train_gpt] + args)
    t0 = time.monotonic()
    a = start(cmd, os.path.join(tmp, "a.log"), env)  # hosts the c10d store: never killed
    wait_listening(a, port)
    b = start(cmd, os.path.join(tmp, "b.log"), env)
    # A may first train alone (--nnodes 1:2) until B joins: wait for an attempt at world 4, then for
    # an iteration of it at or past 6 (the save of iteration 4 is committed by then, so the restart
    # resumes from a save of this run rather than from nothing).
    m4, _ = wait_for(a, r"^elastic: attempt \d+ .*\(world 4\); ", 120, "an attempt at world 4")
    since = read(a.log_path).find(m4.group(0))
    wait_for(a, r"^\s*iteration\s+(?:[6-9]|[1-9]\d)/", 120, "iteration 6 or later at world 4", since)
    kill_group(b)
    killed = time.monotonic()
    at_kill = len(read(a.log_path))
    b.wait(timeout=10)
    print(f"SIGKILL to agent B's process group at {killed - t0:.1f} s", flush=True)
    m, seen = wait_for(a, RECOVERY_RE.pattern, 120, "agent A's recovery line after the kill", at_kill)
    rc = wait_exit(a, 120, "agent A")
    text = read(a.log_path)
    if rc != 0:
        show(a.log_path)
    check(rc == 0, f"agent A ended 0 at world 2 (rc {rc})")
    line = elastic_lines(text)[-1]
    print(line)
    lm = re.search(r"\(world 4\) -> tp 2 x pp 1 x dp 1 \(world 2\); resumed from iteration (\d+); "
                   r"lost (\d+) iterations?", line)
    check(lm is not None, "the elastic line says world 4 -> tp 2 x pp 1 x dp 1 (world 2) and the work lost")
    resumed, lost = int(lm.group(1)), int(lm.group(2))
    # a periodic save, or the save of the SIGTERM with which the agents admitted B (A may train alone first)
    check(resumed > 0, f"resumed from a save of this run (iteration {resumed})")
    check(lost <= save_interval, f"lost {lost} iterations <= --save-interval {save_interval}")
    reported, measured = float(m.group(1)), seen - killed
    print(m.group(0))
    print(f"MTTR (node loss, tiny model, world 4 -> 2): {measured:.1f} s measured from the SIGKILL to the "
          f"recovery line; the line says {reported:.1f} s", flush=True)
    check(0 < reported <= measured + 1.5, f"the recovery line's {reported:.1f} s is > 0 and <= the measured "
          f"{measured:.1f} s (+1.5 s slack)")
    got = losses(after_last_start(text))
    want = reference_losses(tmp, train_gpt, launch_local, args, ck, resumed, 2)
    compare_losses(got, want, resumed, "node loss")
    check(max(got) == 24, "the job reached --train-iters 24")


# ---------------------------------------------------------------------------------------------
# torchrun's entrypoint: the fault only where the agent's restart count is 0 (the first attempt).
FIRST_ONLY = ['bash', '-c', 'if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then export TRIAX_FAULT="$TRIAX_TEST_FAULT"; '
              'fi; exec "$0" "$@"']
# What torchrun's failure summary (ChildFailedError: its "Failures" and "Root Cause" entries, each
# with the rank's exit code and error file) must say for a fault on rank 1 in every attempt. The
# root cause is often rank 0 (its error file is older than the agent's sight of rank 1's death).
RANK1 = r"rank\s*: 1 \(local_rank: 1\)\s*exitcode\s*: "
# rank 0 notes whichever it saw first: the peer watch's verdict or its own broken collective
RANK0 = r"triax rank 0: (peer failure: rank 0: rank 1 \(127\.0\.0\.1:\d+, host \S+\) died|communication error: )"
NAMED = {
    "kill": [RANK1 + r"-9 ", r"traceback\s*: Signal 9 \(SIGKILL\) received by PID",
             RANK0],
    "exit": [RANK1 + r"1 \(pid: \d+\)\s*error_file: <N/A>",
             RANK0],
    "throw": [RANK1 + r"1 ", r"traceback\s*: triax rank 1: error: injected fault \(TRIAX_FAULT\): an exception "
              r"inside the step on rank 1 at iteration 3"],
    # every rank's watchdog fires; which ranks the agent lists depends on who exited first
    "hang": [r"traceback\s*: triax rank (\d): rank \1 \(host \S+\): stalled: no training progress "
             r"for [0-9.]+ s \(--stall-timeout 5\) in iteration 3"],
}


def fault_args(tmp, kind, tag):
    ck = os.path.join(tmp, f"ck-{kind}-{tag}")
    a = ["--train-iters", "8", "--global-batch-size", "4", "--micro-batch-size", "2", "--save", ck, "--load", ck,
         "--save-interval", "2"] + TINY
    return a + (["--stall-timeout", "5"] if kind == "hang" else [])


def fault_recovers(tmp, train_gpt, kind):
    env = base_env({"TRIAX_TEST_FAULT": f"1:3:{kind}"})
    cmd = torchrun_cmd(free_port(), f"fault-{kind}", 2, 1, FIRST_ONLY + [train_gpt] + fault_args(tmp, kind, "once"))
    t0 = time.monotonic()
    p = start(cmd, os.path.join(tmp, f"{kind}-once.log"), env)
    rc = wait_exit(p, 90, f"torchrun ({kind} in the first attempt)")
    text = read(p.log_path)
    if rc != 0:
        show(p.log_path)
    check(rc == 0, f"{kind}: the agent restarted the group and the job ended 0 ({time.monotonic() - t0:.1f} s)")
    starts = elastic_lines(text)
    check(len(starts) == 2 and starts[1].startswith("elastic: attempt 2 of run") and "(restart 1 of 1)" in starts[1],
          f"{kind}: one restart: 'elastic: attempt 2 ... (restart 1 of 1)'")
    print(starts[1])
    check(" ended at " in starts[1], f"{kind}: the attempt-2 line says how attempt 1 ended")
    rec = RECOVERY_RE.search(text)
    check(rec is not None, f"{kind}: the recovery line is printed")
    print(f"MTTR ({kind} on rank 1, tiny model, world 2): {float(rec.group(1)):.1f} s: {rec.group(0)}")
    check(max(losses(text)) == 8, f"{kind}: the job reached --train-iters 8")


def fault_exhausts(tmp, train_gpt, kind):
    env = base_env({"TRIAX_FAULT": f"1:3:{kind}"})
    cmd = torchrun_cmd(free_port(), f"always-{kind}", 2, 1, [train_gpt] + fault_args(tmp, kind, "always"))
    t0 = time.monotonic()
    p = start(cmd, os.path.join(tmp, f"{kind}-always.log"), env)
    rc = wait_exit(p, 90, f"torchrun ({kind} in every attempt)")
    text = read(p.log_path)
    secs = time.monotonic() - t0
    summary = text[text.rfind("ChildFailedError"):] if "ChildFailedError" in text else text[-3000:]
    print(f"--- {kind}: torchrun's summary after --max_restarts 1 (rc {rc}, {secs:.1f} s):\n{summary.strip()}\n---")
    check(rc != 0, f"{kind} in every attempt: torchrun ended non-zero (rc {rc}) after --max_restarts 1")
    check(len(elastic_lines(text)) == 2, f"{kind}: two attempts ran")
    for rx in NAMED[kind]:
        check(re.search(rx, summary) is not None, f"{kind}: torchrun's summary says /{rx}/")


def faults(tmp, train_gpt, launch_local):
    kinds = os.environ.get("ELASTIC_FAULT_KINDS", "kill,exit,throw,hang").split(",")
    for kind in kinds:
        fault_recovers(tmp, train_gpt, kind)
    for kind in kinds:
        fault_exhausts(tmp, train_gpt, kind)


# ---------------------------------------------------------------------------------------------
def join(tmp, train_gpt, launch_local):
    ck = os.path.join(tmp, "ck")
    args = ["--train-iters", "40", "--global-batch-size", "12", "--micro-batch-size", "2", "--seed", "3",
            "--save", ck, "--load", ck, "--save-interval", "5", "--keep-last", "0"] + TINY
    env = base_env({"PET_NNODES": "2:3", "TRIAX_FAULT": "0:1:slow:250"})
    port = free_port()
    cmd = torchrun_cmd(port, "join", 1, 0, [train_gpt] + args)
    a = start(cmd, os.path.join(tmp, "a.log"), env)
    wait_listening(a, port)
    b = start(cmd, os.path.join(tmp, "b.log"), env)
    wait_for(a, r"^\s*iteration\s+6/", 120, "agents A and B (world 2)")
    c = start(cmd, os.path.join(tmp, "c.log"), env)
    joined = time.monotonic()
    for name, p in (("A", a), ("B", b), ("C", c)):
        rc = wait_exit(p, 150, f"agent {name}")
        if rc != 0:
            show(p.log_path)
        check(rc == 0, f"agent {name} ended 0 (rc {rc})")
    print(f"the job ended {time.monotonic() - joined:.1f} s after agent C started", flush=True)
    texts = [read(p.log_path) for p in (a, b, c)]
    second = [t for t in texts if "elastic: attempt 2 of run" in t]
    check(len(second) == 1, "one log holds the second attempt's rank 0 output")
    text = second[0]
    line = elastic_lines(text)[-1]
    print(line)
    lm = re.search(r"\(restart 0 of 0\): tp 1 x pp 1 x dp 2 \(world 2\) -> tp 1 x pp 1 x dp 3 \(world 3\); "
                   r"resumed from iteration (\d+); lost 0 iterations", line)
    check(lm is not None, "the elastic line says restart 0 of 0 (a join), dp 2 (world 2) -> dp 3 (world 3), lost 0")
    # the first rank to note the stop wins: its own agent's SIGTERM, or the stop that another rank's
    # signal started (the agents restart their groups at their own monitor ticks, up to 1 s apart)
    check(re.search(r"ended at .*: SIGTERM( \(received by another rank\))?: the state of iteration \d+ was saved",
                    line) is not None, "attempt 1 ended with the agents' SIGTERM and a save")
    resumed = int(lm.group(1))
    rec = RECOVERY_RE.search(text)
    check(rec is not None, "the recovery line is printed")
    print(rec.group(0))
    got = losses(after_last_start(text))
    want = reference_losses(tmp, train_gpt, launch_local, args, ck, resumed, 3)
    compare_losses(got, want, resumed, "join")
    check(max(got) == 40, "the job reached --train-iters 40")


# ---------------------------------------------------------------------------------------------
def errors(tmp, train_gpt, launch_local):
    ck = os.path.join(tmp, "ck")
    args = ["--tp", "2", "--pp", "2,1", "--train-iters", "4", "--global-batch-size", "6", "--micro-batch-size", "2",
            "--save", ck, "--load", ck] + TINY
    cmd = torchrun_cmd(free_port(), "errors", 3, 0, [train_gpt] + args)
    p = start(cmd, os.path.join(tmp, "errors.log"), base_env())
    rc = wait_exit(p, 90, "torchrun (nproc 3, --tp 2 --pp 2,1)")
    text = read(p.log_path)
    show(p.log_path, 30)
    check(rc != 0, f"torchrun ended non-zero (rc {rc})")
    check(re.search(r"no layout of --tp 2 and --pp 2,1 fits a world of 3 ranks .*tp 2 x pp 2: .*not divisible",
                    text) is not None, "the workers say: no layout of --tp 2 and --pp 2,1 fits a world of 3 ranks")
    root = text[text.rfind("Root Cause"):]
    check(re.search(r"triax rank \d: configuration error: no layout of", root) is not None,
          "torchrun's root cause names the configuration error (the workers' error file)")
    check(re.search(r"exitcode\s*: 2 ", text) is not None, "torchrun's summary gives the workers' exit 2")
    check(not losses(text), "no iteration ran")


SCENARIOS = {"node_loss": node_loss, "faults": faults, "join": join, "errors": errors}


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in SCENARIOS:
        print(__doc__, file=sys.stderr)
        return 2
    scenario, train_gpt, launch_local = sys.argv[1:]
    skip_unless_torchrun()
    tmp = tempfile.mkdtemp(prefix=f"triax-elastic-{scenario}-")
    t0 = time.monotonic()
    try:
        SCENARIOS[scenario](tmp, os.path.abspath(train_gpt), os.path.abspath(launch_local))
    except Failed as e:
        print(f"FAIL: {scenario}: {e} (logs under {tmp})", flush=True)
        return 1
    finally:
        cleanup()
    print(f"PASS: {scenario} in {time.monotonic() - t0:.1f} s", flush=True)
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
