#!/usr/bin/env python3
"""Per-kernel register and spill budget of the CUDA kernels (kernels/*.cu).

Two commands:

  record DIR -- COMPILER ARGS...
      The CUDA compiler launcher of the triax target (cmake/TriaxCuda.cmake). Runs the compile,
      keeps ptxas's per-kernel report (nvcc -Xptxas=-v: registers, stack frame, spill stores and
      loads, one report per SM architecture) in DIR/<object>.txt and passes every other line of the
      compiler's output through. The CUDA toolkit here has no cuobjdump, and a cubin does not say
      how many bytes were spilled: ptxas's report is the one source of all four numbers, and a
      record is written by the very compile that made the object, so it is never stale.

  check --records DIR --budget FILE [--write] [--regen CMD]
      Compares the records with the budget file (kernel, arch, registers, stack, spill stores,
      spill loads). Fails (exit 1) when a kernel uses more registers, stack or spill bytes than its
      budget, when a built kernel has no budget line, or when a budget line names a kernel of a
      built architecture that no longer exists; prints the command that regenerates the budget.
      --write rewrites the budget from the records (lines of architectures not built are kept).
"""
import argparse
import os
import re
import shutil
import subprocess
import sys

FIELDS = ("registers", "stack", "spill_stores", "spill_loads")
RE_ENTRY = re.compile(r"ptxas info\s*: Compiling entry function '([^']+)' for '(sm_\w+)'")
RE_PROPS = re.compile(r"ptxas info\s*: Function properties for (\S+)")
RE_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
RE_USED = re.compile(r"ptxas info\s*: Used (\d+) registers")
RE_INFO = re.compile(r"^ptxas info\s*:")


RE_ANON = re.compile(r"(\d+)_GLOBAL__N_")


def canonical_name(mangled):
    """The kernel's mangled name with nvcc's anonymous-namespace names, which carry a hash of the
    source path and differ between build trees, replaced by the plain one (_GLOBAL__N_1)."""
    out, pos = [], 0
    for m in RE_ANON.finditer(mangled):
        if m.start() < pos:
            continue
        length = int(m.group(1))
        out.append(mangled[pos:m.start()] + "12_GLOBAL__N_1")
        pos = m.start() + len(m.group(1)) + length
    return "".join(out) + mangled[pos:]


def parse_ptxas(text):
    """(kernel, arch) -> {registers, stack, spill_stores, spill_loads} from ptxas -v output, and
    the lines that are not part of the report."""
    usage, others = {}, []
    entry = None  # (kernel, arch) being compiled
    props_for = None  # the function whose properties line comes next
    for line in text.splitlines():
        m = RE_ENTRY.search(line)
        if m:
            entry = (canonical_name(m.group(1)), m.group(2))
            usage[entry] = dict.fromkeys(FIELDS, 0)
            props_for = None
            continue
        m = RE_PROPS.search(line)
        if m:
            props_for = m.group(1)
            continue
        m = RE_STACK.search(line)
        if m and props_for is not None:
            if entry and canonical_name(props_for) == entry[0]:
                usage[entry].update(stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
            props_for = None
            continue
        m = RE_USED.search(line)
        if m and entry:
            usage[entry]["registers"] = int(m.group(1))
            continue
        if RE_INFO.search(line):
            continue
        others.append(line)
    return usage, others


def object_of(args):
    for i, a in enumerate(args):
        if a == "-o" and i + 1 < len(args):
            return args[i + 1]
        if a.startswith("-o") and len(a) > 2 and not a.startswith("--"):
            return a[2:]
    return None


def record_name(obj):
    return re.sub(r"[^A-Za-z0-9_.-]", "_", obj.strip("./")) + ".txt"


def cmd_record(record_dir, command):
    proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    usage, out_lines = parse_ptxas(proc.stdout)
    err_usage, err_lines = parse_ptxas(proc.stderr)
    usage.update(err_usage)
    if out_lines:
        sys.stdout.write("\n".join(out_lines) + "\n")
    if err_lines:
        sys.stderr.write("\n".join(err_lines) + "\n")
    obj = object_of(command)
    if proc.returncode == 0 and obj:
        os.makedirs(record_dir, exist_ok=True)
        path = os.path.join(record_dir, record_name(obj))
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"# object: {os.path.abspath(obj)}\n")
            for (kernel, arch), u in sorted(usage.items()):
                f.write(f"{kernel} {arch} " + " ".join(str(u[k]) for k in FIELDS) + "\n")
        os.replace(tmp, path)
    return proc.returncode


