#!/usr/bin/env python3
"""Synthetic per-node load history for triax-forecast's tests (stdlib only, seeded).

  gen_history.py [--kind seasonal|noise] [--nodes 6] [--days 7] [--end UNIX_HOUR] [--seed 1]
                 [--csv FILE] [--openmetrics FILE] [--prefix P] [--stop-early NODE:HOURS]
                 [--nan NODE:HOURS_BEFORE_END] [--no-eof]

The history covers the hours [end - days*24h, end). Every hour has a value per node and feature;
--openmetrics writes it as 12 samples per hour (5 minutes apart, at hour + 150 s + k*300 s, so
that Prometheus' avg_over_time(...[1h]) evaluated at the end of the hour sees exactly that hour's
samples), and --csv writes one row per hour (timestamp = the start of the hour) holding the mean of
the same 12 samples as printed, so a CSV row equals what the default queries return for that hour.

--kind seasonal: compute utilisation = base + a daily cycle (own phase and amplitude per node) +
a weekly trend + job-submission bursts (+0.2..0.4 for 2..5 hours, starting at hours drawn from a
daily submission distribution that peaks mid-morning and mid-afternoon) + AR(1) and white noise;
memory bandwidth follows compute; probe latency (2e-5..1e-4 s) rises with load; read IOPS fall
with it. --kind noise: every feature i.i.d. around a constant (nothing to learn but the mean).
Utilisations are clipped to [0, 1].

Faults for the bad-input tests: --stop-early n03:5 ends node n03's series 5 hours before the end;
--nan n02:30 makes one compute sample of n02 NaN in the hour 30 hours before the end. --prefix
prepends P to every metric name (a second data set in the same Prometheus); --no-eof leaves out
the final `# EOF` so that files can be concatenated (add one line `# EOF` after the last).
"""
import argparse
import math
import random
import sys
import time

HOUR = 3600
SAMPLES_PER_HOUR = 12
STEP = HOUR // SAMPLES_PER_HOUR
FEATURES = ("compute", "memory_bw", "latency", "iops")
METRICS = (  # (feature, metric name, help)
    ("compute", "triax_node_compute_utilisation", "Compute utilisation of the node (fraction)."),
    ("memory_bw", "triax_node_memory_bw_utilisation", "Memory bandwidth utilisation of the node (fraction)."),
    ("latency", "triax_probe_latency_seconds", "Probe round-trip latency of the node."),
    ("iops", "triax_probe_read_iops", "Probe storage read IOPS of the node."),
)


def clip01(v):
    return min(1.0, max(0.0, v))


def submission_hour(rng):
    """A job-submission time of day: peaks mid-morning (10:00) and mid-afternoon (15:00)."""
    centre = 10.0 if rng.random() < 0.55 else 15.0
    return rng.gauss(centre, 1.5) % 24.0


