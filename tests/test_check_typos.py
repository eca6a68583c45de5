"""`minilmd run --check` and the launch refuse what a new user mistypes, rather than pass it and then wait without
end or lose a feature: an [eval] probe that is not there beside other entries (a typo, as data.prepared's and
init.from's: minilmd/probes.py), a Prometheus textfile in a directory that does not exist, a run.remote whose parent
does not exist (a mistyped or unmounted share: never a chain of directories made on the local disk), a data.prepared
mistyped on a run that trained before and whose scratch holds no staged copy (never "trains from the verified copy"
when there is none). Each of these passed `--check` on main."""
from __future__ import annotations

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


def test_the_sync_makes_no_directory_under_an_unmounted_share(tmp_path):
    """A remote whose parent is not there under an unmounted share (its mount point an empty stub, not a mount
    point): the sync fails, saying so in words (no Python class name), and makes nothing on the local disk below
    it; under a place that answers it makes the remote and its parent, as it always did."""
    from minilmd.daemon.base.worker import error_words
    from minilmd.daemon.jobs.remote_local import LocalRemote
    from minilmd.daemon.jobs.sync_errors import SyncError

    mnt = tmp_path / "mnt"
    mnt.mkdir()
    remote = LocalRemote(str(mnt / "ckpt" / "r"))
    with pytest.raises(FileNotFoundError) as err:
        remote.makedirs()
    said = error_words(err.value)
    assert f"{mnt / 'ckpt'} is not there and {mnt} is an empty directory, not a mount point" in said, said
    assert "Error" not in said and list(mnt.iterdir()) == []
    assert error_words(SyncError(f"sync to {mnt} failed: {said}")) == f"sync to {mnt} failed: {said}"
    (mnt / "other-run").mkdir()  # the share answers
    remote.makedirs()
    assert (mnt / "ckpt" / "r").is_dir()
