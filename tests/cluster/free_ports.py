#!/usr/bin/env python3
"""Print N distinct free TCP ports on 127.0.0.1 (bound together, then released), for tests that
start services (Prometheus, slurmctld, the metrics endpoint) on loopback."""
import socket
import sys

n = int(sys.argv[1]) if len(sys.argv) > 1 else 1
socks = []
for _ in range(n):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
for s in socks:
    s.close()
