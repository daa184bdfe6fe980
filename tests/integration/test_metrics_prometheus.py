"""A real Prometheus (Debian's prometheus package) scrapes every daemon of a job every second for
about 30 s, and its HTTP API answers the examples rate (sum(rate(psfleet_worker_examples_total[10s])))
with a value above zero; so do the per-shard push latency quantile and the job-state query the
Grafana dashboard (docs/grafana/psfleet.json) uses. With PSFLEET_METRICS_DUMP=FILE the dashboard's
series are written there as query_range results (docs/grafana/plot.py draws them). Skips (77) only
when prometheus is missing."""
import json
import os
import shutil
import time
import urllib.parse
import urllib.request

import harness as h

RUN_S = 30


def query(api, q, path="query", **extra):
    args = dict(query=q, **extra)
    with urllib.request.urlopen("http://%s/api/v1/%s?%s" % (api, path, urllib.parse.urlencode(args)),
                                timeout=10) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]["result"]


def ready(api):
    try:
        with urllib.request.urlopen("http://%s/-/ready" % api, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def test():
    h.plain_rpc()   # its own gRPC clients call the daemons as any role
    h.require("psd", "workerd", "chiefd")
    prom = shutil.which("prometheus")
    if not prom:
        h.skip("prometheus not installed (Debian's prometheus package)")
    wd = h.Workdir()
    ports = h.free_ports(5)
    api = "127.0.0.1:%d" % ports[0]
    m = ["127.0.0.1:%d" % p for p in ports[1:]]   # chief, ps 0, worker 0, worker 1
    job, spec = h.make_job(wd, n_ps=1, n_workers=2, training={"max_steps": 100000000, "report_every_steps": 20})
    chief_addr = spec["cluster"]["chief"][0]
    with open(wd.file("prometheus.yml"), "w") as f:
        f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                "scrape_configs:\n  - job_name: psfleet\n    static_configs:\n      - targets: [%s]\n"
                % ", ".join('"%s"' % a for a in m))
    chief = h.daemon(wd, "chiefd", job, env={"PSFLEET_METRICS_LISTEN": m[0]})
    ps = h.daemon(wd, "psd", job, 0, env={"PSFLEET_METRICS_LISTEN": m[1]})
    ws = [h.daemon(wd, "workerd", job, i, env={"PSFLEET_METRICS_LISTEN": m[2 + i]}) for i in range(2)]
    procs = [chief, ps] + ws
    p = h.Proc(wd, "prometheus", [prom, "--config.file=" + wd.file("prometheus.yml"),
                                  "--storage.tsdb.path=" + wd.file("tsdb"), "--web.listen-address=" + api,
                                  "--log.level=warn"])
    h.wait_for("prometheus ready", lambda: ready(api), 60, [p])
    h.wait_state(chief_addr, "TRAINING", 60, procs)
    t0 = time.time()
    while time.time() - t0 < RUN_S:
        for pr in procs + [p]:
            assert pr.alive(), "%s exited:\n%s" % (pr.name, pr.stderr()[-3000:])
        time.sleep(1)

    up = query(api, "up")
    assert len(up) == 4 and all(r["value"][1] == "1" for r in up), up
    rate = query(api, "sum(rate(psfleet_worker_examples_total[10s]))")
    h.log("examples/s:", rate)
    assert rate and float(rate[0]["value"][1]) > 0, rate
    per_worker = query(api, "rate(psfleet_worker_examples_total[10s])")
    assert sorted(r["metric"]["worker"] for r in per_worker) == ["0", "1"], per_worker
    assert all(float(r["value"][1]) > 0 for r in per_worker), per_worker
    p99 = query(api, "histogram_quantile(0.99, sum by (shard, le) (rate(psfleet_worker_push_seconds_bucket[10s])))")
    assert p99 and 0 < float(p99[0]["value"][1]) < 30, p99
    state = query(api, 'psfleet_chief_job_state{state="TRAINING"}')
    assert state and state[0]["value"][1] == "1", state

    dump = os.environ.get("PSFLEET_METRICS_DUMP")
    if dump:
        dash = json.load(open(os.path.join(h.SOURCE_DIR, "docs", "grafana", "psfleet.json")))
        out = {"start": t0, "end": time.time(), "panels": []}
        for panel in dash["panels"]:
            series = []
            for t in panel.get("targets", []):
                res = query(api, t["expr"], "query_range", start=t0, end=time.time(), step=1)
                series.append({"legend": t.get("legendFormat", ""), "result": res})
            out["panels"].append({"title": panel["title"], "unit": panel.get("fieldConfig", {}).get(
                "defaults", {}).get("unit", ""), "series": series})
        with open(dump, "w") as f:
            json.dump(out, f)
        h.log("dashboard series written to", dump)
    # the dashboard's queries are valid PromQL and answer (every panel has data)
    dash = json.load(open(os.path.join(h.SOURCE_DIR, "docs", "grafana", "psfleet.json")))
    for panel in dash["panels"]:
        for t in panel.get("targets", []):
            assert query(api, t["expr"]), (panel["title"], t["expr"])


if __name__ == "__main__":
    h.main(test)
