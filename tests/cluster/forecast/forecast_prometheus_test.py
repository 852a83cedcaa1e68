#!/usr/bin/env python3
"""triax-forecast against a real Prometheus on loopback (issue 31, docs/CLUSTER.md "Predictive scheduling").

  forecast_prometheus_test.py TRIAX_FORECAST [--epochs N] [--patience N] [--keep DIR]

Seven days (and one spare) of generated per-node history (gen_history.py) are backfilled with
`promtool tsdb create-blocks-from openmetrics` into a fresh TSDB, Debian's Prometheus serves it on
a free loopback port, and the CLI reads it over HTTP:
  - train on the seasonal data: the LSTM beats persistence and seasonal naive on MAE and RMSE on
    the held-out day; evaluate repeats the same numbers; predict writes one gauge per node to a
    textfile that `promtool check metrics` accepts, equal to its JSON;
  - train/evaluate on pure noise (a second set of series, --query): reported, and the LSTM must not
    beat the best constant forecast (the training mean) by more than a small margin;
  - bad input, each one exit code (docs/ERRORS.md: 3 for data, a model file or a Prometheus that is
    malformed, unreachable or unreadable; 2 for bad flags) and one
    message: an unreachable or a silent Prometheus, an empty range, a partial range, a NaN
    sample, a node with fewer than 24 hours, malformed CSVs, a model file of the wrong shape,
    and a failed train that leaves the previous model file untouched.
Exit 77 (skipped) without prometheus/promtool. Every step runs under a timeout; Prometheus is
stopped by the test.
"""
import argparse
import json
import math
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
HOUR = 3600
NODES = 6
SEED = 1
NOISE_SEED = 2
# The LSTM must not do better than the training mean on pure noise by more than this fraction.
NOISE_MARGIN = 0.05

failures = []


def log(msg):
    print(msg, flush=True)


def check(ok, what):
    log(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)
    return ok


def run(cmd, timeout=240, **kw):
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    p.elapsed = time.time() - t0
    return p


def free_ports(n):
    out = run([sys.executable, os.path.join(HERE, "..", "free_ports.py"), str(n)], timeout=30).stdout.split()
    return [int(x) for x in out]


class Prometheus:
    """Debian's prometheus on a backfilled TSDB; stop() kills it (also from the atexit path)."""

    def __init__(self, tmp, data, port):
        cfg = os.path.join(tmp, "prometheus.yml")
        with open(cfg, "w") as f:
            f.write("global:\n  scrape_interval: 1m\nscrape_configs: []\n")
        self.log_path = os.path.join(tmp, "prom.log")
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            ["timeout", "580", "prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={data}",
             "--storage.tsdb.retention.time=3650d", f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=open(self.log_path, "w"), stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, seconds=60):
        deadline = time.time() + seconds
        while time.time() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                urllib.request.urlopen(self.url + "/-/ready", timeout=1)
                return True
            except OSError:
                time.sleep(0.2)
        return False

    def query(self, promql, at):
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql, "time": at})
        r = json.load(urllib.request.urlopen(url, timeout=10))
        return {s["metric"].get("host"): float(s["value"][1]) for s in r["data"]["result"]}

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def tail(self):
        try:
            return "".join(open(self.log_path).readlines()[-5:])
        except OSError:
            return ""


def gen(args, timeout=120):
    p = run([sys.executable, os.path.join(HERE, "gen_history.py")] + args, timeout=timeout)
    if p.returncode != 0:
        raise SystemExit(f"gen_history.py {' '.join(args)} failed: {p.stderr}")


def read_csv(path):
    """{node: [(timestamp, compute), ...]} in time order."""
    out = {}
    with open(path) as f:
        next(f)
        for line in f:
            t, node, compute = line.split(",")[:3]
            out.setdefault(node, []).append((int(t), float(compute)))
    for v in out.values():
        v.sort()
    return out


