#!/usr/bin/python3
"""Draws docs/grafana/psfleet-dashboard.png: the panels of the Grafana dashboard (psfleet.json), each
with the series a real Prometheus scraped from a local job. Grafana itself is not packaged in Debian,
so this is matplotlib drawing the same queries' answers. The series come from
    PSFLEET_METRICS_DUMP=/tmp/series.json ctest --preset ci -R integration.metrics_prometheus
(1 ps + 2 workers of the demo model for 30 s, scraped every second); then
    docs/grafana/plot.py /tmp/series.json docs/grafana/psfleet-dashboard.png"""
import re
import sys

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import json  # noqa: E402


def label(fmt, metric):
    return re.sub(r"\{\{(\w+)\}\}", lambda m: metric.get(m.group(1), "?"), fmt)


def main(src, dst):
    d = json.load(open(src))
    panels = d["panels"]
    cols = 2
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(12, 3.2 * rows))
    t0 = d["start"]
    for ax, p in zip(axes.flat, panels):
        for s in p["series"]:
            for r in s["result"]:
                xs = [float(v[0]) - t0 for v in r["values"]]
                ys = [float(v[1]) for v in r["values"]]
                ax.plot(xs, ys, label=label(s["legend"], r["metric"]))
        unit = {"s": "seconds", "Bps": "bytes/s", "short": ""}.get(p["unit"], p["unit"])
        ax.set_title(p["title"], fontsize=10)
        ax.set_ylabel(unit)
        ax.set_xlabel("seconds into the run")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle("psfleet dashboard (docs/grafana/psfleet.json): 1 ps + 2 workers, demo MLP, scraped by Prometheus every 1 s",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(dst, dpi=80)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
