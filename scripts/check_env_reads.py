#!/usr/bin/env python3
"""Every environment variable goes through core/env.h: no file of the library, its programs or
its benchmarks calls getenv / secure_getenv or touches environ, except src/core/env.cpp (the one
reader, with the one set of parsing rules; docs/ENVIRONMENT.md lists the variables).

Usage: check_env_reads.py [--root DIR]   exit 0 when the only reader is env.cpp, 1 otherwise.
"""
import argparse
import os
import re
import sys

TOPS = ("src", "include", "examples", "benchmarks", "kernels")
ALLOWED = {os.path.join("src", "core", "env.cpp")}
SOURCE = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh")
# getenv(...), std::getenv (...), ::secure_getenv(...), and the environ array itself.
READ = re.compile(r"\b(?:secure_getenv|getenv)\s*\(|\b(?:__)?environ\b")
LINE_COMMENT = re.compile(r"//.*$")
STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


def check(root):
    problems = []
    for top in TOPS:
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
                if not name.endswith(SOURCE):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root)
                if rel in ALLOWED:
                    continue
                with open(path, errors="replace") as f:
                    for lineno, line in enumerate(f, 1):
                        code = LINE_COMMENT.sub("", STRING.sub('""', line))
                        m = READ.search(code)
                        if m:
                            what = m.group(0).rstrip("( ")
                            problems.append(f"{rel}:{lineno}: reads the environment directly ({what}); "
                                            "use core/env.h (env_int, env_seconds, env_flag, ...)")
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    args = ap.parse_args()
    problems = check(os.path.abspath(args.root))
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} direct environment read(s) outside src/core/env.cpp")
        return 1
    print("every environment read goes through core/env.h")
    return 0


if __name__ == "__main__":
    sys.exit(main())