def queries(prefix):
    q = {"compute": "triax_node_compute_utilisation", "memory_bw": "triax_node_memory_bw_utilisation",
         "latency": "triax_probe_latency_seconds", "iops": "triax_probe_read_iops"}
    return [f"--query={k}=avg by (host) (avg_over_time({prefix}{m}[1h]))" for k, m in q.items()]


def load_json(path):
    with open(path) as f:
        return json.load(f)


def holdout_table(name, h):
    lstm = h["lstm"]
    log(f"  {name}: holdout n={h['n']}")
    for k in ("lstm", "persistence", "seasonal_naive", "training_mean", "train_mean"):
        if k in h:
            log(f"    {k:15s} MAE {h[k]['mae']:.5f}  RMSE {h[k]['rmse']:.5f}")
    for k in ("persistence", "seasonal_naive"):
        log(f"    lstm vs {k:15s} MAE {100 * (lstm['mae'] / h[k]['mae'] - 1):+.1f}%  "
            f"RMSE {100 * (lstm['rmse'] / h[k]['rmse'] - 1):+.1f}%")


def rel_close(a, b, rel):
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-300)


def expect_failure(name, cmd, rc, patterns, timeout=120):
    """The CLI must exit with rc and say each pattern (regex, case-insensitive) in one stderr message."""
    p = run(cmd, timeout=timeout)
    err = p.stderr.strip()
    msgs = [l for l in err.splitlines() if l.startswith("triax-forecast: ")]
    ok = p.returncode == rc and len(msgs) == 1 and all(re.search(x, msgs[0], re.I) for x in patterns)
    check(ok, f"bad input '{name}': exit {p.returncode} (want {rc}): {err.splitlines()[-1] if err else '(no message)'}")
    if not ok:
        log(f"    wanted {patterns} in one 'triax-forecast: ' message; stderr:\n    " + err.replace("\n", "\n    "))
    return p


# ---------------------------------------------------------------------------------------------
# The steps


def backfill(tmp, end):
    """OpenMetrics of four series sets -> TSDB blocks; the CSVs of the same data."""
    om = [os.path.join(tmp, f"{s}.om") for s in ("seasonal", "noise", "partial", "nan")]
    days = ["--days", "8", "--end", str(end), "--nodes", str(NODES)]
    gen(days + ["--seed", str(SEED), "--csv", f"{tmp}/seasonal.csv", "--openmetrics", om[0], "--no-eof"])
    gen(days + ["--seed", str(NOISE_SEED), "--kind", "noise", "--prefix", "noise_", "--csv", f"{tmp}/noise.csv",
                "--openmetrics", om[1], "--no-eof"])
    gen(days + ["--seed", "3", "--prefix", "partial_", "--stop-early", "n03:5", "--openmetrics", om[2], "--no-eof"])
    gen(days + ["--seed", "4", "--prefix", "nan_", "--nan", "n02:30", "--openmetrics", om[3], "--no-eof"])
    allom = os.path.join(tmp, "all.om")
    with open(allom, "w") as out:
        for path in om:
            with open(path) as f:
                shutil.copyfileobj(f, out)
        out.write("# EOF\n")
    data = os.path.join(tmp, "data")
    p = run(["timeout", "170", "promtool", "tsdb", "create-blocks-from", "openmetrics", "-q", allom, data], timeout=180)
    if p.returncode != 0:
        raise SystemExit(f"promtool tsdb create-blocks-from openmetrics failed: {p.stdout}{p.stderr}")
    log(f"backfill: {os.path.getsize(allom) >> 20} MiB of OpenMetrics -> {len(os.listdir(data))} blocks "
        f"in {p.elapsed:.1f} s")
    return data


def check_served(prom, tmp, end):
    """The default compute query at the last hour equals the CSV's last hour (the data are as generated)."""
    got = prom.query("avg by (host) (avg_over_time(triax_node_compute_utilisation[1h]))", end)
    csv = read_csv(f"{tmp}/seasonal.csv")
    want = {n: rows[-1][1] for n, rows in csv.items()}
    ok = sorted(got) == sorted(want) and all(rel_close(got[n], want[n], 1e-7) for n in want)
    check(ok, f"prometheus serves the generated history ({len(got)} nodes at the last hour)")
    return csv


