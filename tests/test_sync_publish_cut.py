"""A sync killed between the record of its complete copy and the rename that publishes it (seen under load in
test_reliability_supervisor_kill): the record was dropped before the rename, so the whole checkpoint stayed on the
remote under its temporary name for good, unrecorded ("no record of making"), said at every sync. Now the record
becomes one of a publish begun (remote_made.Made.publishing), and the next sync finishes the publish: the copy is put
under its step name, never removed for its name alone (a published step renamed back to that name is no half copy);
where that step was published since, it is a second copy of it, and goes."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from minilmd import checkpoint as ck
from minilmd.daemon.jobs import remote_made
from minilmd.daemon.jobs.remote_local import LocalRemote
from minilmd.daemon.jobs.sync import Syncer
from sync_helpers import EXPECTED, dirs, names, save, weights  # noqa: F401 - dirs, weights: fixtures

KILL_BEFORE_PUBLISH = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from minilmd import dirfd
    from minilmd.daemon.jobs import sync
    real_rename_new = dirfd.Dir.rename_new
    def rename_new(self, name, to_name):
        if name.startswith(".tmp-step-") and to_name == sys.argv[3]:
            if sys.argv[4] == "after":
                real_rename_new(self, name, to_name)
            os.kill(os.getpid(), signal.SIGKILL)
        return real_rename_new(self, name, to_name)
    dirfd.Dir.rename_new = rename_new
    sync.Syncer(sys.argv[1], sys.argv[2], run_dir=Path(sys.argv[5])).sync_newest()
""")
"""A run's sync SIGKILLed as it renames its copy to argv[3]: `before` the rename or `after` it (before the record
says it is done). argv: local, remote, the step's name, before|after, run.dir."""


def killed_publishing(local: Path, remote: Path, run_dir: Path, step: str, when: str) -> None:
    done = subprocess.run([sys.executable, "-c", KILL_BEFORE_PUBLISH, str(local), str(remote), step, when,
                           str(run_dir)], capture_output=True, text=True, timeout=120)
    assert done.returncode == -9, done.stderr


def cut_then_published(dirs, weights, tmp_path) -> tuple[Path, Path, Path, str]:
    """(scratch, remote, run.dir, the cut copy's name): step 10's sync killed before its rename, then step 10
    published since by a copy of that very copy (a sync that did not see it: another host's, say)."""
    local, remote = dirs
    run_dir = tmp_path / "run-dir"
    run_dir.mkdir()
    save(local, 10, weights)
    killed_publishing(local, remote, run_dir, "step-00000010", "before")
    [cut] = [n for n in names(remote) if n.startswith(".tmp-step-00000010")]
    shutil.copytree(remote / cut, remote / "step-00000010")
    return local, remote, run_dir, cut


def test_a_copy_whose_publish_a_kill_cut_before_its_rename_is_published_by_the_next_sync(dirs, weights, tmp_path):
    local, remote = dirs
    run_dir = tmp_path / "run-dir"
    run_dir.mkdir()
    save(local, 10, weights)
    Syncer(local, str(remote), EXPECTED, run_dir=run_dir).sync_newest()
    save(local, 20, weights)
    killed_publishing(local, remote, run_dir, "step-00000020", "before")
    [cut] = [n for n in names(remote) if n.startswith(".tmp-step-00000020")]
    model = (remote / cut / ck.MODEL_FILE).read_bytes()

    logs: list[str] = []
    assert Syncer(local, str(remote), EXPECTED, keep=9, log=logs.append, run_dir=run_dir).sync_newest().step == 20

    assert names(remote) == ["LATEST", "step-00000010", "step-00000020"]  # on main: the copy stayed under `cut`
    assert (remote / "step-00000020" / ck.MODEL_FILE).read_bytes() == model  # that very copy, not a second one
    assert any(f"published {remote / cut}" in m for m in logs), logs
    assert not [m for m in logs if "no record of making" in m], logs
    assert not remote_made.Made(remote_made.run_record(run_dir)).publishing_to(cut, (0, 0))


def test_such_a_copy_whose_step_was_published_since_goes_as_a_second_copy_of_it(dirs, weights, tmp_path):
    """Its step synced again before the clean-up looked at the cut copy (another host's temporary names are looked
    at after a day: a Slurm job requeued on another node syncs the step again first): the copy cannot be published
    and is a second one of a step that stands; it goes (audit F2: it stayed for good, said at every sync)."""
    local, remote, run_dir, cut = cut_then_published(dirs, weights, tmp_path)

    logs: list[str] = []
    Syncer(local, str(remote), EXPECTED, keep=9, log=logs.append, run_dir=run_dir).sync_newest()

    assert names(remote) == ["LATEST", "step-00000010"]
    assert any(f"removed {remote / cut}" in m and "published since" in m for m in logs), logs


