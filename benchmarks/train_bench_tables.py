#!/usr/bin/env python3
"""Markdown tables from the JSON that run_train_bench.sh collects (schedule_bench and train_bench).

    python3 benchmarks/train_bench_tables.py OUT_DIR > train_bench_cpu.md   (also writes OUT_DIR/planner_cpu.md)

Each invocation ran REPEATS times; a cell is the median over runs of that run's median over its
timed iterations, with the range over runs in brackets where it matters. The machine is shared:
a run in which the ranks did not hold their cores (CPU share of the compute intervals below 0.9,
i.e. another process ran on a rank's core) is left out when at least one clean run exists; the
"runs" column says how many were kept. Oversubscribed runs (more ranks than cores) are never
clean and are all kept.
"""
import glob
import json
import os
import re
import statistics
import sys


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def rng(xs, fmt):
    xs = [x for x in xs if x is not None]
    if len(xs) < 2:
        return ""
    return f" [{fmt.format(min(xs))}-{fmt.format(max(xs))}]"


def runs(out, prefix):
    """{name: [json of run 1, run 2, ...]} for files OUT/prefix*.rK.json."""
    by = {}
    for f in sorted(glob.glob(os.path.join(out, prefix + "*.r*.json"))):
        m = re.match(r"(.*)\.r(\d+)\.json$", os.path.basename(f))
        if not m:
            continue
        with open(f) as fh:
            by.setdefault(m.group(1), []).append(json.load(fh))
    return by


CLEAN = 0.9


def keep(rs, share, oversubscribed):
    """The runs to report: the clean ones (CPU share >= CLEAN) if any, else all."""
    if oversubscribed:
        return rs, f"{len(rs)}/{len(rs)}"
    clean = [r for r in rs if share(r) >= CLEAN]
    return (clean, f"{len(clean)}/{len(rs)}") if clean else (rs, f"0/{len(rs)} clean")


def fmt_or(x, f, none="n/a"):
    return none if x is None else f.format(x)


def schedule_tables(out):
    lines = []
    for name, rs in sorted(runs(out, "sched_").items()):
        first = rs[0][0]
        over = first["ranks"] > (os.cpu_count() or 2)
        lines.append(f"\n### {name}: pp {first['p']} on {first['ranks']} ranks, m {first['m']}"
                     + (" (OVERSUBSCRIBED: more ranks than cores, not a clean measurement)" if over else "")
                     + (" with OMPI_MCA_btl_vader_single_copy_mechanism=none" if "nocma" in name else "")
                     + (" with MALLOC_MMAP_THRESHOLD_=32M MALLOC_TRIM_THRESHOLD_=4G (freed memory reused)"
                        if "malloc" in name else ""))
        lines.append("")
        lines.append("| schedule | p | v | m | measured bubble | theory | simulated (measured costs) | "
                     "simulated (CPU-time costs) | measured - theory | runs | CPU share | step (ms) | load |")
        lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for i, r0 in enumerate(rs[0]):
            rows, kept = keep([r[i] for r in rs], lambda x: x["cpu_share"], over)
            meas = [r["measured"] for r in rows]
            th = r0["theory"]
            sim = med([r["simulated"] for r in rows])
            d = None if th is None else (med(meas) - th) * 100
            th = med([r["theory"] for r in rows])
            d = None if th is None else (med(meas) - th) * 100
            lines.append(
                f"| {r0['schedule']} | {r0['p']} | {r0['v']} | {r0['m']} | {med(meas):.4f}{rng(meas, '{:.3f}')} | "
                f"{fmt_or(th, '{:.4f}')} | {sim:.4f} | {med([r['simulated_cpu'] for r in rows]):.4f} | "
                f"{fmt_or(d, '{:+.1f} pp')} | {kept} | "
                f"{med([r['cpu_share'] for r in rows]):.2f} | {med([r['step_ms'] for r in rows]):.0f} | "
                f"{med([r['load_average'] for r in rows]):.1f} |")
    return lines


