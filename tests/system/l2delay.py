"""A user-space link between two network interfaces that delays and drops frames: the netem substitute
for kernels without the netem qdisc (../../../shared/notes/multinode-nspawn.md). Frames that arrive on A
leave through B after --delay-ab ms, a fraction --loss-ab % of them dropped; the same from B to A with
the -ba options. Standard library only; run as root. On SIGTERM it prints what it passed and dropped.

  l2delay.py IF_A IF_B [--delay-ab MS] [--loss-ab PCT] [--delay-ba MS] [--loss-ba PCT] [--seed N]
"""
import argparse
import heapq
import random
import select
import signal
import socket
import sys
import time

# (socket.SOL_PACKET is missing from Debian 12's Python 3.11)
SOL_PACKET, ETH_P_ALL, PACKET_VNET_HDR, PACKET_IGNORE_OUTGOING, PACKET_OUTGOING = 263, 3, 15, 23, 4


def packet_socket(ifname):
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    # The virtio-net header keeps the GSO and partial-checksum metadata: frames above the MTU pass.
    s.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
    s.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    s.bind((ifname, ETH_P_ALL))
    s.setblocking(False)
    return s


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("a")
    p.add_argument("b")
    for k in ("delay-ab", "delay-ba", "loss-ab", "loss-ba"):
        p.add_argument("--" + k, type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    o = p.parse_args()
    rng = random.Random(o.seed)
    sa, sb = packet_socket(o.a), packet_socket(o.b)
    route = {sa: (sb, o.delay_ab / 1e3, o.loss_ab / 100, "ab"), sb: (sa, o.delay_ba / 1e3, o.loss_ba / 100, "ba")}
    stats = {"ab": {"passed": 0, "dropped": 0}, "ba": {"passed": 0, "dropped": 0}}
    heap, seq = [], 0

    def done(*_):
        print("l2delay: %s" % stats, file=sys.stderr, flush=True)
        sys.exit(0)

    signal.signal(signal.SIGTERM, done)
    signal.signal(signal.SIGINT, done)
    print("l2delay: %s <-> %s, delay %g/%g ms, loss %g/%g %%" % (o.a, o.b, o.delay_ab, o.delay_ba, o.loss_ab,
                                                                 o.loss_ba), file=sys.stderr, flush=True)
    while True:
        wait = None if not heap else max(0.0, heap[0][0] - time.monotonic())
        ready, _, _ = select.select((sa, sb), (), (), wait)
        for s in ready:
            out, delay, loss, k = route[s]
            while True:
                try:
                    data, addr = s.recvfrom(1 << 18)
                except BlockingIOError:
                    break
                if addr[2] == PACKET_OUTGOING:
                    continue
                if loss and rng.random() < loss:
                    stats[k]["dropped"] += 1
                    continue
                stats[k]["passed"] += 1
                seq += 1
                heapq.heappush(heap, (time.monotonic() + delay, seq, out, data))
        now = time.monotonic()
        while heap and heap[0][0] <= now:
            _, _, out, data = heapq.heappop(heap)
            try:
                out.send(data)
            except OSError as e:
                print("l2delay: send: %s" % e, file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