def bursts_for(rng, hours, start):
    """Extra compute load per hour from job bursts: 1 or 2 submissions a day."""
    extra = [0.0] * hours
    days = hours // 24 + 2
    day0 = (start // (24 * HOUR)) * 24 * HOUR
    for d in range(-1, days):
        for _ in range(rng.randint(1, 2)):
            t = day0 + d * 24 * HOUR + int(submission_hour(rng) * HOUR)
            first = (t - start) // HOUR
            length = rng.randint(2, 5)
            size = rng.uniform(0.2, 0.4)
            for k in range(length):
                h = first + k
                if 0 <= h < hours:
                    # Full size while running, the last hour tails off.
                    extra[h] += size * (0.5 if k == length - 1 else 1.0)
    return extra


def seasonal_node(rng, hours, start):
    """Hourly rows (compute, memory_bw, latency, iops) of one node."""
    base = rng.uniform(0.1, 0.2)
    amp = rng.uniform(0.25, 0.4)
    peak = 14.0 + rng.uniform(-3.0, 3.0)  # hour of day of the daily maximum
    trend = rng.uniform(0.03, 0.10)       # per week
    mem_gain, mem_base = rng.uniform(0.6, 0.8), rng.uniform(0.05, 0.15)
    iops_peak = rng.uniform(60000, 90000)
    extra = bursts_for(rng, hours, start)
    ar = 0.0
    rows = []
    for h in range(hours):
        t = start + h * HOUR
        hod = (t % (24 * HOUR)) / HOUR + 0.5
        daily = 0.5 * (1 + math.cos(2 * math.pi * (hod - peak) / 24))
        ar = 0.5 * ar + rng.gauss(0, 0.015)
        compute = clip01(base + amp * daily + trend * h / (7 * 24) + extra[h] + ar + rng.gauss(0, 0.04))
        mem = clip01(mem_base + mem_gain * compute + rng.gauss(0, 0.02))
        load = 0.6 * compute + 0.4 * mem
        latency = (2e-5 + 8e-5 * load * load) * (1 + rng.gauss(0, 0.03))
        iops = iops_peak * (1 - 0.6 * load) * (1 + rng.gauss(0, 0.02))
        rows.append((compute, mem, max(latency, 1e-6), max(iops, 1.0)))
    return rows


def noise_node(rng, hours, start):
    rows = []
    for _ in range(hours):
        rows.append((clip01(rng.gauss(0.5, 0.1)), clip01(rng.gauss(0.4, 0.08)),
                     max(5e-5 * (1 + rng.gauss(0, 0.1)), 1e-6), max(50000 * (1 + rng.gauss(0, 0.05)), 1.0)))
    return rows


def samples_of_hour(rng, row):
    """12 five-minute samples of each feature around the hourly value (utilisations clipped)."""
    out = []
    for f, v in enumerate(row):
        rel = 0.01 if f < 2 else 0.02
        vals = []
        for _ in range(SAMPLES_PER_HOUR):
            s = v + rng.gauss(0, rel) if f < 2 else v * (1 + rng.gauss(0, rel))
            vals.append(clip01(s) if f < 2 else s)
        out.append([float(fmt(s)) for s in vals])
    return out


def fmt(v):
    if isinstance(v, float) and math.isnan(v):
        return "NaN"
    return "%.10g" % v


def parse_fault(text, flag):
    try:
        node, hours = text.split(":")
        return node, int(hours)
    except ValueError:
        sys.exit(f"gen_history.py: {flag} wants NODE:HOURS, got {text!r}")


def build(args):
    """{node: [(hour_start, [12 samples per feature])]} after the faults."""
    rng = random.Random(args.seed)
    hours = args.days * 24
    start = args.end - hours * HOUR
    make = seasonal_node if args.kind == "seasonal" else noise_node
    stop = dict(parse_fault(s, "--stop-early") for s in args.stop_early)
    nan = dict(parse_fault(s, "--nan") for s in args.nan)
    nodes = {}
    for i in range(args.nodes):
        name = "n%02d" % (i + 1)
        node_rng = random.Random(rng.random())
        rows = make(node_rng, hours, start)
        keep = hours - stop.get(name, 0)
        series = []
        for h in range(keep):
            series.append((start + h * HOUR, samples_of_hour(node_rng, rows[h])))
        if name in nan:
            h = hours - nan[name]
            if not 0 <= h < keep:
                sys.exit(f"gen_history.py: --nan {name}:{nan[name]} is outside the series")
            series[h][1][0][SAMPLES_PER_HOUR // 2] = float("nan")
        nodes[name] = series
    for name in list(stop) + list(nan):
        if name not in nodes:
            sys.exit(f"gen_history.py: no node {name} (nodes n01..n{args.nodes:02d})")
    return nodes


def write_csv(path, nodes):
    with open(path, "w") as f:
        f.write("timestamp,node,compute,memory_bw,latency,iops\n")
        for name, series in nodes.items():
            for t, feats in series:
                means = [sum(v) / len(v) for v in feats]
                f.write("%d,%s,%s\n" % (t, name, ",".join(fmt(m) for m in means)))


def write_openmetrics(path, nodes, prefix, eof):
    with open(path, "w") as f:
        for fi, (_, metric, help_text) in enumerate(METRICS):
            name = prefix + metric
            f.write(f"# HELP {name} {help_text}\n# TYPE {name} gauge\n")
            for node, series in nodes.items():
                for t, feats in series:
                    for k, v in enumerate(feats[fi]):
                        f.write(f'{name}{{host="{node}"}} {fmt(v)} {t + STEP // 2 + k * STEP}\n')
        if eof:
            f.write("# EOF\n")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kind", choices=("seasonal", "noise"), default="seasonal")
    p.add_argument("--nodes", type=int, default=6)
    p.add_argument("--days", type=int, default=7)
    p.add_argument("--end", type=int, default=int(time.time()) // HOUR * HOUR,
                   help="unix seconds on the hour: one past the last hour (default: the current hour's start)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--csv")
    p.add_argument("--openmetrics")
    p.add_argument("--prefix", default="")
    p.add_argument("--stop-early", action="append", default=[])
    p.add_argument("--nan", action="append", default=[])
    p.add_argument("--no-eof", action="store_true")
    args = p.parse_args()
    if args.end % HOUR:
        sys.exit(f"gen_history.py: --end {args.end} is not on the hour")
    if args.nodes < 1 or args.nodes > 99 or args.days < 1:
        sys.exit("gen_history.py: --nodes must be 1..99 and --days >= 1")
    if not args.csv and not args.openmetrics:
        sys.exit("gen_history.py: nothing to write (--csv and/or --openmetrics)")
    nodes = build(args)
    if args.csv:
        write_csv(args.csv, nodes)
    if args.openmetrics:
        write_openmetrics(args.openmetrics, nodes, args.prefix, not args.no_eof)


if __name__ == "__main__":
    main()
