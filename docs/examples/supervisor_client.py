#!/usr/bin/env python3
"""psfleet from Python: a job's status, its checkpoints, and its progress as it happens.

Talks to chiefd's psfleet.v1.Supervisor service with grpcio and stubs generated from proto/ (see
docs/python-client.md for the protoc command). With --read-checkpoint it also opens the newest
checkpoint with the `safetensors` package (pip install safetensors numpy).

    python3 supervisor_client.py --address 127.0.0.1:2222 --stubs ./stubs [--save] [--read-checkpoint]
    python3 supervisor_client.py --address 10.0.0.1:2222 --tls /etc/psfleet/tls --job demo [--identity viewer]

A job beyond loopback speaks mutual TLS: --tls gives the directory `psfleet certs` filled, --job the
job's name; the client presents the admin's certificate (--save needs it) or the viewer's.

Exit status: 0 when the job is done, 1 when it failed or the chief could not be reached.
"""
import argparse
import sys

import grpc


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--address", required=True, help="the chief, HOST:PORT (the job file's cluster.chief[0])")
    ap.add_argument("--stubs", default="stubs", help="directory with the generated psfleet/v1/*_pb2*.py")
    ap.add_argument("--save", action="store_true", help="ask for a checkpoint now")
    ap.add_argument("--read-checkpoint", action="store_true", help="open the newest checkpoint at the end")
    ap.add_argument("--tls", metavar="DIR", help="mutual TLS with the certificates in DIR/JOB/ (psfleet certs)")
    ap.add_argument("--job", help="with --tls: the job's name")
    ap.add_argument("--identity", default="admin", choices=("admin", "viewer"), help="with --tls: whose certificate")
    args = ap.parse_args()
    if args.tls and not args.job:
        ap.error("--tls needs --job")

    sys.path.insert(0, args.stubs)
    from psfleet.v1 import supervisor_pb2 as sv
    from psfleet.v1 import supervisor_pb2_grpc as sv_grpc

    state = sv.JobState.Name
    # Checkpoints are small messages, but a client that also pulls variables must lift the 4 MiB limit.
    options = [("grpc.max_receive_message_length", -1)]
    if args.tls:
        def rd(name):
            with open("%s/%s/%s" % (args.tls, args.job, name), "rb") as f:
                return f.read()
        creds = grpc.ssl_channel_credentials(root_certificates=rd("ca.crt"), private_key=rd(args.identity + ".key"),
                                             certificate_chain=rd(args.identity + ".crt"))
        # the chief's certificate names it, whatever address it is reached at
        options.append(("grpc.ssl_target_name_override", "chief.%s.psfleet" % args.job))
        channel = grpc.secure_channel(args.address, creds, options=options)
    else:
        channel = grpc.insecure_channel(args.address, options=options)
    with channel:
        chief = sv_grpc.SupervisorStub(channel)
        try:
            st = chief.GetStatus(sv.StatusRequest(), timeout=5)
        except grpc.RpcError as e:
            print("cannot reach the chief at %s: %s" % (args.address, e.details()), file=sys.stderr)
            return 1
        print("job %s (fingerprint %016x): %s at global_step %d of %d%s"
              % (st.job, st.fingerprint, state(st.state), st.global_step, st.max_steps,
                 " - " + st.reason if st.reason else ""))

        if args.save:
            # Answers once the file is durable and recorded; UNAVAILABLE while the job is not ready yet.
            rep = chief.SaveCheckpoint(sv.SaveCheckpointRequest(reason="python example"), timeout=120)
            ck = rep.checkpoint
            print("checkpoint at global_step %d: %s (%d bytes, %s)%s"
                  % (ck.global_step, ck.path, ck.bytes, ck.checksum, ", already there" if rep.existing else ""))

        listing = chief.ListCheckpoints(sv.ListCheckpointsRequest(), timeout=5)
        print("%d checkpoint(s) in %s, keeping %d:" % (len(listing.checkpoints), listing.checkpoint_dir, listing.keep))
        for ck in listing.checkpoints:     # newest first
            print("  step %6d  %-7s  %s" % (ck.global_step, ck.trigger, ck.path))

        # The Watch stream: a JobStatus at once, then as things change; it ends after DONE or FAILED.
        last = None
        for st in chief.Watch(sv.WatchRequest(min_interval_ms=500)):
            line = "%-8s step %d/%d" % (state(st.state)[len("JOB_STATE_"):].lower(), st.global_step, st.max_steps)
            if st.loss == st.loss:          # NaN until the workers report
                line += "  loss %.4f" % st.loss
            if st.steps_per_s > 0:
                line += "  %.0f steps/s  ETA %.0f s" % (st.steps_per_s, max(st.eta_s, 0))
            if st.HasField("last_checkpoint"):
                line += "  checkpoint %d" % st.last_checkpoint.global_step
            print(line, flush=True)
            last = st

    if last is None or last.state != sv.JOB_STATE_DONE:
        print("the job failed: %s" % (last.reason if last else "no status"), file=sys.stderr)
        return 1
    print("done: test accuracy %.4f, test loss %.4f" % (last.test_accuracy, last.test_loss))

    if args.read_checkpoint and last.HasField("last_checkpoint"):
        from safetensors import safe_open
        with safe_open(last.last_checkpoint.path, framework="np") as f:
            meta = f.metadata()
            print("%s: global_step %s, optimizer %s" % (last.last_checkpoint.path, meta["global_step"], meta["optimizer"]))
            for name in f.keys():
                t = f.get_tensor(name)
                print("  %-24s %-12s %s" % (name, "x".join(map(str, t.shape)), t.dtype))
    return 0


if __name__ == "__main__":
    sys.exit(main())
