#!/usr/bin/python3
"""Independent numpy readers/writers of the weight and data files triax uses, for cross-checks.

  safetensors (HF), llm.c GPT-2 checkpoints (magic 20240326, v3 fp32 / v5 bf16), llm.c token
  shards (magic 20240520). Only numpy (Debian: python3-numpy, run with /usr/bin/python3).

  hf_reference.py list FILE            names, dtypes, shapes and a checksum of every tensor
  hf_reference.py write-test FILE      writes a safetensors file whose values follow a formula
  hf_reference.py check-test FILE      checks a file written by write-test (or by triax)
  hf_reference.py official FILE        compares this reader with the `safetensors` package (pip), if installed
  hf_reference.py official-write FILE  writes the write-test tensors but b.bf16 with the `safetensors` package
"""
import json
import struct
import sys

import numpy as np

ST_DTYPES = {
    "BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "I16": np.int16, "U16": np.uint16,
    "F16": np.float16, "I32": np.int32, "U32": np.uint32, "F32": np.float32, "F64": np.float64,
    "I64": np.int64, "U64": np.uint64, "BF16": "bf16",
}


def _bf16_to_f32(raw):
    return (raw.astype(np.uint32) << 16).view(np.float32)


def _f32_to_bf16(x):
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16  # round to nearest even (finite values)
    return r.astype(np.uint16)


def load_safetensors(path):
    """Returns (tensors: dict name -> np.ndarray (bf16 converted to float32), metadata dict)."""
    with open(path, "rb") as f:
        buf = f.read()
    if len(buf) < 8:
        raise ValueError(f"{path}: shorter than 8 bytes")
    (n,) = struct.unpack("<Q", buf[:8])
    if n > 100_000_000 or n > len(buf) - 8:
        raise ValueError(f"{path}: bad header length {n}")
    header = json.loads(buf[8:8 + n].decode("utf-8"))
    data = memoryview(buf)[8 + n:]
    meta = header.pop("__metadata__", {})
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        dt = ST_DTYPES[e["dtype"]]
        shape = tuple(e["shape"])
        raw = data[b:end]
        if dt == "bf16":
            arr = _bf16_to_f32(np.frombuffer(raw, dtype="<u2"))
        else:
            arr = np.frombuffer(raw, dtype=np.dtype(dt).newbyteorder("<"))
        if arr.size != int(np.prod(shape, dtype=np.int64)):
            raise ValueError(f"{path}: tensor {name}: {arr.size} elements for shape {shape}")
        out[name] = arr.reshape(shape)
    return out, meta


def save_safetensors(path, tensors, metadata=None, dtypes=None):
    """tensors: dict name -> array (written in insertion order); dtypes: optional name -> 'F32'|'BF16'|'F16'|'F64'."""
    dtypes = dtypes or {}
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, arr in tensors.items():
        dt = dtypes.get(name, "F32")
        a = np.asarray(arr)
        if dt == "BF16":
            b = _f32_to_bf16(a).astype("<u2").tobytes()
        else:
            b = np.ascontiguousarray(a, dtype=np.dtype(ST_DTYPES[dt]).newbyteorder("<")).tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)


LLMC_NAMES = ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
              "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"]


def llmc_shapes(maxT, V, L, NH, C, Vp):
    return [(Vp, C), (maxT, C), (L, C), (L, C), (L, 3 * C, C), (L, 3 * C), (L, C, C), (L, C),
            (L, C), (L, C), (L, 4 * C, C), (L, 4 * C), (L, C, 4 * C), (L, C), (C,), (C,)]


