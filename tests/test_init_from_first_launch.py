"""`[init] from` unreachable or stalled at the very first launch (daemon/jobs/initstage.py, minilmd/init_source.py):
`run --check` passes saying it waits, the supervisor waits in staging with no trainer and status says why, and the
run finishes from the staged copy once the source is back; a source there and wrong stays a config error. Split from
tests/test_staged_inputs.py (the staging of the probe and init.from, and their outages at a restart)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from minilmd.config import load_config
from supervisor_helpers import cli, env_for, start_supervisor, state, wait_for, wait_or_kill, write_config

pytestmark = pytest.mark.slow  # most tests run a real supervisor


def _fake_pth(where: Path) -> Path:
    """A file init.from accepts as a MiniMind .pth before torch reads it (the fake trainer never loads it)."""
    where.parent.mkdir(parents=True, exist_ok=True)
    where.write_bytes(b"\0" * 4096)
    return where


def _unmount(share: Path) -> None:
    """The share's files gone, its mount point left as the empty stub an unmounted share reads as (a path that is
    not there beside other entries is a typo at a first launch: tests/test_check_truth.py)."""
    os.rename(share, share.with_name(share.name + ".gone"))
    share.mkdir()


def _mount(share: Path) -> None:
    share.rmdir()
    os.rename(share.with_name(share.name + ".gone"), share)


def test_the_config_check_waits_for_an_init_from_it_cannot_reach_and_refuses_one_there_and_wrong(tmp_path, corpus):
    """One decision (minilmd.init_source.resolve): a share gone (not mounted: its files are not there) is a wait for the
    supervisor's check, a problem for a reader that cannot wait (the trainer alone); a file there that is no .pth
    stays a config error. On main the first was a final exit 2 at the supervisor's check."""
    from minilmd.config import ConfigError
    from minilmd.daemon import preflight
    from minilmd.probes import load_checked

    base = _fake_pth(tmp_path / "share" / "base.pth")
    config = write_config(tmp_path, corpus, remote=False, init={"from": str(base)})
    _unmount(tmp_path / "share")  # the share not mounted: its mount point an empty stub
    _, waits = preflight.check_with_waits(str(config))
    (line,) = waits
    assert str(base) in line and "no such file or directory" in line and "waits for it" in line, line
    with pytest.raises(ConfigError, match="no such file or directory"):
        load_checked(config)
    (tmp_path / "notes.txt").write_text("not weights")
    wrong = write_config(tmp_path, corpus, name="wrong", remote=False, init={"from": str(tmp_path / "notes.txt")})
    with pytest.raises(ConfigError, match="not a MiniMind .pth"):
        preflight.check_with_waits(str(wrong))


def _waits_then_finishes(tmp_path, config, take_away, bring_back, what: str, **env) -> None:
    """With init.from taken away (`take_away()`): `run --check` passes saying it waits, then `minilmd run` waits
    in staging with no trainer, status saying `what`; once `bring_back()` the run finishes (exit 0) from the
    staged copy. (`--check` is brought back before it can exit: a process with a thread in a stalled FUSE request
    cannot end until the request does.)"""
    import subprocess

    out = tmp_path / "check.out"
    take_away()
    with open(out, "wb") as f:
        checking = subprocess.Popen([sys.executable, "-m", "minilmd.cli", "run", "--check", str(config)], stdout=f,
                                    stderr=subprocess.STDOUT, env=env_for(**env))
    try:
        wait_for(lambda: "waits: init.from" in out.read_text() or checking.poll() is not None, 120, "--check")
        bring_back()
        assert wait_or_kill(checking, 120) == 0, out.read_text()
    finally:
        if checking.poll() is None:
            checking.kill()
    assert "OK (run" in out.read_text() and "waits: init.from" in out.read_text(), out.read_text()
    cfg = load_config(config)
    take_away()
    proc = start_supervisor(config, tmp_path / "supervisor.out", **env)
    try:
        key = "unreachable_since" if "unreachable" in what else "stalled"
        wait_for(lambda: (state(cfg.run_dir).get("staging") or {}).get(key), 120, f"staging.{key}")
        shown = cli("status", str(cfg.run_dir)).stdout
        assert what in shown, shown
        st = state(cfg.run_dir)
        assert st["phase"] == "staging" and st.get("child") is None and proc.poll() is None, st
        bring_back()
        assert wait_or_kill(proc, 180) == 0, (tmp_path / "supervisor.out").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    staging = state(cfg.run_dir)["staging"]
    assert "unreachable_since" not in staging and "stalled" not in staging, staging
    assert (cfg.scratch_dir / "init" / "weights.pth").is_file()