def read_table(path, is_record=False):
    """(kernel, arch) -> usage dict from a record or budget file; None for a record whose object is gone."""
    table = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if is_record and line.startswith("# object: "):
                if not os.path.exists(line[len("# object: "):].strip()):
                    return None  # the source was removed: its kernels are no longer built
                continue
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            if len(parts) != 2 + len(FIELDS) or not all(p.isdigit() for p in parts[2:]):
                sys.exit(f"{path}:{n}: expected 'kernel arch {' '.join(FIELDS)}', got: {line}")
            table[(parts[0], parts[1])] = dict(zip(FIELDS, map(int, parts[2:])))
    return table


def read_records(record_dir):
    usage = {}
    if os.path.isdir(record_dir):
        for name in sorted(os.listdir(record_dir)):
            if name.endswith(".txt"):
                t = read_table(os.path.join(record_dir, name), is_record=True)
                if t:
                    usage.update(t)
    return usage


def demangle(names):
    names = list(names)
    tool = shutil.which("c++filt")
    if not tool or not names:
        return {n: n for n in names}
    out = subprocess.run([tool], input="\n".join(names), stdout=subprocess.PIPE, text=True).stdout.splitlines()
    return dict(zip(names, out)) if len(out) == len(names) else {n: n for n in names}


def write_budget(path, records, budget):
    built_archs = {a for _, a in records}
    kept = {k: v for k, v in budget.items() if k[1] not in built_archs}
    table = {**kept, **records}
    pretty = demangle(sorted({k for k, _ in table}))
    with open(path, "w") as f:
        f.write("# Per-kernel resource budget of kernels/*.cu, checked by the test cuda.kernel_budget\n"
                "# (scripts/kernel_budget.py): kernel (mangled) arch " + " ".join(FIELDS) + " (bytes but registers).\n"
                "# Regenerate after reviewing a change: cmake --build <build> --target kernel_budget_update\n")
        for (kernel, arch), u in sorted(table.items(), key=lambda kv: (pretty[kv[0][0]], kv[0][1])):
            f.write(f"{kernel} {arch} " + " ".join(str(u[k]) for k in FIELDS) + f"  # {pretty[kernel]}\n")
    print(f"kernel budget: wrote {len(table)} entries to {path}")


def cmd_check(args):
    records = read_records(args.records)
    if not records:
        print(f"FAIL: no kernel resource records in {args.records}: build the triax target with CUDA first "
              "(its compiles write them through scripts/kernel_budget.py record)")
        return 1
    budget = read_table(args.budget) if os.path.exists(args.budget) else {}
    if args.write:
        write_budget(args.budget, records, budget)
        return 0
    built_archs = {a for _, a in records}
    pretty = demangle({k for k, _ in records} | {k for k, a in budget if a in built_archs})
    over, missing, stale, under = [], [], [], 0
    for key in sorted(records, key=lambda k: (pretty[k[0]], k[1])):
        u, b = records[key], budget.get(key)
        if b is None:
            missing.append(f"  MISSING {key[1]} {pretty[key[0]]}: no line in the budget "
                           f"(uses {u['registers']} registers, {u['spill_stores']} B spill stores)")
            continue
        for field in FIELDS:
            if u[field] > b[field]:
                over.append(f"  OVER BUDGET {key[1]} {pretty[key[0]]}: {field} {u[field]} > budget {b[field]}")
        under += any(u[f] < b[f] for f in FIELDS)
    for key in sorted(budget):
        if key[1] in built_archs and key not in records:
            stale.append(f"  STALE {key[1]} {pretty[key[0]]}: in the budget but not built")
    print(f"kernel budget: {len(records)} kernel/arch pairs built ({', '.join(sorted(built_archs))}), "
          f"{len(budget)} budget lines in {args.budget}")
    for line in over + missing + stale:
        print(line)
    if under:
        print(f"note: {under} kernel/arch pairs use less than their budget (regenerating would lower it)")
    if over or missing or stale:
        print(f"FAIL: {len(over)} over budget, {len(missing)} missing from the budget, {len(stale)} stale. "
              "Review the numbers (ptxas -v); to accept them, regenerate the budget with:\n"
              f"    {args.regen or regen_command(args)}")
        return 1
    print("kernel budget: ok")
    return 0


def regen_command(args):
    return (f"python3 {os.path.abspath(__file__)} check --records {args.records} "
            f"--budget {args.budget} --write")


def main(argv):
    if len(argv) >= 2 and argv[0] == "record":
        if "--" not in argv:
            sys.exit("usage: kernel_budget.py record DIR -- COMPILER ARGS...")
        sep = argv.index("--")
        return cmd_record(argv[1], argv[sep + 1:])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="compare the records with the budget")
    c.add_argument("--records", required=True, help="the record directory (<build>/kernel_resources)")
    c.add_argument("--budget", required=True, help="the budget file (tests/cuda/kernel_budget.txt)")
    c.add_argument("--write", action="store_true", help="rewrite the budget from the records")
    c.add_argument("--regen", help="the regenerate command to print on failure")
    args = p.parse_args(argv)
    return cmd_check(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
