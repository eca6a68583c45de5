"""`minilmd run --check` and the launch refuse what a new user mistypes, rather than pass it and then wait without
end or lose a feature: an [eval] probe that is not there beside other entries (a typo, as data.prepared's and
init.from's: minilmd/probes.py), a Prometheus textfile in a directory that does not exist, a run.remote whose parent
does not exist (a mistyped or unmounted share: never a chain of directories made on the local disk), a data.prepared
mistyped on a run that trained before and whose scratch holds no staged copy (never "trains from the verified copy"
when there is none). Each of these passed `--check` on main."""
from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path

import pytest

from minilmd.config import ConfigError
from minilmd.daemon import preflight
from minilmd.protocol import SUPERVISOR_CONFIG
from supervisor_helpers import cli, write_config


def _refused(config: Path, *fragments: str) -> str:
    """preflight's check (what `--check` and the launch load through) refuses, naming every fragment."""
    with pytest.raises(ConfigError) as err:
        preflight.check_with_waits(str(config))
    text = str(err.value)
    assert all(f in text for f in fragments), text
    return text


def _launch_refused(config: Path, *fragments: str) -> None:
    """A real `minilmd run` (the fake trainer behind it) exits 2, final, naming every fragment, no trainer started."""
    launched = cli("run", str(config), timeout=120)
    text = launched.stdout + launched.stderr
    assert launched.returncode == SUPERVISOR_CONFIG, text
    assert all(f in text for f in fragments) and "Traceback" not in text, text


# --- [eval] probe -----------------------------------------------------------------------------------------------------
@pytest.mark.slow  # a real launch
def test_a_mistyped_probe_is_refused_at_a_first_launch_naming_eval_probe(tmp_path, corpus):
    """On main: --check OK, and the launch waited for ever, "init source unreachable: .../prep/pree: not there"."""
    prep = tmp_path / "prep"
    shutil.copytree(corpus[0], prep / "probe")
    config = write_config(tmp_path, corpus, remote=False, eval={"probe": str(prep / "pree")})
    _refused(config, f"eval.probe = '{prep / 'pree'}'", f"{prep} holds other entries, but no pree", "a typo?")
    _launch_refused(config, "eval.probe", "a typo?")
    assert not (tmp_path / "s" / "run" / "state.json").exists()


def test_a_probe_whose_share_is_not_mounted_is_waited_for(tmp_path, corpus):
    share = tmp_path / "share"
    share.mkdir()  # an unmounted share: its mount point an empty stub, no evidence of a typo
    config = write_config(tmp_path, corpus, remote=False, eval={"probe": str(share / "probe")})
    _, waits = preflight.check_with_waits(str(config))
    (line,) = waits
    assert line.startswith(f"eval.probe = '{share / 'probe'}' is not there") and "probe source unreachable" in line


def test_staging_says_an_unreachable_probe_is_the_probes(tmp_path, corpus):
    """The wait's label and message name the probe (status: "probe source unreachable ... eval.probe: ..."), not
    init.from, which this run does not have."""
    from minilmd.config import load_config
    from minilmd.daemon.jobs import initstage
    from minilmd.daemon.jobs.staging_errors import ProbeUnreachable

    config = write_config(tmp_path, corpus, remote=False, eval={"probe": str(tmp_path / "gone" / "probe")})
    with pytest.raises(ProbeUnreachable, match=r"^eval\.probe: .*gone/probe: not there"):
        initstage.stage_inputs(load_config(config))


# --- log.prometheus_textfile ------------------------------------------------------------------------------------
def test_a_textfile_in_a_directory_that_does_not_exist_is_refused(tmp_path, corpus):
    """On main: --check OK, and the run logged "cannot write the Prometheus textfile ...; retrying" for ever."""
    textfile = tmp_path / "prom" / "x.prom"
    config = write_config(tmp_path, corpus, remote=False, log={"prometheus_textfile": str(textfile)})
    _refused(config, f"log.prometheus_textfile = '{textfile}': {textfile.parent} does not exist")
    textfile.parent.mkdir()
    preflight.check_with_waits(str(config))


