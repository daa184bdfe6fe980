"""psfleet certs as an administrator runs it: a job's CA and a key and certificate per task and per
person, checked with the openssl command line (verify, names, modes); kept unless --force; one task
issued again (rotation) changes that task's files only; bad input exits 78, a file that cannot be
written 74."""
import grp
import os
import shutil
import stat
import subprocess

import harness as h


def certs(*args, env=None, expect=0):
    argv = [h.BIN["psfleet"], "certs"] + list(args)
    p = subprocess.run(argv, env=h.child_env(env), capture_output=True, text=True, timeout=120)
    h.log("psfleet certs", " ".join(args), "->", p.returncode)
    assert p.returncode == expect, "%s: exit %d, expected %d:\n%s%s" % (argv, p.returncode, expect, p.stdout,
                                                                       p.stderr)
    return p.stdout, p.stderr


def openssl(*args):
    p = subprocess.run(["openssl"] + list(args), capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, "openssl %s: %s%s" % (" ".join(args), p.stdout, p.stderr)
    return p.stdout


def snapshot(d):
    out = {}
    for n in sorted(os.listdir(d)):
        with open(os.path.join(d, n), "rb") as f:
            out[n] = f.read()
    return out


def check_leaf(d, job, task):
    crt = os.path.join(d, task + ".crt")
    dns = "%s.%s.psfleet" % (task, job)
    for purpose in ("sslserver", "sslclient"):
        out = openssl("verify", "-CAfile", os.path.join(d, "ca.crt"), "-purpose", purpose,
                      "-verify_hostname", dns, crt)
        assert out.strip() == crt + ": OK", out
    san = openssl("x509", "-in", crt, "-noout", "-ext", "subjectAltName")
    assert "DNS:" + dns in san and san.count("DNS:") == 1, san
    subject = openssl("x509", "-in", crt, "-noout", "-subject", "-nameopt", "sep_comma_plus_space")
    cn = task.replace("-", "/", 1)
    assert subject.strip() == "subject=O=psfleet, OU=%s, CN=%s" % (job, cn), subject
    eku = openssl("x509", "-in", crt, "-noout", "-ext", "extendedKeyUsage,basicConstraints")
    assert "TLS Web Server Authentication, TLS Web Client Authentication" in eku and "CA:FALSE" in eku, eku
    # the key is the certificate's
    pub_cert = openssl("x509", "-in", crt, "-noout", "-pubkey")
    pub_key = openssl("pkey", "-in", os.path.join(d, task + ".key"), "-pubout")
    assert pub_cert == pub_key, task


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def expired_ca(tls, job):
    import datetime
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "psfleet CA " + job)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=30)).not_valid_after(now - datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(key, hashes.SHA256()))
    os.makedirs(os.path.join(tls, job))
    with open(os.path.join(tls, job, "ca.crt"), "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(os.path.join(tls, job, "ca.key"), "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))


