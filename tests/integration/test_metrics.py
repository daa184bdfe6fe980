"""Every daemon of a running job serves Prometheus metrics at metrics.listen: scraped from each (chief
through the job file's key, ps and worker through PSFLEET_METRICS_LISTEN), each scrape passes
`promtool check metrics`, and the counters move (steps, examples, pushes, global_step). A metrics
address beyond loopback on an insecure job, or a malformed one, is a config error (exit 78); a taken
port exits 75 as a taken gRPC port does. Skips (77) only when Debian's prometheus package (promtool)
is missing."""
import shutil
import subprocess
import time
import urllib.error
import urllib.request

import harness as h

EX_CONFIG, EX_TEMPFAIL = 78, 75


def scrape(addr):
    with urllib.request.urlopen("http://%s/metrics" % addr, timeout=5) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4"), r.headers
        return r.read().decode()


def value(text, series):
    """The value of one series line ("name{labels}") in an exposition."""
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    raise AssertionError("no series %s in:\n%s" % (series, text))


def promtool_ok(text, who):
    p = subprocess.run(["promtool", "check", "metrics"], input=text.encode(), capture_output=True, timeout=30)
    assert p.returncode == 0, "%s: promtool check metrics: %s%s" % (who, p.stdout.decode(), p.stderr.decode())


def test():
    h.plain_rpc()   # its own gRPC clients call the daemons as any role
    h.require("psd", "workerd", "chiefd")
    if not shutil.which("promtool"):
        h.skip("promtool not installed (Debian's prometheus package)")
    wd = h.Workdir()
    ports = h.free_ports(4)
    m_chief, m_ps0, m_ps1, m_w = ("127.0.0.1:%d" % p for p in ports)
    base = dict(h.load_example(), metrics={"listen": m_chief})
    job, spec = h.make_job(wd, n_ps=2, n_workers=1, training={"max_steps": 1000000, "report_every_steps": 10},
                           base=base)
    chief_addr = spec["cluster"]["chief"][0]
    chief = h.daemon(wd, "chiefd", job)
    ps = [h.daemon(wd, "psd", job, i, env={"PSFLEET_METRICS_LISTEN": a}) for i, a in enumerate((m_ps0, m_ps1))]
    w = h.daemon(wd, "workerd", job, 0, env={"PSFLEET_METRICS_LISTEN": m_w})
    procs = [chief, w] + ps
    h.wait_state(chief_addr, "TRAINING", 60, procs)
    h.wait_for("the chief's global_step past 50",
               lambda: value(scrape(m_chief), "psfleet_chief_global_step") > 50, 60, procs)

    first = {a: scrape(a) for a in (m_chief, m_ps0, m_ps1, m_w)}
    time.sleep(1.5)
    second = {a: scrape(a) for a in (m_chief, m_ps0, m_ps1, m_w)}
    for a, who in ((m_chief, "chiefd"), (m_ps0, "psd 0"), (m_ps1, "psd 1"), (m_w, "workerd")):
        promtool_ok(second[a], who)
        for line in second[a].splitlines():
            if line.startswith("psfleet_") and "{" not in line.split()[0]:
                name = line.split()[0]
            elif line.startswith("psfleet_"):
                name = line.split("{")[0]
            else:
                continue
            base_name = name
            for suffix in ("_bucket", "_sum", "_count"):
                if name.endswith(suffix) and "# TYPE %s histogram" % name[:-len(suffix)] in second[a]:
                    base_name = name[:-len(suffix)]
            assert "# HELP %s " % base_name in second[a] and "# TYPE %s " % base_name in second[a], (who, name)

    # docs/operations.md's table lists exactly what the daemons serve
    import os
    import re
    served = set(re.findall(r"^# TYPE (psfleet_\w+) ", "".join(second.values()), re.M))
    doc = open(os.path.join(h.SOURCE_DIR, "docs", "operations.md")).read()
    section = doc.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `(psfleet_\w+)` \|", section, re.M))
    # the embedding tables' series exist in jobs that have tables (integration.sparse_rpc checks them)
    documented -= {m for m in documented if m.startswith("psfleet_ps_sparse_")}
    # and the replicas' in jobs with ps.replicas 2 (integration.replicas checks them)
    documented -= {m for m in documented if m.startswith("psfleet_chief_shard_")}
    assert served == documented, ("served, not documented", served - documented,
                                  "documented, not served", documented - served)

    # the counters move
    for series in ('psfleet_worker_steps_total{worker="0"}', 'psfleet_worker_examples_total{worker="0"}',
                   'psfleet_worker_push_seconds_count{shard="0"}', 'psfleet_worker_push_seconds_count{shard="1"}'):
        assert value(second[m_w], series) > value(first[m_w], series), series
    assert value(second[m_w], 'psfleet_worker_examples_total{worker="0"}') == \
        64 * value(second[m_w], 'psfleet_worker_steps_total{worker="0"}')
    assert value(second[m_w], 'psfleet_worker_pull_seconds_count{worker="0"}') >= 1
    for a, s in ((m_ps0, "0"), (m_ps1, "1")):
        for series in ("psfleet_ps_pushes_total", "psfleet_ps_bytes_received_total", "psfleet_ps_bytes_sent_total",
                       "psfleet_ps_apply_seconds_count"):
            key = '%s{shard="%s"}' % (series, s)
            assert value(second[a], key) > value(first[a], key), key
    assert value(second[m_ps0], 'psfleet_ps_global_step{shard="0"}') > 50
    assert value(second[m_chief], "psfleet_chief_global_step") > value(first[m_chief], "psfleet_chief_global_step")
    assert value(second[m_chief], 'psfleet_chief_job_state{state="TRAINING"}') == 1
    assert value(second[m_chief], 'psfleet_chief_job_state{state="DONE"}') == 0
    age = value(second[m_chief], 'psfleet_chief_worker_last_report_age_seconds{worker="0"}')
    assert 0 <= age < 30, age
    assert value(second[m_chief], "psfleet_chief_checkpoint_bytes") > 0          # the step-0 checkpoint
    assert value(second[m_chief], "psfleet_chief_last_checkpoint_timestamp_seconds") > time.time() - 600

    # anything but /metrics: 404
    try:
        urllib.request.urlopen("http://%s/" % m_ps0, timeout=5)
        raise AssertionError("/ answered")
    except urllib.error.HTTPError as e:
        assert e.code == 404, e

    # a second psd of another job on a metrics port that is taken: exits 75, naming the address
    job2, _ = h.make_job(wd, "other.json", n_ps=1, n_workers=1, base=dict(h.load_example(), job="other"))
    p2 = h.daemon(wd, "psd", job2, 0, env={"PSFLEET_METRICS_LISTEN": m_ps0})
    assert p2.wait(30) == EX_TEMPFAIL, p2.stderr()
    assert m_ps0 in p2.stderr(), p2.stderr()

    for p in procs:
        p.kill()
    for p in procs:
        p.wait(60)

    # config errors, before anything listens: exit 78 with the reason
    for listen, words in (("0.0.0.0:%d" % ports[0], "beyond loopback"), ("nonsense", "HOST:PORT"),
                          ("127.0.0.1:70000", "HOST:PORT")):
        p = h.daemon(wd, "psd", job2, 0, env={"PSFLEET_METRICS_LISTEN": listen})
        assert p.wait(30) == EX_CONFIG, (listen, p.stderr())
        assert words in p.stderr(), (listen, p.stderr())


if __name__ == "__main__":
    h.main(test)
