"""What the HF cross-checks share (scripts/hf_check.py, hf_llama_check.py; hf_export_check.py
through hf_check.py).

Importing it exits 77 (ctest: skipped) where torch or numpy is not importable. Then: the options
both checks take, the work directory, the random llm.c token shard, the batches and mean loss as
llm.c and gpt_eval read the shard, safetensors written by hand (Debian packages no `safetensors`),
and gpt_eval's loss under mpirun.
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:  # pragma: no cover
    print(f"skip: torch/numpy not importable by {sys.executable} ({e}); Debian: apt-get install python3-torch")
    sys.exit(77)


def arg_parser(doc, programs, np_default):
    """The programs (positional, in order), --mpirun, --np (comma-separated), --seed, --workdir."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    for p in programs:
        ap.add_argument(p)
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--np", default=np_default)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--workdir", default=None, help="keep the files here (default: a temporary directory)")
    return ap


def workdir(args):
    """(handle, path): --workdir, or a temporary directory that lives as long as the handle."""
    tmp = tempfile.TemporaryDirectory() if args.workdir is None else None
    wd = args.workdir or tmp.name
    os.makedirs(wd, exist_ok=True)
    return tmp, wd


def random_tokens(seed, vocab, b, t, k):
    """Random tokens for k batches of b x t and the last target, and a few spare."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (k * b * t + 1 + 13,), generator=g)


def write_tokens(path, tokens):
    """An llm.c token shard: a 256-int32 header (magic 20240520, version 1, count), uint16 tokens."""
    header = struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253))
    with open(path, "wb") as f:
        f.write(header)
        f.write(tokens.to(torch.int32).numpy().astype("<u2").tobytes())


def batch(tokens, k, b, t):
    """Batch k as llm.c reads it: inputs tokens[k*b*t : (k+1)*b*t] as (b, t), targets shifted by one."""
    s = k * b * t
    return tokens[s:s + b * t].view(b, t), tokens[s + 1:s + b * t + 1].view(b, t)


def mean_loss(logits_fn, tokens, b, t, k, vocab):
    """The mean over batches 0..k-1 of the mean cross-entropy of logits_fn(inputs), in float64."""
    total = 0.0
    for i in range(k):
        x, y = batch(tokens, i, b, t)
        total += F.cross_entropy(logits_fn(x).reshape(-1, vocab).double(), y.reshape(-1)).item()
    return total / k


def write_safetensors(path, tensors, dtype, metadata=None):
    """The format by hand: 8-byte header length, JSON header, raw little-endian data; every tensor
    as dtype "F32" or "BF16" (rounded to nearest even); metadata defaults to {"format": "pt"}."""
    header, blobs, off = {"__metadata__": metadata or {"format": "pt"}}, [], 0
    for name, t in tensors.items():
        a = t.detach().to(torch.float32).contiguous().numpy()
        if dtype == "BF16":
            u = a.view(np.uint32).astype(np.uint64)
            b = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2").tobytes()
        else:
            b = a.astype("<f4").tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def mpi_env():
    """Open MPI as root on one host over shared memory, one thread per rank (what the caller's
    environment sets already wins)."""
    env = dict(os.environ)
    for k, v in {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_pml": "ob1",
                 "OMPI_MCA_btl": "self,vader", "OMPI_MCA_btl_vader_single_copy_mechanism": "none",
                 "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}.items():
        env.setdefault(k, v)
    return env


def run(cmd, what, timeout=600):
    """Runs cmd in mpi_env(); exits 1, printing its command line and output, unless it succeeds."""
    p = subprocess.run(cmd, env=mpi_env(), capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        print(f"FAILED ({what}): {' '.join(cmd)}\nexit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
        sys.exit(1)
    return p


def gpt_eval_loss(args, np_, weights, data, b, t, k, extra=(), tp=None):
    """gpt_eval's mean loss over k batches of b x t at np ranks (tp = np unless given); exits 1
    when it fails or prints no final 'loss' line."""
    cmd = [args.mpirun, "-np", str(np_), "--oversubscribe", args.gpt_eval, "--tp", str(tp or np_), "--weights", weights,
           "--data", data, "--batch", str(b), "--seq", str(t), "--batches", str(k)] + list(extra)
    p = run(cmd, "gpt_eval")
    last = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
    if not last.startswith("loss "):
        print(f"FAILED: no 'loss' line from {' '.join(cmd)}\n{p.stdout}\n{p.stderr}")
        sys.exit(1)
    return float(last.split()[1])
