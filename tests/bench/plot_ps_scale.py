#!/usr/bin/python3
"""Draws bench_ps_scale's JSON lines: push latency (p50, p99) and pushes/s against the number of
workers, and, for the longest run, per tenth of its pushes: p99 latency (in ms, and over the probe's
time, i.e. in units of how fast the machine was then) and psd's peak RSS, each with a band of ±10 %
around its mean over tenths 2-10.
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

    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 4))
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

    def band(ax, xs, ys, color):
        mean = sum(ys[1:]) / len(ys[1:])
        ax.fill_between([xs[1], xs[-1]], [mean * 0.9] * 2, [mean * 1.1] * 2, color=color, alpha=0.12)

    p99 = [r["p99_ms"] for r in lat]
    b.plot(k, p99, "s-", color="C1", label="p99 push latency (ms)")
    band(b, k, p99, "C1")
    if all(r.get("probe_ms") for r in lat):
        q = [r["p99_over_probe"] for r in lat]
        b.plot(k, q, "d-", color="C2", label="p99 / probe (machine speed)")
        band(b, k, q, "C2")
    b.set_xlabel("tenth of %d pushes, %d workers%s" % (longest["pushes"], longest["workers"],
                 ", paced at %d pushes/s" % longest["rate"] if longest.get("rate") else ""))
    b.set_ylim(bottom=0)
    b.legend(loc="lower right", fontsize=8)
    b.set_title("p99 over the run (bands: ±10 % of the mean of 2-10)")

    peak = [r.get("psd_rss_peak_mb", r["psd_rss_mb"]) for r in win]
    c.plot([r["window"] for r in win], peak, "o-", color="gray", label="psd peak RSS (MB)")
    band(c, [r["window"] for r in win], peak, "gray")
    c.set_ylim(bottom=0)
    c.set_xlabel("tenth of the same run")
    c.legend(loc="lower right", fontsize=8)
    c.set_title("psd's memory over the run")
    fig.tight_layout()
    fig.savefig(sys.argv[1], dpi=90)


if __name__ == "__main__":
    main()