# --- data.prepared after `done` removed scratch -------------------------------------------------------------------
@pytest.mark.slow  # a real supervisor trains the run to its end (the fake trainer), then two launches
def test_a_mistyped_corpus_of_a_finished_run_whose_scratch_is_gone_is_refused(tmp_path, corpus):
    """The run trained to `done`, which removed its scratch (keep_scratch = false, the remote holds the last
    checkpoint); data.prepared then mistyped. On main --check said "this run has started before, so it trains from
    the verified copy in scratch, or waits for the share", of a copy that was not there, and the launch waited for
    ever. Now as at a first launch: refused, exit 2, with the data.prepared the run started with."""
    from minilmd.config import load_config
    from supervisor_helpers import run_supervisor

    prep = tmp_path / "prep"
    shutil.copytree(corpus[0], prep / "corpus")
    good = write_config(tmp_path, (prep / "corpus", corpus[1]), run={"keep_scratch": False},
                        train={"max_steps": 8, "checkpoint_every": 4})
    cfg = load_config(good)
    assert run_supervisor(good, tmp_path) == 0
    assert not (cfg.scratch_dir / "corpus").exists() and (cfg.run_dir / "state.json").is_file()
    typo = write_config(tmp_path, (prep / "corpsu", corpus[1]), run={"keep_scratch": False},
                        train={"max_steps": 8, "checkpoint_every": 4})
    said = _refused(typo, f"data.prepared = '{prep / 'corpsu'}': not there ({prep} holds other entries, but no "
                          f"corpsu), and scratch holds no staged copy of it",
                    f"this run started with data.prepared = '{prep / 'corpus'}' (its run.toml)", "a typo?")
    assert "trains from the verified copy" not in said
    _launch_refused(typo, "data.prepared", "a typo?")


def test_a_corpus_share_gone_at_a_restart_with_no_copy_in_scratch_is_waited_for_saying_so(tmp_path, corpus):
    """Its share not mounted (the mount point an empty stub) and no staged copy in scratch: waited for, and the
    line says there is no copy to train from (on main: "it trains from the verified copy in scratch")."""
    share = tmp_path / "share"
    share.mkdir()
    config = write_config(tmp_path, (share / "corpus", corpus[1]), remote=False)
    from minilmd.config import load_config

    run_dir = load_config(config).run_dir
    run_dir.mkdir(parents=True)
    (run_dir / "state.json").write_text("{}")  # the run has started before
    waits = [w for w in preflight.check_with_waits(str(config))[1] if w.startswith("data.prepared")]
    (line,) = waits
    assert "scratch holds no staged copy to train from, so it waits for the share" in line, line
    assert "trains from the verified copy" not in line


# --- run.remote -----------------------------------------------------------------------------------------------------
@pytest.mark.slow  # a real launch
def test_a_remote_in_a_kernel_file_system_is_refused(tmp_path, corpus):
    """/proc/nope: on main --check passed (its parent "writable" to root), the run trained to its end and exited 1
    on "sync failed (SyncError: sync to /proc/nope failed: FileNotFoundError: ...)"."""
    config = write_config(tmp_path, corpus, remote=False, run={"remote": "/proc/nope"})
    _refused(config, "run.remote = '/proc/nope': /proc")
    _launch_refused(config, "run.remote = '/proc/nope'")


def _set_up_as_mount_point(monkeypatch, stub: Path) -> None:
    """This machine's fstab names `stub` (the one configured mount point: a fake of the mount tables' reading)."""
    from minilmd import mount_places
    monkeypatch.setattr(mount_places, "snapshot", lambda: mount_places.MountConfig(frozenset({str(stub)})))


def test_the_sync_makes_no_directory_under_an_unmounted_share(tmp_path, monkeypatch):
    """A remote whose parent is not there under an unmounted share (its mount point an empty stub, not a mount
    point): the sync fails, saying so in words (no Python class name), and makes nothing on the local disk below
    it; with the share mounted (mountinfo lists it) it makes the remote and its parent, as it always did."""
    from minilmd.daemon.base.worker import error_words
    from minilmd.daemon.jobs.remote_local import LocalRemote
    from minilmd.daemon.jobs.sync_errors import SyncError
    from mount_fakes import mounted_on

    mnt = tmp_path / "mnt"
    mnt.mkdir()
    _set_up_as_mount_point(monkeypatch, mnt)
    remote = LocalRemote(str(mnt / "ckpt" / "r"))
    with pytest.raises(FileNotFoundError) as err:
        remote.makedirs()
    said = error_words(err.value)
    assert f"{mnt / 'ckpt'} is not there ({mnt} is an empty directory, not a mount point)" in said, said
    assert "Error" not in said and list(mnt.iterdir()) == []
    assert error_words(SyncError(f"sync to {mnt} failed: {said}")) == f"sync to {mnt} failed: {said}"
    mounted_on(monkeypatch, tmp_path, mnt)  # the share mounted (before: a stub holding an entry was taken for it)
    remote.makedirs()
    assert (mnt / "ckpt" / "r").is_dir()


