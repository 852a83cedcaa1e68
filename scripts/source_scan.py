"""The source scan that the house checks share (check_env_reads.py, check_cuda_alloc.py): every
line of the C++/CUDA sources under some top folders, with string literals and // comments blanked,
matched against one pattern; and the command line around such a check."""
import argparse
import os
import re

SOURCE = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh")
LINE_COMMENT = re.compile(r"//.*$")
STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


def matches(root, tops, allowed, pattern):
    """(relative path, line number, match) of every code match, files in a fixed order; the
    relative paths in `allowed` are skipped."""
    for top in tops:
        for dirpath, dirnames, files in os.walk(os.path.join(root, top)):
            dirnames.sort()
            for name in sorted(files):
                if not name.endswith(SOURCE):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root)
                if rel in allowed:
                    continue
                with open(path, errors="replace") as f:
                    for lineno, line in enumerate(f, 1):
                        m = pattern.search(LINE_COMMENT.sub("", STRING.sub('""', line)))
                        if m:
                            yield rel, lineno, m


def run(doc, check, failed, passed):
    """main() of a check: --root (default: the project), print each problem, then `failed` (with
    {n}) and exit 1, or `passed` and exit 0."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    problems = check(os.path.abspath(ap.parse_args().root))
    for p in problems:
        print(p)
    print(failed.format(n=len(problems)) if problems else passed)
    return 1 if problems else 0