def test():
    if not os.access(h.BIN["psfleet"], os.X_OK):
        h.skip("psfleet not built")
    if not shutil.which("openssl"):
        h.skip("no openssl command")
    wd = h.Workdir()
    job, spec = h.make_job(wd, n_ps=2, n_workers=2)
    name = spec.get("job") or "job"
    tls = wd.file("tls")
    d = os.path.join(tls, name)
    tasks = ["chief", "ps-0", "ps-1", "worker-0", "worker-1", "admin", "viewer"]

    out, err = certs("--job", job, "--dir", tls)
    try:
        group = grp.getgrnam("psfleet").gr_gid
    except KeyError:
        group = None
        assert err.count("no group psfleet") == 1, err     # said once, not per key
    files = ["ca.key", "ca.crt"] + [t + e for t in tasks for e in (".key", ".crt")]
    assert sorted(os.listdir(d)) == sorted(files), os.listdir(d)
    written = [l.split()[1] for l in out.splitlines() if l.startswith("wrote ")]
    assert sorted(written) == sorted(os.path.join(d, f) for f in files), out
    assert mode(d) == 0o750
    assert mode(os.path.join(d, "ca.key")) == 0o600 and mode(os.path.join(d, "ca.crt")) == 0o644
    for t in tasks:
        assert mode(os.path.join(d, t + ".key")) == 0o640, t
        assert os.stat(os.path.join(d, t + ".key")).st_gid == (group if group is not None else os.getegid()), t
        assert mode(os.path.join(d, t + ".crt")) == 0o644, t
        check_leaf(d, name, t)
    ca = openssl("x509", "-in", os.path.join(d, "ca.crt"), "-noout", "-subject", "-ext", "basicConstraints,keyUsage",
                 "-nameopt", "sep_comma_plus_space")
    assert "CN=psfleet CA %s" % name in ca and "CA:TRUE" in ca and "Certificate Sign, CRL Sign" in ca, ca
    # distinct random serials
    serials = {openssl("x509", "-in", os.path.join(d, t + ".crt"), "-noout", "-serial") for t in tasks + ["ca"]}
    assert len(serials) == len(tasks) + 1, serials

    # Again: everything kept, nothing changed.
    before = snapshot(d)
    out, err = certs("--job", job, "--dir", tls)
    assert snapshot(d) == before and "no group" not in err, err
    assert sum(l.startswith("kept ") for l in out.splitlines()) == 2 * len(tasks), out
    assert "wrote" not in out, out

    # Rotation of one task: its two files change, nothing else; without --force it is kept.
    certs("--job", job, "--dir", tls, "--task", "worker-1")
    assert snapshot(d) == before
    out, _ = certs("--job", job, "--dir", tls, "--task", "worker-1", "--force")
    after = snapshot(d)
    changed = sorted(n for n in after if after[n] != before[n])
    assert changed == ["worker-1.crt", "worker-1.key"], changed
    check_leaf(d, name, "worker-1")
    # also as "worker:1" and by the job's name from the config directory
    conf = wd.file("etc")
    os.makedirs(os.path.join(conf, "jobs"))
    shutil.copy(job, os.path.join(conf, "jobs", name + ".json"))
    certs("--job", name, "--dir", tls, "--task", "ps:1,admin", "--force", env={"PSFLEET_CONFIG_DIR": conf})
    again = snapshot(d)
    changed = sorted(n for n in again if again[n] != after[n])
    assert changed == ["admin.crt", "admin.key", "ps-1.crt", "ps-1.key"], changed

    # A new CA (the old one moved away): the kept leaves are not its own, which is an error naming
    # them; --force issues them all again.
    os.rename(os.path.join(d, "ca.crt"), wd.file("old-ca.crt"))
    os.rename(os.path.join(d, "ca.key"), wd.file("old-ca.key"))
    _, err = certs("--job", job, "--dir", tls, expect=78)
    assert os.path.join(d, "chief.crt") in err and "not valid with this CA" in err, err
    certs("--job", job, "--dir", tls, "--force")
    for t in tasks:
        check_leaf(d, name, t)

    # A CA that has ended issues nothing (made with python3-cryptography, when it is there: neither
    # psfleet nor the openssl command makes a certificate that ended in the past).
    try:
        expired_ca(wd.file("ended"), name)
    except ImportError:
        h.log("no python3-cryptography: the ended CA is not tried")
    else:
        _, err = certs("--job", job, "--dir", wd.file("ended"), expect=78)
        assert "the CA ended" in err, err

    # Half a CA, a corrupt CA, a task not in the job, a bad job file: 78. Unwritable: 74.
    os.rename(os.path.join(d, "ca.key"), wd.file("ca.key.away"))
    _, err = certs("--job", job, "--dir", tls, expect=78)
    assert os.path.join(d, "ca.crt") in err and "without" in err, err
    with open(os.path.join(d, "ca.key"), "w") as f:
        f.write("not a key\n")
    _, err = certs("--job", job, "--dir", tls, expect=78)
    assert os.path.join(d, "ca.key") in err, err
    os.rename(wd.file("ca.key.away"), os.path.join(d, "ca.key"))
    with open(os.path.join(d, "worker-0.key"), "w") as f:
        f.write("not a key either\n")
    _, err = certs("--job", job, "--dir", tls, "--task", "worker-0", expect=78)
    assert os.path.join(d, "worker-0.key") in err and "--force" in err, err
    certs("--job", job, "--dir", tls, "--task", "worker-0", "--force")
    check_leaf(d, name, "worker-0")
    _, err = certs("--job", job, "--dir", tls, "--task", "ps-2", expect=78)
    assert "ps-2" in err, err
    _, err = certs("--job", job, "--dir", tls, "--task", "ps-0", "--task", "ps-1", expect=2)
    bad = wd.file("bad.json")
    with open(bad, "w") as f:
        f.write("{")
    _, err = certs("--job", bad, "--dir", tls, expect=78)
    assert bad in err, err
    with open(wd.file("plain"), "w") as f:
        f.write("x")
    _, err = certs("--job", job, "--dir", wd.file("plain"), expect=74)
    assert wd.file("plain") in err, err


if __name__ == "__main__":
    h.main(test)
