"""A no-room exit (74, fault.json kind scratch_full) from another node's scratch (review11a F2b): every node's local
rank 0 takes its own scratch's lock, and the supervisor's wait for room measures only its own node's scratch, so it
found room and relaunched at once, uncounted, for as long as the other node stayed full. The trainer names its host
in the fault; another host's is a counted failure with backoff, bounded by restart.max_restarts. Real supervisor, the
fake trainer exiting 74 as node "elsewhere" would."""
from __future__ import annotations

import socket

import pytest

from minilmd import protocol
from minilmd.daemon.attempt import on_another_node
from minilmd.daemon.base.states import Cause
from minilmd.daemon.child.death import Death
from supervisor_helpers import start_supervisor, state, wait_or_kill, write_config

OTHER = "elsewhere-node-7"


@pytest.mark.slow
def test_another_nodes_full_scratch_is_a_counted_restart_not_an_endless_wait(tmp_path, corpus):
    assert socket.gethostname() != OTHER
    config = write_config(tmp_path, corpus, remote=False, restart={"max_restarts": 2, "backoff_initial": "0.1s",
                                                                   "backoff_max": "0.2s"})
    proc = start_supervisor(config, tmp_path / "supervisor.out", FAKE_SCRATCH_FULL_ON=OTHER)
    rc = wait_or_kill(proc, 120)  # before: waiting_space <-> starting, for ever (killed here)
    final = state(tmp_path / "s" / "run")
    assert rc == protocol.SUPERVISOR_GAVE_UP, (rc, final.get("reason"))
    assert len(final["restarts"]) == 2 and all(r["cause"] == "crash" for r in final["restarts"]), final["restarts"]
    assert OTHER in final["restarts"][0]["detail"], final["restarts"][0]


def test_this_nodes_full_scratch_or_a_fault_without_host_is_waited_for_as_before():
    for fault in ({"kind": "scratch_full", "host": socket.gethostname()}, {"kind": "scratch_full"}):
        death = Death(Cause.SCRATCH_FULL, 74, "scratch full", fault)
        assert on_another_node(death) is death
