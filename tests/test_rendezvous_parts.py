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


def test_a_missing_secret_is_one_line_and_exit_2(monkeypatch, capsys):
    """Run by hand without `export MINILMD_RDZV_SECRET`: on main torch's agent printed a 34-line traceback ending in
    the refusal. Now one line, what to set, and exit 2 (a config error: final) before the agent starts."""
    monkeypatch.delenv(rendezvous.RDZV_SECRET_ENV, raising=False)
    started = []
    monkeypatch.setattr("minilmd.trainer.loop.torchrun.run", started.append)
    for argv in (["--rdzv-backend", "minilmd-c10d"], ["--rdzv_backend=minilmd-c10d"]):
        with pytest.raises(SystemExit) as ended:
            rendezvous.main([*argv, "--nnodes", "2", "-m", "minilmd.cli", "train", "run.toml"])
        assert ended.value.code == 2
        (line,) = capsys.readouterr().err.splitlines()
        assert line.startswith("minilmd rendezvous: MINILMD_RDZV_SECRET is not set") and "openssl rand -hex 32" in line
    assert started == []
    monkeypatch.setenv(rendezvous.RDZV_SECRET_ENV, "ab" * 32)  # with the secret: torchrun is started
    rendezvous.main(["--rdzv-backend", "minilmd-c10d", "-m", "minilmd.cli", "train", "run.toml"])
    assert len(started) == 1
    monkeypatch.delenv(rendezvous.RDZV_SECRET_ENV)  # c10d, torch's own backend: no secret asked for
    rendezvous.main(["--rdzv-backend", "c10d", "-m", "minilmd.cli", "train", "run.toml"])
    assert len(started) == 2


def test_only_the_backend_option_chooses_the_rendezvous(monkeypatch):
    """Before: any argument equal to minilmd-c10d (`--rdzv-id minilmd-c10d` with torch's c10d backend) was taken for
    the backend, and that run was told to export a secret, exit 2."""
    monkeypatch.delenv(rendezvous.RDZV_SECRET_ENV, raising=False)
    started = []
    monkeypatch.setattr("minilmd.trainer.loop.torchrun.run", started.append)
    rendezvous.main(["--rdzv-backend", "c10d", "--rdzv-id", "minilmd-c10d", "-m", "minilmd.cli", "train", "r.toml"])
    rendezvous.main(["--rdzv_id=minilmd-c10d", "--rdzv-backend=c10d", "-m", "minilmd.cli", "train", "r.toml"])
    assert len(started) == 2
    with pytest.raises(SystemExit) as ended:  # the backend option's value still chooses it, the last one given
        rendezvous.main(["--rdzv-backend", "c10d", "--rdzv-backend", "minilmd-c10d", "-m", "minilmd.cli", "train"])
    assert ended.value.code == 2 and len(started) == 2
