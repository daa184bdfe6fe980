"""The metrics endpoint under mutual TLS: HTTPS with the daemon's own certificate, for scrapers whose
client certificate chains to the job's CA and names a task of the job (transport/authz, "GET /metrics").

A chief, a ps and a worker under security.mode mtls with certificates from `psfleet certs`; the ps's
metrics.listen is 0.0.0.0 (beyond loopback: allowed now that it speaks TLS), scraped over 127.0.0.1:
- the viewer's certificate: 200, an exposition that passes `promtool check metrics`, counters that move;
  the client checks the server's certificate as the task's name (ps-0.JOB.psfleet);
- no client certificate, a certificate of another job's CA, and a certificate of the job's own CA that
  names no task of the job: 403 with the reason, and a line in the daemon's log naming the address;
- plain HTTP on the HTTPS port gets no exposition;
- a real Prometheus with tls_config (ca_file, cert_file, key_file, server_name) scrapes all three:
  up == 1 and the examples rate above zero.
Skips (77) only when Debian's prometheus package (promtool, prometheus) is missing."""
import json
import os
import shutil
import socket
import ssl
import subprocess
import urllib.parse
import urllib.request

import harness as h

JOB = "mtlsmetrics"


def get(addr, server, tls_dir, cert=None, job=JOB):
    """GET /metrics over HTTPS as `cert` ("viewer", a path prefix, or None); the server's certificate is
    checked against the job's CA as `server`. Returns (status, body)."""
    ctx = ssl.create_default_context(cafile=os.path.join(tls_dir, JOB, "ca.crt"))
    if cert:
        prefix = cert if os.path.isabs(cert) else os.path.join(tls_dir, job, cert)
        ctx.load_cert_chain(prefix + ".crt", prefix + ".key")
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname=server) as s:
            s.sendall(b"GET /metrics HTTP/1.0\r\nHost: metrics\r\n\r\n")
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode()


def value(text, series):
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    raise AssertionError("no series %s in:\n%s" % (series, text[:2000]))


def intruder(wd, tls_dir):
    """A key and certificate signed by the job's own CA whose name is no task of the job."""
    d = os.path.join(tls_dir, JOB)
    prefix = wd.file("intruder")
    ext = wd.file("intruder.ext")
    with open(ext, "w") as f:
        f.write("subjectAltName=DNS:intruder.%s.psfleet\nextendedKeyUsage=clientAuth\n" % JOB)
    for argv in (["openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", prefix + ".key"],
                 ["openssl", "req", "-new", "-key", prefix + ".key", "-subj", "/CN=intruder", "-out", prefix + ".csr"],
                 ["openssl", "x509", "-req", "-in", prefix + ".csr", "-CA", os.path.join(d, "ca.crt"), "-CAkey",
                  os.path.join(d, "ca.key"), "-CAcreateserial", "-days", "1", "-extfile", ext, "-out",
                  prefix + ".crt"]):
        subprocess.run(argv, check=True, capture_output=True, timeout=30)
    return prefix


def prom_query(api, q):
    with urllib.request.urlopen("http://%s/api/v1/query?%s" % (api, urllib.parse.urlencode({"query": q})),
                                timeout=10) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]["result"]