def train_seasonal(exe, prom, end, tmp, opt):
    model, j = f"{tmp}/seasonal.safetensors", f"{tmp}/train.json"
    p = run([exe, "train", "--prometheus", prom.url, "--end", str(end), "--model", model, "--json", j, "--seed", "1"]
            + opt, timeout=300)
    log(p.stdout[-2500:])
    if not check(p.returncode == 0, f"train --prometheus (seasonal) exits 0 in {p.elapsed:.1f} s"):
        log(p.stderr)
        return None, None
    r = load_json(j)
    h = r["holdout"]
    holdout_table("seasonal (train)", h)
    log(f"  epochs_run {r['epochs_run']} best_epoch {r['best_epoch']} train_windows {r['train_windows']} "
        f"holdout_windows {r['holdout_windows']}")
    check(h["n"] == NODES * 24 and r["holdout_windows"] == NODES * 24, "the held-out day is 24 windows per node")
    check(r["train_windows"] == NODES * (7 * 24 - 24 - 24), f"train windows {r['train_windows']} = 6 x (168 - 48)")
    for k in ("persistence", "seasonal_naive"):
        for m in ("mae", "rmse"):
            check(h["lstm"][m] < h[k][m], f"LSTM {m.upper()} {h['lstm'][m]:.5f} < {k} {h[k][m]:.5f} "
                  f"({100 * (1 - h['lstm'][m] / h[k][m]):.1f}% better)")
    check(os.path.exists(model) and not any(f.endswith(".tmp") for f in os.listdir(tmp)), "model written, no .tmp left")
    return model, r


def evaluate_same(exe, prom, end, tmp, model, trained):
    j = f"{tmp}/eval.json"
    p = run([exe, "evaluate", "--prometheus", prom.url, "--end", str(end), "--model", model, "--json", j])
    if not check(p.returncode == 0, f"evaluate --prometheus exits 0 in {p.elapsed:.1f} s"):
        log(p.stderr)
        return
    log(p.stdout[-1200:])
    h, t = load_json(j)["holdout"], trained["holdout"]
    kinds = [k for k in ("lstm", "persistence", "seasonal_naive", "training_mean") if k in t]
    same = h["n"] == t["n"] and all(rel_close(h[k][m], t[k][m], 1e-9) for k in kinds for m in ("mae", "rmse"))
    check(same, "evaluate repeats train's holdout numbers (1e-9 relative)")


def parse_textfile(path):
    vals = {}
    for line in open(path):
        if line.startswith("#") or not line.strip():
            continue
        m = re.match(r'^(\w+)\{host="([^"]+)"\} (\S+)$', line.strip())
        if m:
            vals.setdefault(m.group(1), {})[m.group(2)] = float(m.group(3))
    return vals


def predict_textfile(exe, prom, end, tmp, model, csv):
    text, j = f"{tmp}/forecast.prom", f"{tmp}/predict.json"
    p = run([exe, "predict", "--prometheus", prom.url, "--end", str(end), "--model", model, "--textfile", text,
             "--json", j])
    log(p.stdout[-1200:])
    if not check(p.returncode == 0, f"predict --prometheus --textfile exits 0 in {p.elapsed:.1f} s"):
        log(p.stderr)
        return
    c = subprocess.run(["promtool", "check", "metrics"], stdin=open(text), capture_output=True, text=True, timeout=30)
    check(c.returncode == 0, "promtool check metrics accepts the textfile " + (c.stdout + c.stderr).strip())
    r, vals = load_json(j), parse_textfile(text)
    nodes = {n["node"]: n for n in r["nodes"]}
    pred = vals.get("triax_node_predicted_utilisation", {})
    when = vals.get("triax_node_forecast_for_timestamp_seconds", {})
    check(sorted(nodes) == sorted(csv) and sorted(pred) == sorted(csv), f"one gauge per node ({len(pred)})")
    check(all(rel_close(pred[n], nodes[n]["predicted_utilisation"], 1e-9) for n in pred),
          "textfile predictions equal the JSON's")
    check(all(0 <= nodes[n]["predicted_utilisation"] <= 1 for n in nodes), "predictions in [0, 1]")
    # The last hour read is the one Prometheus evaluates at --end ([end - 1h, end]); what follows it
    # starts at end (a forecast labelled by its hour's start) or ends at end + 1h (by evaluation time).
    check(r["for_timestamp"] in (end, end + HOUR), f"for_timestamp {r['for_timestamp']} is the hour after the data "
          f"(end {end}: {'its start' if r['for_timestamp'] == end else 'its evaluation time'})")
    check(all(int(when.get(n, -1)) == r["for_timestamp"] for n in nodes), "textfile for_timestamp equals the JSON's")
    check(all(rel_close(nodes[n]["last_utilisation"], csv[n][-1][1], 1e-7) for n in nodes),
          "last_utilisation is the last hour of the generated history")


