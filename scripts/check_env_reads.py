#!/usr/bin/env python3
"""Every environment variable goes through core/env.h: no file of the library, its programs or
its benchmarks calls getenv / secure_getenv or touches environ, except src/core/env.cpp (the one
reader, with the one set of parsing rules; docs/ENVIRONMENT.md lists the variables).

Usage: check_env_reads.py [--root DIR]   exit 0 when the only reader is env.cpp, 1 otherwise.
"""
import os
import re
import sys

import source_scan

TOPS = ("src", "include", "examples", "benchmarks", "kernels")
ALLOWED = {os.path.join("src", "core", "env.cpp")}
# getenv(...), std::getenv (...), ::secure_getenv(...), and the environ array itself.
READ = re.compile(r"\b(?:secure_getenv|getenv)\s*\(|\b(?:__)?environ\b")


def check(root):
    return [f"{rel}:{lineno}: reads the environment directly ({m.group(0).rstrip('( ')}); "
            "use core/env.h (env_int, env_seconds, env_flag, ...)"
            for rel, lineno, m in source_scan.matches(root, TOPS, ALLOWED, READ)]


if __name__ == "__main__":
    sys.exit(source_scan.run(__doc__, check, "{n} direct environment read(s) outside src/core/env.cpp",
                             "every environment read goes through core/env.h"))