def test_an_init_from_whose_share_is_gone_at_the_first_launch_is_waited_for(tmp_path, corpus):
    """On main: `run --check` and `run` exited 2 (\"no such file or directory\"), final."""
    base = _fake_pth(tmp_path / "share" / "base.pth")
    config = write_config(tmp_path, corpus, remote=False, init={"from": str(base)})
    _waits_then_finishes(tmp_path, config, lambda: _unmount(tmp_path / "share"), lambda: _mount(tmp_path / "share"),
                         "init source unreachable since")


def test_an_init_from_failing_with_eio_at_the_first_launch_is_waited_for(tmp_path, corpus, faultfs):
    """On main: `run --check` said OK with no word of it, and the supervisor crashed (exit 1) on the EIO."""
    import errno

    _fake_pth(faultfs.backing / "base.pth")
    config = write_config(tmp_path, corpus, remote=False, init={"from": str(faultfs.root / "base.pth")})
    try:
        _waits_then_finishes(tmp_path, config, lambda: faultfs.add_rule("*", "base.pth", "error", errno=errno.EIO),
                             faultfs.clear, "init source unreachable since")
    finally:
        faultfs.clear()
    assert faultfs.hits("error")


def test_an_init_from_that_stalls_at_the_first_launch_shows_stalled_and_is_waited_for(tmp_path, corpus, faultfs):
    """Every operation on the base blocks (a hung mount): `run --check` says it waits, the supervisor's loop is
    not held by it, status says "init.from ... not answering since T (stalled)"; on main status said nothing and
    --check nothing either."""
    _fake_pth(faultfs.backing / "base.pth")
    config = write_config(tmp_path, corpus, remote=False, init={"from": str(faultfs.root / "base.pth")})
    try:
        _waits_then_finishes(tmp_path, config, lambda: faultfs.stall("base.pth", 600, op="*"), faultfs.clear,
                             f"init.from {faultfs.root / 'base.pth'} not answering since",
                             MINILMD_SYNC_STALLED_AFTER="1")
    finally:
        faultfs.clear()
    assert faultfs.hits("stall")



def test_a_stalled_init_from_is_said_as_soon_as_the_launch_looks_not_after_its_looks(tmp_path, corpus, faultfs):
    """On main the launch's three bounded looks at a stalled init.from (the config check's, the room check's, the
    supervisor's start's) took about 15 s before the first event, and nothing was said anywhere meanwhile. Now the
    launch's look says on stdout, once slow, what it waits on and for how long at most, in status's words; the
    room check passes it by; the start's look says the same first thing in supervisor.log."""
    from minilmd.bounded import SHARED_STORAGE_PROBE_S, SLOW_PROBE_S

    base = faultfs.root / "base.pth"
    _fake_pth(faultfs.backing / "base.pth")
    config = write_config(tmp_path, corpus, remote=False, init={"from": str(base)})
    cfg = load_config(config)
    out = tmp_path / "supervisor.out"
    faultfs.stall("base.pth", 600, op="*")
    proc = start_supervisor(config, out)
    try:
        wait_for(lambda: "[start]" in out.read_text(), 120, "the start event")
        said = out.read_text()
        st = state(cfg.run_dir)
        assert st.get("child") is None, st  # no trainer to leave behind: staging waits for init.from
    finally:
        proc.kill()
        faultfs.clear()
        proc.wait(60)
    left = f"{SHARED_STORAGE_PROBE_S - SLOW_PROBE_S:g} s more at most"
    launch = (f"minilmd run: init.from {base} not answering since ", " (stalled): the launch's check waits for it "
              f"{left}, then the run stages and waits for it there (not a failure)")
    line = next((x for x in said.splitlines() if x.startswith(launch[0])), "")
    assert line.endswith(launch[1]), said
    log = (cfg.run_dir / "supervisor.log").read_text().splitlines()
    assert f"[staging] init.from {base} not answering since " in log[0], log[:3]
    assert log[0].endswith(f" (stalled): the start waits for it {left}, then the run stages and waits for it there "
                           "(not a failure)"), log[:3]
    assert "[start]" in log[1], log[:3]
    assert said.index(line) < said.index("[start]")  # said before the supervisor's first event, not after