def train_noise(exe, prom, end, tmp, opt, noise_csv):
    model, j = f"{tmp}/noise.safetensors", f"{tmp}/noise.json"
    q = queries("noise_")
    p = run([exe, "train", "--prometheus", prom.url, "--end", str(end), "--model", model, "--json", j, "--quiet"]
            + q + opt, timeout=300)
    if not check(p.returncode == 0, f"train on pure noise exits 0 in {p.elapsed:.1f} s"):
        log(p.stderr)
        return None
    e = run([exe, "evaluate", "--prometheus", prom.url, "--end", str(end), "--model", model, "--json", f"{tmp}/ne.json"]
            + q)
    check(e.returncode == 0, "evaluate on pure noise exits 0")
    r = load_json(j)
    h = r["holdout"]
    # The best forecast of i.i.d. noise: the mean of the training hours of the same 7 days, computed
    # here from the generated CSV beside the CLI's own "training_mean" row.
    hist = [v for rows in noise_csv.values() for t, v in rows if end - 7 * 24 * HOUR <= t < end - 24 * HOUR]
    mean = sum(hist) / len(hist)
    last = [v for rows in noise_csv.values() for t, v in rows if t >= end - 24 * HOUR]
    h["train_mean"] = {"mae": sum(abs(v - mean) for v in last) / len(last),
                       "rmse": math.sqrt(sum((v - mean) ** 2 for v in last) / len(last))}
    holdout_table("noise (train)", h)
    log(f"  epochs_run {r['epochs_run']} best_epoch {r['best_epoch']}")
    if "training_mean" in h:
        check(all(rel_close(h["training_mean"][m], h["train_mean"][m], 0.02) for m in ("mae", "rmse")),
              "the CLI's training_mean baseline agrees with the test's (2%)")
    for m in ("mae", "rmse"):
        gain = 1 - h["lstm"][m] / h["train_mean"][m]
        check(gain <= NOISE_MARGIN, f"noise: LSTM {m.upper()} {h['lstm'][m]:.5f} vs training mean "
              f"{h['train_mean'][m]:.5f}: {100 * gain:+.1f}% better (at most {100 * NOISE_MARGIN:.0f}%)")
    return r


# ---------------------------------------------------------------------------------------------
# Bad input


def write(path, text):
    with open(path, "w") as f:
        f.write(text)
    return path


