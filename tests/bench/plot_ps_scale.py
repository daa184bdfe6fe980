#!/usr/bin/python3
"""Draws bench_ps_scale's JSON lines: push latency (p50, p99) and pushes/s against the number of
workers, and, for the longest run, p99 latency and psd's RSS per tenth of its pushes.
Usage: plot_ps_scale.py OUT.png RUN.jsonl [RUN.jsonl ...]   (needs matplotlib)"""
import json
import sys

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    rows = [json.loads(line) for path in sys.argv[2:] for line in open(path) if line.startswith("{")]
    scale = {}
    for r in rows:
        if r["bench"] == "ps_scale" and (r["workers"] not in scale or r["pushes"] < scale[r["workers"]]["pushes"]):
            scale[r["workers"]] = r   # the table's run (the shorter one) per worker count
    longest = max((r for r in rows if r["bench"] == "ps_scale"), key=lambda r: r["pushes"])
    lat = [r for r in rows if r["bench"] == "ps_scale_latency_window" and r["workers"] == longest["workers"]][-10:]
    win = [r for r in rows if r["bench"] == "ps_scale_window" and r["workers"] == longest["workers"]][-10:]

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    ws = sorted(scale)
    a.plot(ws, [scale[w]["p50_ms"] for w in ws], "o-", label="p50 push latency")
    a.plot(ws, [scale[w]["p99_ms"] for w in ws], "s-", label="p99 push latency")
    a.set_xscale("log", base=2)
    a.set_yscale("log")
    a.set_xlabel("simulated workers (one psd, gRPC, closed loop)")
    a.set_ylabel("ms")
    a.grid(True, which="both", alpha=0.3)
    a2 = a.twinx()
    a2.plot(ws, [scale[w]["pushes_per_s"] for w in ws], "^--", color="gray", label="pushes/s")
    a2.set_ylabel("pushes/s")
    a2.set_ylim(bottom=0)
    lines = a.get_legend_handles_labels()[0] + a2.get_legend_handles_labels()[0]
    a.legend(lines, [l.get_label() for l in lines], loc="upper left", fontsize=8)
    a.set_title("push latency and throughput against workers")

    k = [r["window"] for r in lat]
    b.plot(k, [r["p99_ms"] for r in lat], "s-", label="p99 push latency (ms)")
    b.set_xlabel("tenth of %d pushes, %d workers%s" % (longest["pushes"], longest["workers"],
                 ", paced at %d pushes/s" % longest["rate"] if longest.get("rate") else ""))
    b.set_ylabel("ms")
    b.set_ylim(bottom=0)
    b2 = b.twinx()
    b2.plot([r["window"] for r in win], [r.get("psd_rss_peak_mb", r["psd_rss_mb"]) for r in win], "o--", color="gray",
            label="psd peak RSS (MB)")
    b2.set_ylabel("MB")
    b2.set_ylim(bottom=0)
    lines = b.get_legend_handles_labels()[0] + b2.get_legend_handles_labels()[0]
    b.legend(lines, [l.get_label() for l in lines], loc="lower right", fontsize=8)
    b.set_title("over the run: flat or not")
    fig.tight_layout()
    fig.savefig(sys.argv[1], dpi=90)


if __name__ == "__main__":
    main()
