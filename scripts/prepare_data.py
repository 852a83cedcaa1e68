#!/usr/bin/env python3
"""Text files -> token data triax trains on (docs/DATA.md).

Each input file is one document (or, with --jsonl KEY, each JSON line's KEY). Documents are
tokenised, assigned to train or validation by a seeded hash (--val-fraction), and written as
  llm.c shards   DIR/NAME_train_000000.bin ...  DIR/NAME_val_000000.bin    (--format llmc)
  Megatron       DIR/NAME_train_text_document.{bin,idx}  DIR/NAME_val_...  (--format megatron)
Tokenisers: byte (the default, needs nothing: vocab 256, no end-of-text token), tiktoken:ENC
(e.g. tiktoken:gpt2; llm.c's convention of an end-of-text token before each document) or
hf:PATH (a Hugging Face tokenizers tokenizer.json). Python standard library only, beyond the
tokeniser the user chose. The last line of stdout is a JSON summary. Progress goes to stderr:
tqdm's bar where tqdm is importable, otherwise a line every --progress-interval seconds (bytes
read, tokens, tokens/s, ETA from the input's size), and a last line with the totals.

  scripts/prepare_data.py corpus/*.txt --out-dir data --name tiny --format megatron
  train_gpt --data data/tiny_train_text_document --valid-data data/tiny_val_text_document ...
"""
import argparse
import array
import hashlib
import json
import os
import struct
import sys
import time

LLMC_MAGIC, LLMC_VERSION, LLMC_HEADER_INTS = 20240520, 1, 256
MEGATRON_MAGIC = b"MMIDIDX\x00\x00"
MEGATRON_UINT16, MEGATRON_INT32 = 8, 4


def fail(msg):
    print(f"prepare_data: error: {msg}", file=sys.stderr)
    sys.exit(2)


class ByteTokenizer:
    name, vocab, eot = "byte", 256, None

    def encode(self, text):
        return list(text.encode("utf-8"))


class TiktokenTokenizer:
    def __init__(self, enc):
        try:
            import tiktoken
        except ImportError:
            fail(f"--tokenizer tiktoken:{enc} needs the tiktoken package (pip install tiktoken), "
                 "or use --tokenizer byte")
        self.enc = tiktoken.get_encoding(enc)
        self.name, self.vocab, self.eot = f"tiktoken:{enc}", self.enc.n_vocab, self.enc.eot_token

    def encode(self, text):
        return self.enc.encode_ordinary(text)


class HfTokenizer:
    def __init__(self, path):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            fail(f"--tokenizer hf:{path} needs the tokenizers package (pip install tokenizers), "
                 "or use --tokenizer byte")
        if not os.path.exists(path):
            fail(f"{path}: no such tokenizer file")
        self.tok = Tokenizer.from_file(path)
        self.name, self.vocab, self.eot = f"hf:{path}", self.tok.get_vocab_size(), None

    def encode(self, text):
        return self.tok.encode(text, add_special_tokens=False).ids


def make_tokenizer(spec):
    if spec == "byte":
        return ByteTokenizer()
    if spec.startswith("tiktoken:"):
        return TiktokenTokenizer(spec.split(":", 1)[1])
    if spec.startswith("hf:"):
        return HfTokenizer(spec.split(":", 1)[1])
    fail(f"unknown --tokenizer '{spec}' (byte, tiktoken:ENCODING or hf:PATH/tokenizer.json)")


def hms(seconds):
    s = int(round(max(0.0, seconds)))
    return f"{s // 3600}:{s // 60 % 60:02}:{s % 60:02}"