def malformed_csvs(tmp, good_csv):
    """(name, path, regexes the message must hold) for each kind of broken CSV."""
    lines = open(good_csv).read().splitlines()
    head, rows = lines[0], lines[1:]
    t0, node0 = rows[0].split(",")[:2]
    cases = []

    def case(name, text, *patterns):
        path = write(os.path.join(tmp, f"bad_{name}.csv"), text)
        cases.append((name, path, [re.escape(os.path.basename(path))] + list(patterns)))

    case("header", "time,node,compute,memory_bw,latency,iops\n" + "\n".join(rows) + "\n", "header")
    case("fields", "\n".join([head] + rows[:5] + [rows[5] + ",7"] + rows[6:]) + "\n", r":7\b", "columns")
    bad = rows[3].split(",")
    bad[2] = "abc"
    case("number", "\n".join([head] + rows[:3] + [",".join(bad)] + rows[4:]) + "\n", r":5\b", "abc|number")
    bad = rows[3].split(",")
    bad[3] = "nan"
    case("nan", "\n".join([head] + rows[:3] + [",".join(bad)] + rows[4:]) + "\n", r":5\b", "nan|finite")
    bad = rows[2].split(",")
    bad[0] = str(int(bad[0]) + 60)
    case("off_hour", "\n".join([head] + rows[:2] + [",".join(bad)] + rows[3:]) + "\n", r":4\b", "hour")
    case("repeated", "\n".join([head] + rows[:4] + [rows[3]] + rows[4:]) + "\n", "repeat|duplicate")
    case("gap", "\n".join([head] + rows[:10] + rows[13:]) + "\n", re.escape(node0), "gap|missing")
    case("no_rows", head + "\n", "no data|no rows|empty")
    case("empty_node", "\n".join([head] + rows[:3] + [t0 + ",," + ",".join(rows[3].split(",")[2:])] + rows[4:]) + "\n",
         "node")
    return cases


def short_node_csv(tmp, good_csv):
    """n02 keeps only its last 20 hours."""
    rows = open(good_csv).read().splitlines()
    n02 = [r for r in rows[1:] if r.split(",")[1] == "n02"][-20:]
    keep = [rows[0]] + [r for r in rows[1:] if r.split(",")[1] != "n02"] + n02
    return write(os.path.join(tmp, "short.csv"), "\n".join(keep) + "\n")


