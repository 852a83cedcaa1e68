"""Reads an all-float32 safetensors file (triax's exports) into numpy arrays, for the Python checks
(scripts/hf_export_check.py, benchmarks/torch_compare.py). Debian 12 packages no `safetensors`
module, so the format is read here once: 8-byte little-endian header length, a JSON header
(name -> dtype, shape, data_offsets; optional __metadata__), then the raw tensor bytes."""
import json
import struct


def read_f32(path):
    """(name -> numpy float32 array, metadata dict); SystemExit naming the tensor if one is not F32
    or the file is shorter than its header says."""
    import numpy as np
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise SystemExit(f"{path}: not a safetensors file ({len(head)} bytes)")
        n = struct.unpack("<Q", head)[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {})
    out = {}
    for name, e in header.items():
        if e["dtype"] != "F32":
            raise SystemExit(f"{path}: {name} has dtype {e['dtype']}, expected F32")
        b, end = e["data_offsets"]
        if end > len(data):
            raise SystemExit(f"{path}: {name} ends at byte {end} of a {len(data)}-byte data section")
        out[name] = np.frombuffer(data[b:end], dtype="<f4").reshape(e["shape"]).copy()
    return out, meta
