#!/usr/bin/env python3
"""Fixture test of scripts/kernel_budget.py on made-up ptxas reports (no CUDA needed): the recorder
keeps the report and passes other output through; the check passes on a matching budget and fails,
naming the kernel and the regenerate command, on an over-budget kernel, a kernel missing from the
budget and a stale budget line."""
import os
import subprocess
import sys
import tempfile

SCRIPT = os.path.abspath(sys.argv[1])
FAKE_NVCC = r'''
import os, sys
out = sys.argv[sys.argv.index("-o") + 1]
sys.stderr.write("""ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z4gelu' for 'sm_80'
ptxas info    : Function properties for _Z6helperv
    8 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Function properties for _Z4gelu
    16 bytes stack frame, 4 bytes spill stores, 8 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 372 bytes cmem[0]
ptxas info    : Compile time = 3.9 ms
ptxas info    : Compiling entry function '_Z4gelu' for 'sm_90'
ptxas info    : Function properties for _Z4gelu
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers
ptxas info    : Compiling entry function '_Z5adamwPf' for 'sm_90'
ptxas info    : Function properties for _Z5adamwPf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 24 registers, used 0 barriers
ptxas info    : Compiling entry function '_ZN5triax45_GLOBAL__N__bf6089dd_7_gelu_cu_1096f8e4_117211kEv' for 'sm_90'
ptxas info    : Function properties for _ZN5triax45_GLOBAL__N__bf6089dd_7_gelu_cu_1096f8e4_117211kEv
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 12 registers, used 0 barriers
some/file.cu(3): warning #177-D: variable "x" was declared but never referenced
""")
if "--fail" in sys.argv:
    sys.exit(2)
os.makedirs(os.path.dirname(out), exist_ok=True)
open(out, "w").write("object")
'''
failures = []


def expect(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def run(*args):
    p = subprocess.run([sys.executable, SCRIPT, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return p.returncode, p.stdout + p.stderr


with tempfile.TemporaryDirectory() as tmp:
    os.chdir(tmp)
    with open("fake_nvcc.py", "w") as f:
        f.write(FAKE_NVCC)
    rec = os.path.join(tmp, "records")
    budget = os.path.join(tmp, "budget.txt")

    # The recorder: the exit code and the non-report lines come through, the report goes to a record.
    rc, out = run("record", rec, "--", sys.executable, "fake_nvcc.py", "-c", "x.cu", "-o", "obj/gelu.cu.o")
    expect(rc == 0, f"record of a good compile exits 0 (got {rc})")
    expect("warning #177-D" in out, "the compiler's warning is passed through")
    expect("ptxas info" not in out, "ptxas's report is kept out of the build log")
    files = os.listdir(rec) if os.path.isdir(rec) else []
    expect(len(files) == 1, f"one record file written (got {files})")
    text = open(os.path.join(rec, files[0])).read() if files else ""
    expect("_Z4gelu sm_80 40 16 4 8" in text, "sm_80 entry: registers, stack, spills of the entry (not the helper)")
    expect("_Z4gelu sm_90 32 0 0 0" in text, "sm_90 entry recorded separately")
    expect("_Z5adamwPf sm_90 24 0 0 0" in text, "second kernel recorded")
    expect("_ZN5triax12_GLOBAL__N_11kEv sm_90 12 0 0 0" in text,
           "nvcc's anonymous namespace (a hash of the source path) is recorded under the plain name")
    rc, _ = run("record", os.path.join(tmp, "rec2"), "--", sys.executable, "fake_nvcc.py", "--fail", "-o", "obj/b.o")
    expect(rc == 2, f"a failed compile's exit code is passed on (got {rc})")
    expect(not os.path.exists(os.path.join(tmp, "rec2")), "a failed compile writes no record")

    # No budget yet: every kernel is missing, and the message says how to regenerate.
    regen = "cmake --build BUILD --target kernel_budget_update"
    rc, out = run("check", "--records", rec, "--budget", budget, "--regen", regen)
    expect(rc == 1, "check fails without a budget")
    expect("MISSING sm_90 adamw(float*)" in out, "a missing kernel is named (demangled)")
    expect(regen in out, "the regenerate command is printed")
    rc, out = run("check", "--records", rec, "--budget", budget)
    expect(f"--budget {budget} --write" in out, "the default regenerate command is the script's --write")

    # --write, then the check passes.
    rc, out = run("check", "--records", rec, "--budget", budget, "--write")
    expect(rc == 0 and os.path.exists(budget), "--write writes the budget")
    rc, out = run("check", "--records", rec, "--budget", budget)
    expect(rc == 0 and "kernel budget: ok" in out, f"check passes on its own budget: {out}")

    # Over budget: one register fewer in the budget than the build uses.
    lines = open(budget).read().replace("_Z4gelu sm_90 32 0 0 0", "_Z4gelu sm_90 31 0 0 0")
    open(budget, "w").write(lines)
    rc, out = run("check", "--records", rec, "--budget", budget, "--regen", regen)
    expect(rc == 1, "over budget fails")
    expect("OVER BUDGET sm_90 gelu: registers 32 > budget 31" in out, f"the over-budget kernel is named: {out}")
    expect(regen in out, "the regenerate command is printed for an over-budget kernel")
    # Spill bytes over budget.
    lines = open(budget).read().replace("_Z4gelu sm_80 40 16 4 8", "_Z4gelu sm_80 40 16 0 8")
    open(budget, "w").write(lines)
    rc, out = run("check", "--records", rec, "--budget", budget)
    expect(rc == 1 and "OVER BUDGET sm_80 gelu: spill_stores 4 > budget 0" in out, "spill stores over budget fail")

    # A stale line (a kernel of a built architecture that is no longer built), and a line of an
    # architecture not built (kept, not stale).
    run("check", "--records", rec, "--budget", budget, "--write")
    with open(budget, "a") as f:
        f.write("_Z3oldv sm_90 10 0 0 0\n_Z3oldv sm_100 10 0 0 0\n")
    rc, out = run("check", "--records", rec, "--budget", budget)
    expect(rc == 1 and "STALE sm_90 old()" in out and "sm_100" not in out, f"stale line reported: {out}")
    run("check", "--records", rec, "--budget", budget, "--write")
    expect("_Z3oldv sm_100" in open(budget).read(), "--write keeps lines of architectures not built")
    expect("_Z3oldv sm_90" not in open(budget).read(), "--write drops stale lines of built architectures")

    # A record whose object is gone (its source removed) no longer counts; no records at all fails.
    os.remove(os.path.join("obj", "gelu.cu.o"))
    rc, out = run("check", "--records", rec, "--budget", budget)
    expect(rc == 1 and "no kernel resource records" in out, f"no live record: {out}")

    # A malformed budget line is named.
    run("record", rec, "--", sys.executable, "fake_nvcc.py", "-o", "obj/gelu.cu.o")
    open(budget, "w").write("_Z4gelu sm_90 many 0 0 0\n")
    rc, out = run("check", "--records", rec, "--budget", budget)
    expect(rc != 0 and "budget.txt:1" in out, f"malformed line reported: {out}")

print(f"{0 if failures else 1} passed, {1 if failures else 0} failed")
sys.exit(1 if failures else 0)