def test_such_a_copy_is_kept_while_the_step_published_since_is_damaged(dirs, weights, tmp_path):
    """The verified cut copy is no second copy of a damaged one: kept, and said, while the sync replaces the damaged
    step (quarantined, copied again); the next sync removes it then (review, stop 65: judged by the step number)."""
    local, remote, run_dir, cut = cut_then_published(dirs, weights, tmp_path)
    os.truncate(remote / "step-00000010" / ck.MODEL_FILE, 10)
    logs: list[str] = []
    syncer = Syncer(local, str(remote), EXPECTED, keep=9, log=logs.append, run_dir=run_dir)

    syncer.sync_newest()
    assert (remote / cut).is_dir() and any("not intact" in m for m in logs), logs
    syncer.sync_newest()

    assert cut not in names(remote) and not syncer.remote.intact("step-00000010")[1]


def test_a_step_moved_to_the_second_copys_name_as_it_is_removed_is_left(dirs, weights, tmp_path, monkeypatch):
    """Another user who may rename within the root swaps names just before that removal: the cut copy away, the
    published step to its name. The removal asks for the very directory judged, so the step stays (review, stop 65:
    removed on its manifest's word)."""
    local, remote, run_dir, cut = cut_then_published(dirs, weights, tmp_path)
    real_intact = LocalRemote.intact

    def swapped_after_the_look(self, name, *args, **kwargs):  # the last look at the published step: then the swap
        found = real_intact(self, name, *args, **kwargs)
        if name == "step-00000010" and not (remote / "elsewhere").exists():
            (remote / cut).rename(remote / "elsewhere")
            (remote / "step-00000010").rename(remote / cut)
        return found

    monkeypatch.setattr(LocalRemote, "intact", swapped_after_the_look)
    logs: list[str] = []
    Syncer(local, str(remote), EXPECTED, keep=9, log=logs.append, run_dir=run_dir).sync_newest()

    assert (remote / cut / ck.MODEL_FILE).is_file() and (remote / "elsewhere" / ck.MODEL_FILE).is_file()
    assert any("another entry moved to its name" in m for m in logs), logs


def test_a_published_step_renamed_back_to_its_temporary_name_after_such_a_kill_is_published_again_never_removed(
        dirs, weights, tmp_path):
    """Killed after the rename, before the record said it was done: the record still names the publish. Another user
    who may rename within the root renames the step back to its temporary name (here the run's user does it: the
    proof does not ask who): the next sync puts it back under its step name; it removes nothing."""
    local, remote = dirs
    run_dir = tmp_path / "run-dir"
    run_dir.mkdir()
    save(local, 10, weights)
    killed_publishing(local, remote, run_dir, "step-00000010", "after")
    assert names(remote) == ["step-00000010"]
    [(temporary, dev, ino, final)] = [r for r in json.loads(remote_made.run_record(run_dir).read_text())["made"]
                                      if len(r) == 4]  # a row of four: the publish begun
    assert final == "step-00000010"
    (remote / "step-00000010").rename(remote / temporary)
    model = (remote / temporary / ck.MODEL_FILE).read_bytes()

    logs: list[str] = []
    Syncer(local, str(remote), EXPECTED, keep=9, log=logs.append, run_dir=run_dir).sync_newest()

    assert names(remote) == ["LATEST", "step-00000010"]
    assert (remote / "step-00000010" / ck.MODEL_FILE).read_bytes() == model
    assert (remote / "step-00000010").stat().st_ino == ino  # the very directory, put back, not copied again


def test_a_publish_record_is_kept_across_reads_and_dropped_once_its_name_is_gone(tmp_path):
    """The record's rows of four (a publish begun) survive a reread, come back a temporary's at `restore`, and go
    with their name at `keep_only`, as the rows of three do."""
    made = remote_made.Made(tmp_path / "remote-made.json")
    made.record(".tmp-a", (1, 2))
    assert made.publishing(".tmp-a", "step-00000001") == [(1, 2)]
    again = remote_made.Made(tmp_path / "remote-made.json")
    assert again.publishing_to(".tmp-a", (1, 2)) == "step-00000001"
    assert not again.proves(".tmp-a", (1, 2))  # a publish begun is never proof that removes it
    again.restore(".tmp-a", [(1, 2)])
    assert again.proves(".tmp-a", (1, 2)) and again.publishing_to(".tmp-a", (1, 2)) is None
    again.publishing(".tmp-a", "step-00000001")
    again.keep_only({"step-00000001"})
    assert remote_made.Made(tmp_path / "remote-made.json").publishing_to(".tmp-a", (1, 2)) is None