class Progress:
    """Bytes of input read and tokens made, on stderr: tqdm's bar (mode tqdm), a plain line every
    `interval` seconds (mode plain), or nothing (none); plain and tqdm end with a totals line."""

    def __init__(self, total_bytes, mode, interval):
        self.total, self.mode, self.interval = max(1, total_bytes), mode, interval
        self.t0 = self.last = time.monotonic()
        self.done = self.tokens = 0
        self.bar = None
        if mode == "tqdm":
            try:
                from tqdm import tqdm
            except ImportError:
                fail("--progress tqdm: the tqdm module is not importable (pip install tqdm, or --progress plain)")
            self.bar = tqdm(total=total_bytes, unit="B", unit_scale=True, file=sys.stderr, desc="prepare_data")

    def rate(self, now):
        return self.tokens / max(now - self.t0, 1e-9)

    def update(self, nbytes, ntokens):
        self.done += nbytes
        self.tokens += ntokens
        now = time.monotonic()
        if self.bar is not None:
            self.bar.update(nbytes)
            self.bar.set_postfix_str(f"{self.tokens} tokens, {self.rate(now):,.0f} tokens/s", refresh=False)
        elif self.mode == "plain" and now - self.last >= self.interval:
            self.last = now
            eta = (now - self.t0) * (self.total - self.done) / max(self.done, 1)
            print(f"prepare_data: {100.0 * self.done / self.total:5.1f}% of {self.total / 2**20:.2f} MiB read | "
                  f"tokens: {self.tokens} | tokens/s: {self.rate(now):.0f} | ETA: {hms(eta)}", file=sys.stderr, flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()
        if self.mode != "none":
            now = time.monotonic()
            print(f"prepare_data: done: {self.done / 2**20:.2f} MiB read, {self.tokens} tokens in {now - self.t0:.1f} s "
                  f"(tokens/s: {self.rate(now):.0f})", file=sys.stderr, flush=True)


def progress_mode(choice):
    if choice != "auto":
        return choice
    try:
        import tqdm  # noqa: F401
        return "tqdm"
    except ImportError:
        return "plain"


def input_bytes(paths):
    total = 0
    for path in paths:
        try:
            total += os.path.getsize(path)
        except OSError as e:
            fail(f"{path}: cannot read: {e.strerror}")
    return total


def documents(paths, jsonl_key):
    """(where, text, bytes of input it took) of every document."""
    for path in paths:
        try:
            with open(path, "r", encoding="utf-8", errors="replace") as f:
                if jsonl_key is None:
                    yield path, f.read(), os.path.getsize(path)
                    continue
                for lineno, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        obj = json.loads(line)
                    except json.JSONDecodeError as e:
                        fail(f"{path}:{lineno}: not a JSON line ({e})")
                    if jsonl_key not in obj:
                        fail(f"{path}:{lineno}: no key '{jsonl_key}'")
                    yield f"{path}:{lineno}", obj[jsonl_key], len(line.encode("utf-8", "replace"))
        except OSError as e:
            fail(f"{path}: cannot read: {e.strerror}")


def is_validation(index, seed, fraction):
    h = hashlib.sha256(f"{seed}:{index}".encode()).digest()
    return int.from_bytes(h[:8], "little") / 2**64 < fraction


class LlmcWriter:
    """Shards of at most shard_tokens uint16 tokens; the header's count is patched on close."""

    def __init__(self, stem, shard_tokens):
        self.stem, self.shard_tokens, self.files, self.f, self.count = stem, shard_tokens, [], None, 0

    def _open(self):
        path = f"{self.stem}_{len(self.files):06d}.bin"
        self.files.append(path)
        self.f = open(path + ".tmp", "wb")
        self.f.write(b"\0" * (4 * LLMC_HEADER_INTS))
        self.count = 0

    def _close(self):
        header = array.array("i", [0] * LLMC_HEADER_INTS)
        header[0], header[1], header[2] = LLMC_MAGIC, LLMC_VERSION, self.count
        self.f.seek(0)
        self.f.write(header.tobytes())
        self.f.close()
        os.replace(self.files[-1] + ".tmp", self.files[-1])
        self.f = None

    def add(self, tokens):
        while tokens:
            if self.f is None:
                self._open()
            take = tokens[: self.shard_tokens - self.count]
            self.f.write(array.array("H", take).tobytes())
            self.count += len(take)
            tokens = tokens[len(take):]
            if self.count == self.shard_tokens:
                self._close()

    def close(self):
        if self.f is not None:
            self._close()
        return self.files


class MegatronWriter:
    """PREFIX.bin (tokens back to back) and PREFIX.idx in Megatron-LM's MMIDIDX layout."""

    def __init__(self, prefix, vocab):
        self.prefix = prefix
        self.code = MEGATRON_UINT16 if vocab <= 65536 else MEGATRON_INT32
        self.typecode = "H" if self.code == MEGATRON_UINT16 else "i"
        self.bin = open(prefix + ".bin.tmp", "wb")
        self.lengths = array.array("i")

    def add(self, tokens):
        if tokens:
            self.bin.write(array.array(self.typecode, tokens).tobytes())
            self.lengths.append(len(tokens))

    def close(self):
        self.bin.close()
        size = 2 if self.code == MEGATRON_UINT16 else 4
        pointers, at = array.array("q"), 0
        for n in self.lengths:
            pointers.append(at)
            at += n * size
        docs = array.array("q", range(len(self.lengths) + 1))  # one sequence per document
        with open(self.prefix + ".idx.tmp", "wb") as f:
            f.write(MEGATRON_MAGIC)
            f.write(struct.pack("<Q", 1))
            f.write(struct.pack("<B", self.code))
            f.write(struct.pack("<Q", len(self.lengths)))
            f.write(struct.pack("<Q", len(docs)))
            f.write(self.lengths.tobytes())
            f.write(pointers.tobytes())
            f.write(docs.tobytes())
        os.replace(self.prefix + ".bin.tmp", self.prefix + ".bin")
        os.replace(self.prefix + ".idx.tmp", self.prefix + ".idx")
        return [self.prefix + ".bin", self.prefix + ".idx"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", nargs="+", help="text files (one document each) or JSON-lines files with --jsonl")
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--name", default="data", help="file name prefix")
    ap.add_argument("--format", choices=["llmc", "megatron"], default="llmc")
    ap.add_argument("--tokenizer", default="byte", help="byte | tiktoken:ENCODING | hf:PATH/tokenizer.json")
    ap.add_argument("--jsonl", metavar="KEY", help="inputs are JSON lines; the document is field KEY")
    ap.add_argument("--val-fraction", type=float, default=0.1, help="share of documents held out")
    ap.add_argument("--seed", type=int, default=1234, help="seed of the train/validation assignment")
    ap.add_argument("--shard-tokens", type=int, default=100_000_000, help="llm.c: tokens per shard")
    ap.add_argument("--progress", choices=["auto", "tqdm", "plain", "none"], default="auto",
                    help="progress on stderr: auto = tqdm where importable, else plain lines")
    ap.add_argument("--progress-interval", type=float, default=5.0, metavar="S",
                    help="plain progress: seconds between lines (default 5)")
    a = ap.parse_args()
    if not 0.0 <= a.val_fraction < 1.0:
        fail(f"--val-fraction {a.val_fraction} must be in [0, 1)")
    if a.shard_tokens < 1 or a.shard_tokens > 2**31 - 1:
        fail(f"--shard-tokens {a.shard_tokens} must be in [1, 2^31)")
    tok = make_tokenizer(a.tokenizer)
    if a.format == "llmc" and tok.vocab > 65536:
        fail(f"{tok.name} has {tok.vocab} tokens: llm.c shards hold uint16 tokens; use --format megatron")
    os.makedirs(a.out_dir, exist_ok=True)
    stem = os.path.join(a.out_dir, a.name)

    def writer(split):
        if a.format == "llmc":
            return LlmcWriter(f"{stem}_{split}", a.shard_tokens)
        return MegatronWriter(f"{stem}_{split}_text_document", tok.vocab)

    out = {"train": writer("train"), "val": writer("val")}
    stats = {s: {"documents": 0, "tokens": 0} for s in out}
    held = None  # the last document, for a validation set that the hash left empty
    progress = Progress(input_bytes(a.inputs), progress_mode(a.progress), a.progress_interval)
    for i, (where, text, nbytes) in enumerate(documents(a.inputs, a.jsonl)):
        ids = tok.encode(text)
        if tok.eot is not None:
            ids = [tok.eot] + ids
        progress.update(nbytes, len(ids))
        if not ids:
            continue
        if max(ids) >= tok.vocab:
            fail(f"{where}: token {max(ids)} >= the tokenizer's vocabulary {tok.vocab}")
        if a.val_fraction > 0 and is_validation(i, a.seed, a.val_fraction):
            split = "val"
        else:
            if held is not None:
                out["train"].add(held)
                stats["train"]["documents"] += 1
                stats["train"]["tokens"] += len(held)
            held = ids
            continue
        out[split].add(ids)
        stats[split]["documents"] += 1
        stats[split]["tokens"] += len(ids)
    if held is not None:
        split = "val" if a.val_fraction > 0 and stats["val"]["documents"] == 0 else "train"
        if split == "val" and stats["train"]["documents"] == 0:
            # One document in all: its tail is the validation set.
            cut = max(1, int(len(held) * (1 - a.val_fraction)))
            out["train"].add(held[:cut])
            stats["train"]["documents"] += 1
            stats["train"]["tokens"] += cut
            held = held[cut:]
        if held:
            out[split].add(held)
            stats[split]["documents"] += 1
            stats[split]["tokens"] += len(held)
    if stats["train"]["tokens"] == 0:
        fail("no tokens for the training split (are the inputs empty?)")
    files = {s: w.close() for s, w in out.items()}
    progress.close()
    if stats["val"]["tokens"] == 0:
        files["val"] = []
    summary = {"tokenizer": tok.name, "vocab": tok.vocab, "format": a.format,
               "train": dict(stats["train"], files=files["train"]), "val": dict(stats["val"], files=files["val"])}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
