"""Free loopback ports for a test's daemons, below the kernel's ephemeral range.

A port picked by binding port 0 comes from the ephemeral range, where every outgoing connection of
this host (other tests' gRPC clients among them) also takes its own port: between the pick and the
daemon's bind, one may take it ("Address already in use"). Ports below that range are never handed
out that way, so a random one that binds now is one only another test's pick could collide with.

As a program: `python3 ports.py N` prints N such ports on one line."""
import random
import socket
import sys

LOWEST = 20000


def ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(n):
    """n distinct free loopback ports (held together while picking, so they differ)."""
    hi = ephemeral_low() - 1
    if hi - LOWEST < 1000:   # a port range that leaves no room below it: the ephemeral range it is
        return ephemeral_ports(n)
    rng = random.SystemRandom()
    socks = []
    try:
        while len(socks) < n:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind(("127.0.0.1", rng.randint(LOWEST, hi)))
            except OSError:
                s.close()
                continue
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def ephemeral_ports(n):
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


if __name__ == "__main__":
    print(*free_ports(int(sys.argv[1])))