def test():
    h.require("psd", "workerd", "chiefd", "psfleet")
    prom = shutil.which("prometheus")
    if not shutil.which("promtool") or not prom:
        h.skip("promtool or prometheus not installed (Debian's prometheus package)")
    wd = h.Workdir()
    tls_dir, other_dir = wd.file("tls"), wd.file("other-ca")
    ports = h.free_ports(4)
    api = "127.0.0.1:%d" % ports[0]
    m_chief, m_ps_bind, m_w = "127.0.0.1:%d" % ports[1], "0.0.0.0:%d" % ports[2], "127.0.0.1:%d" % ports[3]
    m_ps = "127.0.0.1:%d" % ports[2]
    base = dict(h.load_example(), job=JOB, metrics={"listen": m_chief})
    base["security"] = {"mode": "mtls", "ca": tls_dir + "/{job}/ca.crt", "cert": tls_dir + "/{job}/{task}.crt",
                        "key": tls_dir + "/{job}/{task}.key"}
    job, spec = h.make_job(wd, n_ps=1, n_workers=1, base=base,
                           training={"max_steps": 100000000, "report_every_steps": 10})
    h.psfleet_certs(wd, job, tls_dir)
    other, _ = h.make_job(wd, "other.json", base=dict(base, job="otherjob"))
    h.psfleet_certs(wd, other, other_dir)
    h.use_tls(tls_dir, spec, "admin")

    chief = h.daemon(wd, "chiefd", job)
    ps = h.daemon(wd, "psd", job, 0, env={"PSFLEET_METRICS_LISTEN": m_ps_bind})
    w = h.daemon(wd, "workerd", job, 0, env={"PSFLEET_METRICS_LISTEN": m_w})
    procs = [chief, ps, w]
    h.wait_state(spec["cluster"]["chief"][0], "TRAINING", 60, procs)
    servers = {m_chief: "chief.%s.psfleet" % JOB, m_ps: "ps-0.%s.psfleet" % JOB, m_w: "worker-0.%s.psfleet" % JOB}

    # ---- the viewer scrapes every daemon; the exposition is valid and moves
    first = {}
    for addr, server in servers.items():
        code, body = get(addr, server, tls_dir, "viewer")
        assert code == 200, (addr, code, body[:300])
        p = subprocess.run(["promtool", "check", "metrics"], input=body.encode(), capture_output=True, timeout=30)
        assert p.returncode == 0, (addr, p.stdout, p.stderr)
        first[addr] = body
    h.wait_for("ps pushes counted over HTTPS", lambda: value(get(m_ps, servers[m_ps], tls_dir, "viewer")[1],
                                                             'psfleet_ps_pushes_total{shard="0"}') >
               value(first[m_ps], 'psfleet_ps_pushes_total{shard="0"}'), 60, procs)
    assert "ps-0.%s.psfleet" % JOB == servers[m_ps]   # and the client checked that name (check_hostname)
    try:
        get(m_ps, "chief.%s.psfleet" % JOB, tls_dir, "viewer")
        raise AssertionError("the client accepted ps 0's certificate as the chief's")
    except ssl.SSLCertVerificationError:
        pass

    # ---- whoever is not of the job is refused, with the reason, and logged
    for who, cert, words in (("no certificate", None, "no client certificate"),
                             ("another job's CA", os.path.join(other_dir, "otherjob", "viewer"), "not valid"),
                             ("the job's CA, no task's name", intruder(wd, tls_dir), "unknown")):
        code, body = get(m_ps, servers[m_ps], tls_dir, cert)
        h.log("%-28s %d %s" % (who, code, body.strip()[:140]))
        assert code == 403 and words in body, (who, code, body)
        assert "psfleet_" not in body, who
    h.wait_for("the refusals in psd's log", lambda: ps.stderr().count("refused a scrape of /metrics from 127.0.0.1")
               >= 3, 10, procs)

    # ---- plain HTTP on the HTTPS port: no exposition
    try:
        with urllib.request.urlopen("http://%s/metrics" % m_ps, timeout=5) as r:
            assert "psfleet_" not in r.read().decode(errors="replace"), "plain HTTP got the metrics"
    except (OSError, ValueError) as e:
        h.log("plain HTTP:", type(e).__name__, e)

    # ---- a real Prometheus with tls_config
    d = os.path.join(tls_dir, JOB)
    with open(wd.file("prometheus.yml"), "w") as f:
        f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n")
        for addr, server in servers.items():
            f.write("  - job_name: %s\n    scheme: https\n    tls_config:\n      ca_file: %s\n      cert_file: %s\n"
                    "      key_file: %s\n      server_name: %s\n    static_configs:\n      - targets: [\"%s\"]\n"
                    % (server.split(".")[0], d + "/ca.crt", d + "/viewer.crt", d + "/viewer.key", server, addr))
    p = h.Proc(wd, "prometheus", [prom, "--config.file=" + wd.file("prometheus.yml"),
                                  "--storage.tsdb.path=" + wd.file("tsdb"), "--web.listen-address=" + api,
                                  "--log.level=warn"])

    def up_all():
        try:
            up = prom_query(api, "up")
            rate = prom_query(api, "sum(rate(psfleet_worker_examples_total[5s]))")
        except OSError:
            return False
        return len(up) == 3 and all(r["value"][1] == "1" for r in up) and rate and float(rate[0]["value"][1]) > 0

    h.wait_for("prometheus scraping all three over HTTPS, the examples rate above zero", up_all, 60, procs + [p])
    h.log("prometheus: up", [(r["metric"]["job"], r["value"][1]) for r in prom_query(api, "up")])
    for pr in procs + [p]:
        pr.kill()
    for pr in procs + [p]:
        pr.wait(60)


if __name__ == "__main__":
    h.main(test)
