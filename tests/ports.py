"""Ports for the servers a test starts (torchrun's c10d rendezvous, slurmctld and slurmd), which must be named before
the server binds them. A port the kernel picks (bind to 0) lies in its ephemeral range: once released, the next
client connection anywhere on the machine (another xdist worker's gloo or TCPStore client) may be given it before
the server binds it. These are picked at random below that range, where the kernel gives out no port by itself,
and several at once are all different."""
from __future__ import annotations

import random
import socket
from pathlib import Path

LOWEST = 10000


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(count: int = 1) -> list[int]:
    """`count` different ports free on 127.0.0.1 now, outside the ephemeral range when it leaves room."""
    low, rng, held = _ephemeral_low(), random.SystemRandom(), []
    try:
        for _ in range(1000):
            if len(held) == count:
                break
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", rng.randrange(LOWEST, low) if low > LOWEST + 1000 else 0))
            except OSError:  # taken: another
                s.close()
                continue
            held.append(s)
        assert len(held) == count, f"no {count} free ports below {low}"
        return [s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()