def wrong_shape_model(src, dst):
    """The model with lstm.weight_ih_l0 cut to 128 x 4 (stdlib safetensors: u64 header length, JSON, data)."""
    with open(src, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", None)
    out, blob = {}, b""
    for name, e in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        b, end = e["data_offsets"]
        t = data[b:end]
        shape = e["shape"]
        if name == "lstm.weight_ih_l0":
            shape, t = [128, 4], t[:128 * 4 * 4]
        out[name] = {"dtype": e["dtype"], "shape": shape, "data_offsets": [len(blob), len(blob) + len(t)]}
        blob += t
    if meta is not None:
        out["__metadata__"] = meta
    h = json.dumps(out).encode()
    h += b" " * (-len(h) % 8)
    with open(dst, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + blob)


def bad_inputs(exe, prom, end, tmp, model, seasonal_csv):
    closed = free_ports(1)[0]
    url = f"http://127.0.0.1:{closed}"
    expect_failure("unreachable prometheus", [exe, "train", "--prometheus", url, "--end", str(end), "--model",
                                              f"{tmp}/x.safetensors", "--http-timeout", "2"],
                   3, [re.escape(f"127.0.0.1:{closed}")])
    # A port that accepts connections and never answers: --http-timeout bounds the wait.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    sport = silent.getsockname()[1]
    p = expect_failure("silent prometheus", [exe, "train", "--prometheus", f"http://127.0.0.1:{sport}", "--end",
                                             str(end), "--model", f"{tmp}/x.safetensors", "--http-timeout", "1"],
                       3, [re.escape(f"127.0.0.1:{sport}")])
    check(p.elapsed < 30, f"--http-timeout 1 gives up on a silent server in {p.elapsed:.1f} s")
    silent.close()
    year_ago = end - 365 * 24 * HOUR
    expect_failure("empty range", [exe, "train", "--prometheus", prom.url, "--end", str(year_ago), "--model",
                                   f"{tmp}/x.safetensors"], 3, ["no series|no data|empty", "compute"])
    expect_failure("partial range", [exe, "train", "--prometheus", prom.url, "--end", str(end), "--model",
                                     f"{tmp}/x.safetensors"] + queries("partial_"), 3, ["n03", "missing|hours"])
    nan_q = "--query=compute=avg by (host) (avg_over_time(nan_triax_node_compute_utilisation[1h]))"
    expect_failure("NaN sample", [exe, "train", "--prometheus", prom.url, "--end", str(end), "--model",
                                  f"{tmp}/x.safetensors", nan_q], 3, ["n02", "nan|finite", "compute"])
    expect_failure("node with 20 hours", [exe, "predict", "--csv", short_node_csv(tmp, seasonal_csv), "--model", model],
                   3, ["n02", r"\b20\b", r"\b24\b"])
    for name, path, patterns in malformed_csvs(tmp, seasonal_csv):
        expect_failure(f"malformed CSV ({name})", [exe, "train", "--csv", path, "--model", f"{tmp}/x.safetensors"],
                       3, patterns)
    expect_failure("missing CSV", [exe, "train", "--csv", f"{tmp}/absent.csv", "--model", f"{tmp}/x.safetensors"],
                   3, ["absent.csv"])
    bad_model = f"{tmp}/wrong_shape.safetensors"
    wrong_shape_model(model, bad_model)
    expect_failure("model of the wrong shape", [exe, "predict", "--csv", seasonal_csv, "--model", bad_model], 3,
                   [r"lstm\.weight_ih_l0", "128", "256"])
    check(not os.path.exists(f"{tmp}/x.safetensors"), "no model written by the failed runs")

    # A failed train keeps the previous model byte for byte and leaves no temporary file.
    before = open(model, "rb").read()
    expect_failure("train onto an existing model, NaN input", [exe, "train", "--prometheus", prom.url, "--end",
                                                               str(end), "--model", model, nan_q], 3, ["n02"])
    expect_failure("train onto an existing model, bad option", [exe, "train", "--prometheus", prom.url, "--end",
                                                                str(end), "--model", model, "--epochs", "0"],
                   2, ["epochs"])
    check(open(model, "rb").read() == before, "the previous model file is unchanged (byte-identical)")
    left = [f for f in os.listdir(tmp) if ".tmp" in f]
    check(not left, f"no temporary file left ({left})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("exe")
    ap.add_argument("--epochs", default="150")
    ap.add_argument("--patience", default="20")
    ap.add_argument("--keep", help="keep the work directory here (copied at the end)")
    ap.add_argument("--end", type=int, help="the last hour of the data (unix seconds; default: the current hour, "
                    "the CLI's default --end)")
    args = ap.parse_args()
    if not (shutil.which("prometheus") and shutil.which("promtool")):
        log("SKIP: prometheus/promtool not installed (Debian package prometheus)")
        return 77
    t_start = time.time()
    tmp = tempfile.mkdtemp(prefix="triax_forecast_")
    prom = None
    try:
        end = args.end or int(time.time()) // HOUR * HOUR  # the last full hour: the CLI's default --end
        if end % HOUR:
            raise SystemExit(f"--end {end} is not on the hour")
        data = backfill(tmp, end)
        prom = Prometheus(tmp, data, free_ports(1)[0])
        if not prom.wait_ready():
            raise SystemExit("prometheus did not become ready:\n" + prom.tail())
        log(f"prometheus ready at {prom.url} ({time.time() - t_start:.1f} s)")
        csv = check_served(prom, tmp, end)
        opt = ["--epochs", args.epochs, "--patience", args.patience]
        model, trained = train_seasonal(args.exe, prom, end, tmp, opt)
        if model:
            evaluate_same(args.exe, prom, end, tmp, model, trained)
            predict_textfile(args.exe, prom, end, tmp, model, csv)
        train_noise(args.exe, prom, end, tmp, opt, read_csv(f"{tmp}/noise.csv"))
        if model:
            bad_inputs(args.exe, prom, end, tmp, model, f"{tmp}/seasonal.csv")
    finally:
        if prom:
            prom.stop()
        if args.keep:
            shutil.copytree(tmp, args.keep, dirs_exist_ok=True, ignore=shutil.ignore_patterns("data", "*.om"))
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"total {time.time() - t_start:.1f} s")
    if failures:
        log(f"{len(failures)} check(s) failed:\n  " + "\n  ".join(failures))
        return 1
    log("ok: triax-forecast against Prometheus")
    return 0


if __name__ == "__main__":
    sys.exit(main())