def load_llmc_gpt2(path):
    """Returns (config dict, dict name -> float32 array) of an llm.c checkpoint (version 3 or 5)."""
    with open(path, "rb") as f:
        buf = f.read()
    h = np.frombuffer(buf[:1024], dtype="<i4")
    if h[0] != 20240326 or h[1] not in (3, 5):
        raise ValueError(f"{path}: bad magic {h[0]} or version {h[1]}")
    maxT, V, L, NH, C, Vp = (int(x) for x in h[2:8])
    cfg = dict(max_seq_len=maxT, vocab_size=V, num_layers=L, num_heads=NH, channels=C, padded_vocab_size=Vp)
    es = 4 if h[1] == 3 else 2
    off, out = 1024, {}
    for name, shape in zip(LLMC_NAMES, llmc_shapes(maxT, V, L, NH, C, Vp)):
        n = int(np.prod(shape))
        raw = buf[off:off + n * es]
        a = np.frombuffer(raw, dtype="<f4") if es == 4 else _bf16_to_f32(np.frombuffer(raw, dtype="<u2"))
        out[name] = a.reshape(shape)
        off += n * es
    if off != len(buf):
        raise ValueError(f"{path}: {len(buf)} bytes, expected {off}")
    return cfg, out


def load_tokens(path):
    with open(path, "rb") as f:
        buf = f.read()
    h = np.frombuffer(buf[:1024], dtype="<i4")
    if h[0] != 20240520 or h[1] != 1 or len(buf) != 1024 + 2 * int(h[2]):
        raise ValueError(f"{path}: bad token shard header {h[:3]}")
    return np.frombuffer(buf[1024:], dtype="<u2")


def test_tensors():
    """Values exact in every dtype used: small multiples of 1/8 (exact in bf16 and f16 too)."""
    a = (np.arange(6 * 5, dtype=np.float32).reshape(6, 5) - 11) / 8
    b = (np.arange(3 * 4 * 2, dtype=np.float32).reshape(3, 4, 2) - 7) / 4
    return {"a.weight": a, "b.bf16": b, "c.f16": a[:2] * 2, "d.f64": a[:, 0].astype(np.float64)}, \
        {"b.bf16": "BF16", "c.f16": "F16", "d.f64": "F64"}


def main(argv):
    if len(argv) != 3:
        print(__doc__)
        return 2
    cmd, path = argv[1], argv[2]
    if cmd == "list":
        if path.endswith(".safetensors"):
            tensors, meta = load_safetensors(path)
            print("metadata", meta)
        else:
            cfg, tensors = load_llmc_gpt2(path)
            print("config", cfg)
        for k, v in tensors.items():
            print(f"{k} {v.dtype} {list(v.shape)} sum={float(np.sum(v, dtype=np.float64)):.9g}")
        return 0
    if cmd == "write-test":
        t, dts = test_tensors()
        save_safetensors(path, t, {"writer": "hf_reference.py"}, dts)
        return 0
    if cmd == "check-test":
        t, _ = test_tensors()
        got, _ = load_safetensors(path)
        for k, v in t.items():
            if k not in got or got[k].shape != v.shape or not np.array_equal(got[k].astype(np.float64), v.astype(np.float64)):
                print(f"MISMATCH {k}")
                return 1
        print(f"ok: {len(t)} tensors")
        return 0
    if cmd == "official":
        # the reference implementation (pip: safetensors) validates the header when opening
        from safetensors import safe_open
        mine, meta = load_safetensors(path)
        with safe_open(path, framework="numpy") as f:
            assert set(f.keys()) == set(mine), (set(f.keys()), set(mine))
            assert (f.metadata() or {}) == meta, (f.metadata(), meta)
            for k in f.keys():
                sl = f.get_slice(k)
                assert tuple(sl.get_shape()) == mine[k].shape, k
                if sl.get_dtype() != "BF16":  # numpy has no bfloat16
                    assert np.array_equal(f.get_tensor(k), mine[k]), k
        print(f"ok: {len(mine)} tensors agree with the safetensors package")
        return 0
    if cmd == "official-write":
        from safetensors.numpy import save_file
        t, _ = test_tensors()
        t.pop("b.bf16")
        save_file(t, path, metadata={"writer": "safetensors"})
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