def train_tables(out):
    tr = runs(out, "train_")
    layouts = [(k, v) for k, v in tr.items() if not k.startswith("train_overlap")]
    order = lambda kv: (kv[1][0]["ranks"], kv[0])
    lines = ["\n### Throughput (overlap on)", "",
             "| layout | ranks | tp | pp | dp | tokens/s | step (ms) | compute CPU (ms, busiest rank) | runs | CPU share | "
             "p2p wait (ms) | DP exposed (ms) | load |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, rs in sorted(layouts, key=order):
        rs, kept = keep(rs, lambda r: r["overlap"]["cpu_share"], rs[0]["oversubscribed"])
        r0 = rs[0]
        o = [r["overlap"] for r in rs]
        tag = " (oversubscribed)" if r0["oversubscribed"] else ""
        toks = [x["tokens_per_s"] for x in o]
        lines.append(
            f"| {r0['label']}{tag} | {r0['ranks']} | {r0['tp']} | {r0['pp']} | {r0['dp']} | "
            f"{med(toks):.0f}{rng(toks, '{:.0f}')} | {med([x['step_ms'] for x in o]):.0f} | "
            f"{med([x['compute_cpu_ms'] for x in o]):.0f} | {kept} | {med([x['cpu_share'] for x in o]):.2f} | "
            f"{med([x['p2p_wait_ms'] for x in o]):.1f} | {med([x['dp_exposed_ms'] for x in o]):.1f} | "
            f"{med([r['load_average'] for r in rs]):.1f} |")

    lines += ["\n### Data-parallel communication with and without overlap", "",
              "net = exposed (time in the gradient sync's finish) minus the wait for the slowest rank's backward; "
              "worst rank, median. hidden = 1 - net(overlap) / net(no overlap).", "",
              "| run | ranks | dp | micro-batches | no overlap: net exposed (ms) | overlap: net exposed (ms) | hidden | "
              "step no overlap / overlap (ms) | runs | CPU share |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for name, rs in sorted(tr.items(), key=order):
        if "no-overlap" not in rs[0]:
            continue
        rs, kept = keep(rs, lambda r: min(r["overlap"]["cpu_share"], r["no-overlap"]["cpu_share"]),
                        rs[0]["oversubscribed"])
        r0 = rs[0]
        off = [r["no-overlap"]["dp_net_ms"] for r in rs]
        on = [r["overlap"]["dp_net_ms"] for r in rs]
        hid = [r.get("hidden_fraction") for r in rs]
        m = r0["global_batch"] // (r0["micro_batch"] * r0["dp"])
        tag = " (oversubscribed)" if r0["oversubscribed"] else ""
        lines.append(
            f"| {r0['label']}{tag} | {r0['ranks']} | {r0['dp']} | {m} x {r0['micro_batch']} | "
            f"{med(off):.2f}{rng(off, '{:.1f}')} | {med(on):.2f}{rng(on, '{:.1f}')} | "
            f"{100 * med(hid):.0f}%{rng([100 * h for h in hid], '{:.0f}%')} | "
            f"{med([r['no-overlap']['step_ms'] for r in rs]):.0f} / {med([r['overlap']['step_ms'] for r in rs]):.0f} | "
            f"{kept} | {med([r['overlap']['cpu_share'] for r in rs]):.2f} |")
    return lines


def planner_table(out):
    tr = runs(out, "train_")
    lines = ["| layout | ranks | predicted (ms) | measured (ms) | measured / predicted | predicted compute+TP (ms) | "
             "measured compute CPU (ms) | ratio | runs | CPU share | sgemm GFLOP/s (CPU) | element-wise GB/s | "
             "attention GFLOP/s (CPU) | copies GB/s | all-reduce busbw (fit) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, rs in sorted(tr.items(), key=lambda kv: (kv[1][0]["ranks"], kv[0])):
        if "predicted" not in rs[0]["overlap"]:
            continue
        rs, kept = keep(rs, lambda r: r["overlap"]["cpu_share"], rs[0]["oversubscribed"])
        r0 = rs[0]
        o = [r["overlap"] for r in rs]
        pred = med([x["predicted"]["seconds"] * 1e3 for x in o])
        meas = med([x["step_ms"] for x in o])
        pc = med([x["predicted_compute_tp"] * 1e3 for x in o])
        mc = med([x.get("measured_compute_cpu", x.get("measured_compute_cpu_scaled")) * 1e3 for x in o])
        cal = [r["calibration"] for r in rs]
        tag = " (oversubscribed)" if r0["oversubscribed"] else ""
        busbw = r0.get("allreduce_busbw")
        lines.append(
            f"| {r0['label']}{tag} | {r0['ranks']} | {pred:.0f} | {meas:.0f} | {meas / pred:.2f} | {pc:.0f} | {mc:.0f} | "
            f"{mc / pc:.2f} | {kept} | {med([x['cpu_share'] for x in o]):.2f} | "
            f"{med([c['gemm_gflops_cpu'] for c in cal]):.0f} | {med([c['elementwise_gbps_cpu'] for c in cal]):.1f} | "
            f"{fmt_or(med([c.get('attention_gflops_cpu') for c in cal]), '{:.0f}', '-')} | "
            f"{fmt_or(med([c.get('copy_gbps_cpu') for c in cal]), '{:.0f}', '-')} | "
            f"{fmt_or(med([c.get('allreduce_busbw_gbps') for c in cal]), '{:.2f} GB/s', '-')} |")
    return lines


def main():
    out = sys.argv[1]
    body = ["## Pipeline bubble (schedule_bench)"] + schedule_tables(out)
    body += ["", "## End to end (train_bench)"] + train_tables(out)
    print("\n".join(body))
    with open(os.path.join(out, "planner_cpu.md"), "w") as fh:
        fh.write("\n".join(planner_table(out)) + "\n")


if __name__ == "__main__":
    main()
