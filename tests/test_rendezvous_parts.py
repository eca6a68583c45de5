"""trainer/loop/rendezvous.py in-process (issue 40): what the host node says when it cannot serve the store, and
the rendezvous state refused unless this job's secret sealed it."""
from __future__ import annotations

import socket
from datetime import timedelta

import pytest

from minilmd.trainer.loop import rendezvous


def test_a_taken_port_is_told_as_taken():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(rendezvous.RendezvousRefused) as refused:
            rendezvous._serve("127.0.0.1", port, timedelta(seconds=5))
    assert f"cannot listen on port {port}: another process holds it" in str(refused.value)


@pytest.mark.slow
def test_a_host_name_that_does_not_resolve_is_not_told_as_a_taken_port():
    with socket.socket() as probe:  # a port free a moment ago: the failure is the name, not the port
        probe.bind(("", 0))
        port = probe.getsockname()[1]
    with pytest.raises(rendezvous.RendezvousRefused) as refused:
        rendezvous._serve("no-such-host.invalid", port, timedelta(seconds=2))
    said = str(refused.value)
    assert "another process holds it" not in said, said
    assert f"cannot serve its store at no-such-host.invalid:{port}" in said and "resolves here" in said, said