@pytest.fixture
def top_level_typo():
    """A share's path mistyped at the top level (/mnt/nfs for /mnt/nas; here "/" holds no such name): what the sync
    and the check must never make. Removed after the test if a regression made it."""
    top = Path("/") / f"minilmd-no-share-{secrets.token_hex(4)}"
    assert not os.path.lexists(top)
    yield top
    if top.is_dir() and not top.is_symlink():
        shutil.rmtree(top)


def test_the_sync_never_makes_a_chain_from_the_top_level(top_level_typo):
    """/mnt/nfs/me/w0 with /mnt holding other entries and no nfs (a typo of the share, a mount point never made):
    on main the sync made the chain on the local disk and said every step synced and verified. Now nothing is
    made, and the error names the missing directory."""
    from minilmd.daemon.base.worker import error_words
    from minilmd.daemon.jobs.remote_local import LocalRemote

    remote = LocalRemote(str(top_level_typo / "me" / "w0"))
    with pytest.raises(FileNotFoundError) as err:
        remote.makedirs()
    said = error_words(err.value)
    assert f"{top_level_typo / 'me'} is not there (/ holds no {top_level_typo.name}, and nothing is made at the top " \
           f"level, where shares are mounted)" in said and "unmounted share" in said, said
    assert not os.path.lexists(top_level_typo)


def test_a_remote_whose_chain_starts_at_the_top_level_is_refused_and_nothing_is_made(tmp_path, corpus,
                                                                                    top_level_typo):
    """On main: `--check` OK ("does not exist yet (the first sync creates it)"), and the run made the chain on the
    local disk. Now refused at --check (and so at the launch, which checks the same), naming the missing directory
    and saying what an unmounted share looks like; a chain below a deeper directory passes as before."""
    remote = top_level_typo / "me" / "w0"
    config = write_config(tmp_path, corpus, remote=False, run={"remote": str(remote)})
    _refused(config, f"run.remote = '{remote}': {remote.parent} is not there (/ holds no {top_level_typo.name}",
             "an unmounted share, or a typo in its path, looks like this")
    assert not os.path.lexists(top_level_typo)
    below = tmp_path / "mnt" / "nfs" / "me" / "w0"  # a chain below a deeper directory: made by the sync, as ever
    _, waits = preflight.check_with_waits(str(write_config(tmp_path, corpus, remote=False,
                                                           run={"remote": str(below)})))
    assert not any("run.remote" in w and "is not there" in w for w in waits), waits


def test_a_remote_under_an_unmounted_share_is_refused_at_a_first_launch(tmp_path, corpus, monkeypatch):
    mnt = tmp_path / "mnt"
    mnt.mkdir()  # the share's mount point, an empty stub: not mounted
    _set_up_as_mount_point(monkeypatch, mnt)
    remote = mnt / "me" / "w0"
    config = write_config(tmp_path, corpus, remote=False, run={"remote": str(remote)})
    _refused(config, f"run.remote = '{remote}': {remote.parent} is not there ({mnt} is an empty directory, not a "
                     f"mount point)", "an unmounted share")
    assert list(mnt.iterdir()) == []


@pytest.mark.slow  # a real launch
def test_the_launch_refuses_a_remote_whose_chain_starts_at_the_top_level(tmp_path, corpus, top_level_typo):
    remote = top_level_typo / "nfs" / "w0"
    config = write_config(tmp_path, corpus, remote=False, run={"remote": str(remote)})
    _launch_refused(config, f"run.remote = '{remote}': {remote.parent} is not there", "unmounted share")
    assert not os.path.lexists(top_level_typo)


def test_a_remote_under_an_unmounted_share_of_a_run_that_started_before_is_waited_for(tmp_path, corpus, monkeypatch):
    """At a restart (state.json there), the share gone or not mounted after a reboot: no refusal (exit 2 is final
    under systemd), a line saying the sync fails until it is there."""
    from minilmd.config import load_config

    remote = tmp_path / "mnt" / "nfs" / "w0"
    (tmp_path / "mnt").mkdir()
    _set_up_as_mount_point(monkeypatch, tmp_path / "mnt")
    config = write_config(tmp_path, corpus, remote=False, run={"remote": str(remote)})
    run_dir = load_config(config).run_dir
    run_dir.mkdir(parents=True)
    (run_dir / "state.json").write_text("{}")
    _, waits = preflight.check_with_waits(str(config))
    assert any(w.startswith(f"run.remote = '{remote}': {remote.parent} is not there") for w in waits), waits
    assert not remote.parent.exists()
