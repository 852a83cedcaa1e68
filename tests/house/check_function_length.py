#!/usr/bin/env python3
"""The house rule "no function over ~100 lines": measures every function in src/ with lizard (the
PyPI code-metrics tool: it parses C++ functions, lambdas and strings properly; scripts/test.sh
installs it) and fails on each one longer than the limit that tests/house/long_functions.txt does
not list with a reason. An entry whose function is gone or no longer too long fails as well, so the
list never outlives what it excuses.

Usage: check_function_length.py [--root DIR] [--allow FILE] [--limit N]
exit 0: every long function is listed with its reason; 1: violations (one line each); 2: usage.
"""
import argparse
import os
import sys

SOURCE = (".cpp", ".cc", ".h", ".hpp")


def load_allow(path):
    """Entries `src/file.cpp  qualified::name  reason...`; '#' starts a comment line."""
    allow, problems = {}, []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split(None, 2)
            if len(parts) < 3 or len(parts[2].split()) < 3:
                problems.append(f"{path}:{n}: an entry needs a file, a function and a reason of a few words: '{line}'")
                continue
            allow[(parts[0], parts[1])] = (n, parts[2])
    return allow, problems


def measure(root):
    """(relative path, qualified name, first line, length in lines) of every function under src/."""
    import lizard  # imported here so that a missing tool gives the message below, not a traceback

    out = []
    src = os.path.join(root, "src")
    for dirpath, dirnames, files in os.walk(src):
        dirnames.sort()
        for name in sorted(files):
            if not name.endswith(SOURCE):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            for fn in lizard.analyze_file(path).function_list:
                out.append((rel, fn.name, fn.start_line, fn.length))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--root", default=os.path.normpath(os.path.join(here, "..", "..")))
    ap.add_argument("--allow", default=os.path.join(here, "long_functions.txt"))
    ap.add_argument("--limit", type=int, default=100)
    args = ap.parse_args()
    try:
        import lizard  # noqa: F401
    except ImportError:
        print("check_function_length: the 'lizard' Python package is missing: "
              "python3 -m pip install lizard==1.24.3 (scripts/test.sh does)")
        return 2

    allow, problems = load_allow(args.allow)
    seen = set()
    for rel, name, line, length in measure(args.root):
        if length <= args.limit:
            continue
        key = (rel, name)
        if key in allow:
            seen.add(key)
            continue
        problems.append(f"{rel}:{line}: {name} is {length} lines (limit {args.limit}): split it along its "
                        f"sections, or list it in {os.path.basename(args.allow)} with the reason it must stay whole")
    for key, (n, _) in sorted(allow.items(), key=lambda kv: kv[1][0]):
        if key not in seen:
            problems.append(f"{args.allow}:{n}: {key[1]} in {key[0]} is no longer over {args.limit} lines "
                            "(or no longer exists): remove its entry")
    for p in problems:
        print(p)
    if problems:
        return 1
    print(f"every function in src/ is at most {args.limit} lines, or listed with its reason ({len(seen)} listed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
