"""A LoRA run's base kept beside its checkpoints on the remote (daemon/jobs/basecopy.py): a reboot empties
/dev/shm, and by then init.from may give other weights or none; the run still finishes on the base it trained on,
and `export --merge` of its adapters still finds that base."""
from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import signal
import threading
from pathlib import Path

import pytest

from minilmd import checkpoint_dirs, names, tmpnames
from minilmd.config import load_config
from minilmd.daemon.base.worker import ReadWatch
from minilmd.daemon.jobs import basecopy, initstage, stagingworker
from minilmd.daemon.jobs.remote_local import LocalRemote, open_remote
from minilmd.daemon.jobs.staging_errors import SourceUnreachable
from minilmd.fsio import publish_dir
from minilmd.init_source import STAGED_CHECKPOINT, STAGED_PTH, STAGED_RECORD, same_source
from reliability_helpers import trainers_of
from supervisor_helpers import cli, start_supervisor, state, wait_for, wait_or_kill, write_config
from sync_helpers import StaleSizes

pytestmark = pytest.mark.slow  # real staged checkpoints; the last test runs the real trainer under a supervisor


def _staged_base(tmp_path: Path, checkpoint: Path) -> tuple[Path, dict]:
    share = shutil.copytree(checkpoint, tmp_path / "share" / "base")
    staged = initstage.stage_init(str(share), tmp_path / "scratch")
    return staged, json.loads((staged / STAGED_RECORD).read_text())


def test_the_base_is_copied_once_read_back_and_fetched_only_for_the_base_a_checkpoint_records(tmp_path,
                                                                                             undisturbed):
    staged, record = _staged_base(tmp_path, undisturbed().checkpoint)
    remote = open_remote(str(tmp_path / "remote"))
    assert basecopy.push(remote, staged, "h", 1) > 0
    assert basecopy.on_remote(remote, staged) and basecopy.push(remote, staged, "h", 1) == 0  # once
    assert remote.names() == [basecopy.REMOTE_BASE]  # no temporary copy left, no step name: retention passes it by

    spec = record["from"]
    dest = tmp_path / "fetched"
    dest.mkdir()
    assert basecopy.fetch(remote, spec, record, dest) == []
    assert sorted(p.relative_to(dest) for p in dest.rglob("*")) == sorted(p.relative_to(staged)
                                                                         for p in staged.rglob("*"))
    other = {**record, "manifest_sha256": "0" * 64}  # a checkpoint trained on other weights
    for args in ((spec, other), ("/another/init/from", record)):
        empty = tmp_path / f"empty-{len(args[0])}"
        empty.mkdir()
        assert basecopy.fetch(remote, *args, empty) is None and not any(empty.iterdir())


@pytest.mark.parametrize("damage", ["flipped byte", "fifo", "forged manifest", "link"])
def test_a_damaged_or_hostile_remote_copy_is_refused_without_blocking(tmp_path, undisturbed, damage):
    """The remote is a place other users and machines write: a copy there is used only when every hash is the
    one the run's checkpoint records; a FIFO in it is refused unopened."""
    staged, record = _staged_base(tmp_path, undisturbed().checkpoint)
    remote = open_remote(str(tmp_path / "remote"))
    basecopy.push(remote, staged, "h", 1)
    copy = tmp_path / "remote" / basecopy.REMOTE_BASE / STAGED_CHECKPOINT
    weights = copy / names.MODEL_FILE
    if damage == "flipped byte":
        data = bytearray(weights.read_bytes())
        data[-1] ^= 0xFF
        weights.write_bytes(bytes(data))
    elif damage == "fifo":
        weights.unlink()
        os.mkfifo(weights)
    elif damage == "link":  # to another user's file of the same bytes: on main fetched through the link
        theirs = shutil.copy(weights, tmp_path / "theirs")
        weights.unlink()
        weights.symlink_to(theirs)
    else:
        manifest = json.loads((copy / names.MANIFEST).read_text())
        manifest["step"] = -1
        (copy / names.MANIFEST).write_text(json.dumps(manifest))
    dest = tmp_path / "fetched"
    dest.mkdir()
    problems = basecopy.fetch(remote, record["from"], record, dest)
    assert problems, damage
    expected = {"flipped byte": "differs", "fifo": "not a regular file", "forged manifest": "not the manifest",
                "link": f"a symbolic link to {tmp_path / 'theirs'}, not followed"}
    assert expected[damage] in problems[0], problems


def _pushed_pth_base(tmp_path: Path) -> tuple[Path, Path, LocalRemote, dict]:
    """A 4 KiB .pth base staged and pushed to `<tmp_path>/remote`: (its source, its staged copy, the remote, its
    record)."""
    pth = tmp_path / "share" / "base.pth"
    pth.parent.mkdir()
    pth.write_bytes(os.urandom(4096))
    staged = initstage.stage_init(str(pth), tmp_path / "scratch")
    remote = open_remote(str(tmp_path / "remote"))
    basecopy.push(remote, staged, "h", 1)
    return pth, staged, remote, json.loads((staged / STAGED_RECORD).read_text())


@pytest.mark.parametrize("recorded", ["size recorded", "a record from before sizes"])
def test_a_pth_bases_remote_copy_is_read_no_further_than_its_size(tmp_path, recorded):
    """On main a .pth base's copy had no size: one others append to was downloaded to its end, however long."""
    pth, staged, remote, record = _pushed_pth_base(tmp_path)
    if recorded == "a record from before sizes":
        assert record.pop("size", 4096) == 4096
        (tmp_path / "remote" / basecopy.REMOTE_BASE / STAGED_RECORD).write_text(json.dumps(record))
        fetched = tmp_path / "fetched-old"
        fetched.mkdir()
        assert basecopy.fetch(remote, str(pth), record, fetched) == []  # still fetched, bounded by its listed size
    else:
        assert record["size"] == 4096 and initstage.init_problems(staged) == []
    with (tmp_path / "remote" / basecopy.REMOTE_BASE / STAGED_PTH).open("ab") as copy:
        copy.write(b"\0" * (8 << 20))  # written to by another user since
    if recorded == "size recorded":  # refused before any of it is read
        dest = tmp_path / "listed"
        dest.mkdir()
        problems = basecopy.fetch(remote, str(pth), record, dest)
        assert problems and "listed as 4096" in problems[0] and not (dest / STAGED_PTH).exists()
    dest = tmp_path / "stale"
    dest.mkdir()  # still listed at its old size: the download stops one byte past it
    problems = basecopy.fetch(StaleSizes(remote.url, {f"{basecopy.REMOTE_BASE}/{STAGED_PTH}": 4096}), str(pth),
                              record, dest)
    assert (dest / STAGED_PTH).stat().st_size == 4097
    assert problems and "longer than the 4096 bytes listed" in problems[0], problems


class RestagedWhilePushed(LocalRemote):
    """Once the first file of a push is copied (and read back), `staged` is staged again from other weights
    (publish_dir, as staging does: a restart while the sync thread still copies the base)."""

    def __init__(self, url: str, staged: Path, other: Path):
        super().__init__(url)
        self.staged, self.other, self.puts = staged, other, 0

    def put(self, local: Path, *names: str) -> int:
        self.puts += 1
        if self.puts == 2:  # staged in a temporary directory beside it, as staging does, then published
            publish_dir(Path(shutil.copytree(self.other, self.staged.parent / ".init.restaged")), self.staged)
        return super().put(local, *names)


class WrittenToWhilePushed(LocalRemote):
    """Another user appends to each file of a push as soon as it is copied, before it is read back; what each
    read-back hashed is kept (digests)."""

    def __init__(self, url: str):
        super().__init__(url)
        self.digests: list[str] = []

    def put(self, local: Path, *names: str) -> int:
        n = super().put(local, *names)
        with open(self.path(*names), "ab") as f:
            f.write(b"x" * (8 << 20))
        return n

    def sha256(self, *names: str, **size) -> str:
        self.digests.append(super().sha256(*names, **size))
        return self.digests[-1]


def test_a_base_copy_written_past_its_size_is_read_back_no_further(tmp_path):
    """On main the push's read-back hashed a file of the copy to its end, however long another user made it."""
    pth = tmp_path / "share" / "base.pth"
    pth.parent.mkdir()
    pth.write_bytes(os.urandom(4096))
    staged = initstage.stage_init(str(pth), tmp_path / "scratch")
    remote = WrittenToWhilePushed(str(tmp_path / "remote"))
    with pytest.raises(basecopy.BaseCopyError, match="not the file its record lists"):
        basecopy.push(remote, staged, "h", 1)
    assert remote.digests == [hashlib.sha256(pth.read_bytes() + b"x").hexdigest()]  # one byte past, no further
    assert remote.names() == []


def test_a_base_staged_again_while_pushed_leaves_no_mixed_copy(tmp_path, undisturbed):
    """On main each file was read back against the local file it was copied from: the files copied after the
    staged base was replaced were the other base's, and the copy was completed, mixed, under its record."""
    run = undisturbed()
    staged, record = _staged_base(tmp_path, run.checkpoint)
    other = initstage.stage_init(str(shutil.copytree(run.checkpoint.parent / "step-00000012", tmp_path / "other")),
                                 tmp_path / "other-scratch")
    other_record = json.loads((other / STAGED_RECORD).read_text())
    remote = RestagedWhilePushed(str(tmp_path / "remote"), staged, other)
    with pytest.raises(basecopy.BaseCopyError, match="not the file its record lists"):
        basecopy.push(remote, staged, "h", 1)
    assert remote.names() == []  # neither a copy nor its temporary name left
    assert basecopy.push(remote, staged, "h", 1) > 0  # the next sync copies the base staged now, whole
    dest = tmp_path / "fetched"
    dest.mkdir()
    assert basecopy.fetch(remote, other_record["from"], other_record, dest) == []
    assert not same_source(record, other_record)


def test_a_remote_copy_of_another_base_is_never_replaced(tmp_path, undisturbed):
    """The remote's `init` may be the only copy of the base older checkpoints were trained on: a staged base of
    other weights (init.from edited, a predecessor re-run) is not pushed over it."""
    staged, record = _staged_base(tmp_path, undisturbed().checkpoint)
    remote = open_remote(str(tmp_path / "remote"))
    basecopy.push(remote, staged, "h", 1)
    theirs = tmp_path / "remote" / basecopy.REMOTE_BASE / STAGED_RECORD
    theirs.write_text(json.dumps({**record, "manifest_sha256": "0" * 64}))  # the record of another base
    before = theirs.read_bytes()
    assert basecopy.push(remote, staged, "h", 1) == 0 and theirs.read_bytes() == before


class RecordGoneAfterItsFirstRead(LocalRemote):
    """Another machine at work on `<remote>/init`: right after the first read of its record, the record is gone
    (a copy rewritten in place writes its record last); every read of the record counted."""

    def __init__(self, url: str):
        super().__init__(url)
        self.record_reads = 0

    def cat(self, path: str, max_bytes: int) -> bytes:
        if path != self.path(basecopy.REMOTE_BASE, STAGED_RECORD):
            return super().cat(path, max_bytes)
        self.record_reads += 1
        try:
            return super().cat(path, max_bytes)
        finally:
            if self.record_reads == 1:
                Path(path).unlink()


def test_the_push_acts_on_the_remote_record_as_read_once(tmp_path):
    """On main the push read `<remote>/init/source.json` twice, to decide "this base" and then "another base":
    another base's copy whose record was gone by the second read was replaced whole by this one."""
    pth, staged, remote, record = _pushed_pth_base(tmp_path)
    kept = tmp_path / "remote" / basecopy.REMOTE_BASE
    theirs = os.urandom(4096)  # another base's weights, and its record
    (kept / STAGED_PTH).write_bytes(theirs)
    (kept / STAGED_RECORD).write_text(json.dumps({**record, "sha256": hashlib.sha256(theirs).hexdigest()}))
    changing = RecordGoneAfterItsFirstRead(remote.url)
    assert basecopy.push(changing, staged, "h", 1) == 0
    assert changing.record_reads == 1 and (kept / STAGED_PTH).read_bytes() == theirs


def test_a_base_copy_that_fails_never_holds_the_checkpoints_sync_up(tmp_path, undisturbed):
    """`<remote>/init` that cannot be written (here a file where its directory goes; a quota the base exceeds is
    the same): on main every sync failed with it, so a finished run never got its last checkpoint synced."""
    from minilmd.daemon.jobs.sync import Syncer

    trained = undisturbed().checkpoint
    staged, _ = _staged_base(tmp_path, trained)
    local = tmp_path / "scratch" / "checkpoints"
    shutil.copytree(trained, local / trained.name)
    (tmp_path / "remote").mkdir()
    (tmp_path / "remote" / basecopy.REMOTE_BASE).write_text("not a directory")
    said: list[str] = []
    Syncer(local, str(tmp_path / "remote"), keep=2, log=said.append, base=staged).sync_newest()
    assert checkpoint_dirs.read_latest(tmp_path / "remote") == trained.name
    assert any("the LoRA base not copied" in m for m in said), said


def test_a_base_copys_temporary_name_names_its_host_and_pid():
    assert tmpnames.remote_tmp_owner(tmpnames.sync_tmp_name(basecopy.REMOTE_BASE, "h", 123), "h") == 123
    assert tmpnames.remote_tmp_owner(tmpnames.sync_tmp_name(basecopy.REMOTE_BASE, "other", 123), "h") is None


def _resumed_lora_run(tmp_path: Path, corpus, undisturbed, remote: str):
    """A LoRA run whose base is on `remote` and whose checkpoint in scratch records that base, after its init.from
    changed (the predecessor run again: other weights). -> (cfg, the base's record)"""
    run = undisturbed()
    staged, record = _staged_base(tmp_path, run.checkpoint)
    basecopy.push(open_remote(remote), staged, "h", 1)
    cfg = load_config(write_config(tmp_path, corpus, init={"from": record["from"]}, run={"remote": remote},
                                   lora={"rank": 4, "alpha": 8.0}))
    ckpt = cfg.checkpoint_dir / "step-00000004"
    ckpt.mkdir(parents=True)
    (ckpt / names.MANIFEST).write_text("{}")
    (ckpt / names.TRAINER_STATE).write_text(json.dumps({"init": record}))
    shutil.rmtree(record["from"])
    shutil.copytree(run.checkpoint.parent / "step-00000012", record["from"])
    return cfg, record


def _stage_inputs(cfg, reads=None) -> dict:
    return initstage.stage_inputs(cfg, reads=reads, base_from_remote=stagingworker._base_from_remote)


def _staged_record(sets: dict) -> dict:
    return json.loads((Path(sets["init.staged"]) / STAGED_RECORD).read_text())


def test_a_remote_failing_while_the_base_is_fetched_is_waited_for_never_a_fallback(tmp_path, corpus, undisturbed,
                                                                                    faultfs):
    """On main one EIO reading `<remote>/init` fell back to init.from: changed meanwhile, its other base was
    staged, the trainer refused it (exit 2), and every later start reused it."""
    cfg, record = _resumed_lora_run(tmp_path, corpus, undisturbed, str(faultfs.root / "remote"))
    faultfs.fail_reads(f"remote/{basecopy.REMOTE_BASE}/{STAGED_CHECKPOINT}/{names.MODEL_FILE}")
    with pytest.raises(SourceUnreachable, match=f"{faultfs.root}/remote/init: cannot be read"):
        _stage_inputs(cfg)
    assert faultfs.hits("error") and not (cfg.scratch_dir / "init").exists()
    faultfs.clear()  # the remote answers again: the retry stages the base the checkpoint was trained on
    assert same_source(record, _staged_record(_stage_inputs(cfg)))


@pytest.mark.parametrize("outage", ["gone", "unmounted"])
def test_a_remote_gone_or_unmounted_is_waited_for_when_checkpoints_record_their_base(tmp_path, corpus, undisturbed,
                                                                                     outage):
    """On main a remote root not there, or an empty directory (an NFS remote unmounted: its mount point's stub),
    read as "no copy": init.from, changed meanwhile, was staged and the trainer refused it for good (exit 2). A
    remote that answers with no `init` (the first sync had not copied it) still falls back to init.from, and so does
    a first start, which has no checkpoint to resume."""
    remote = tmp_path / "remote"
    cfg, record = _resumed_lora_run(tmp_path, corpus, undisturbed, str(remote))
    os.rename(remote, tmp_path / "remote.elsewhere")
    if outage == "unmounted":
        remote.mkdir()
    said = "not there" if outage == "gone" else "an empty directory"
    with pytest.raises(SourceUnreachable, match=said):
        _stage_inputs(cfg)
    assert not (cfg.scratch_dir / "init").exists()

    shutil.rmtree(remote, ignore_errors=True)
    shutil.copytree(tmp_path / "remote.elsewhere", remote)  # the share is back: the base the checkpoint records
    assert same_source(record, _staged_record(_stage_inputs(cfg)))

    shutil.rmtree(cfg.scratch_dir / "init")
    shutil.rmtree(remote)
    remote.mkdir()  # empty, and no sync of this run has completed: not written yet, not unmounted
    sets = initstage.stage_inputs(cfg, base_from_remote=functools.partial(stagingworker._base_from_remote,
                                                                          synced_before=False))
    assert not same_source(record, _staged_record(sets))  # init.from, as at the first staging

    shutil.rmtree(cfg.scratch_dir / "init")
    shutil.rmtree(remote)
    os.rename(tmp_path / "remote.elsewhere", remote)
    shutil.rmtree(remote / basecopy.REMOTE_BASE)  # a remote that answers, with no copy of the base yet
    (remote / "step-00000004").mkdir()
    assert not same_source(record, _staged_record(_stage_inputs(cfg)))  # init.from, as before (the trainer says)

    shutil.rmtree(cfg.scratch_dir)  # a first start: nothing to resume, no copy on the remote needed
    shutil.rmtree(remote)
    assert _staged_record(_stage_inputs(cfg))["from"] == cfg.init.from_


def test_a_staged_copy_of_another_base_is_not_reused_for_a_resume(tmp_path, corpus, undisturbed):
    """What a fallback on main staged (init.from after it changed) is not the base the checkpoint records: the
    next start fetches that base from the remote instead of reusing the copy the trainer refuses."""
    cfg, record = _resumed_lora_run(tmp_path, corpus, undisturbed, str(tmp_path / "remote"))
    other = initstage.stage_init(cfg.init.from_, cfg.scratch_dir)
    assert not same_source(record, json.loads((other / STAGED_RECORD).read_text()))
    assert same_source(record, _staged_record(_stage_inputs(cfg)))


def test_a_stalled_fetch_of_the_base_names_the_remote_copy_not_init_from(tmp_path, corpus, undisturbed, faultfs):
    """Status's stall line ("<what> not answering since T") said `init.from ...` while the remote was read."""
    cfg, _ = _resumed_lora_run(tmp_path, corpus, undisturbed, str(faultfs.root / "remote"))
    faultfs.stall(f"remote/{basecopy.REMOTE_BASE}/{STAGED_CHECKPOINT}/{names.MODEL_FILE}", 600)
    reads, done = ReadWatch(), []
    thread = threading.Thread(target=lambda: done.append(_stage_inputs(cfg, reads)), daemon=True)
    thread.start()
    try:
        wait_for(lambda: faultfs.hits("stall"), 60, "the fetch of the base stalled")
        assert reads.what == f"the LoRA base's copy {faultfs.root}/remote/init"
    finally:
        faultfs.clear()
        thread.join(60)
    assert done and reads.what == ""


def _kill_trainers(run_dir: Path) -> None:
    for pid in [p for pids in trainers_of(run_dir).values() for p in pids]:
        os.kill(pid, signal.SIGKILL)


def test_a_lora_run_rebooted_after_its_base_changed_finishes_on_its_own_base_and_merges(tmp_path, corpus,
                                                                                        undisturbed):
    """The machine reboots (supervisor and trainer killed, /dev/shm emptied) after the predecessor was run again:
    init.from now gives other weights. Before the durable copy the restarted run refused the changed base (exit 2);
    it now fetches its own from the remote, finishes, and `export --merge` finds it with the share gone."""
    run = undisturbed()
    share = tmp_path / "share"
    base = shutil.copytree(run.checkpoint, share / "base")
    config = write_config(tmp_path, corpus, init={"from": str(base)}, lora={"rank": 4, "alpha": 8.0},
                          train={"max_steps": 12, "checkpoint_every": 4}, restart={"hang_timeout": "120s"})
    cfg = load_config(config)
    remote = Path(cfg.run.remote)
    first = start_supervisor(config, tmp_path / "first.out", fake=False, MINILMD_FAULT="hang@6")
    try:  # hangs at step 6: step 4 synced, and the base beside it
        wait_for(lambda: (cfg.run_dir / names.FAULTS_FIRED).is_file() and (remote / "step-00000004").is_dir()
                 and (remote / basecopy.REMOTE_BASE / STAGED_RECORD).is_file(), 180, "step 4 and the base synced")
        first.kill()
        first.wait()
        _kill_trainers(cfg.run_dir)
    finally:
        if first.poll() is None:
            first.kill()
    shutil.rmtree(cfg.scratch_dir)  # the reboot
    shutil.rmtree(base)
    shutil.copytree(run.checkpoint.parent / "step-00000012", base)  # the predecessor, run again: other weights

    proc = start_supervisor(config, tmp_path / "supervisor.out", fake=False)
    code = wait_or_kill(proc, 300)
    out = (tmp_path / "supervisor.out").read_text()
    assert code == 0, out[-3000:]
    assert "the LoRA base this run trained on fetched from" in out, out[-3000:]
    assert state(cfg.run_dir)["phase"] == "done"
    final = checkpoint_dirs.list_checkpoints(remote)[-1]
    assert final.name == "step-00000012"

    shutil.rmtree(share)  # export --merge of the remote's adapter: the recorded base is gone, its copy is not
    merged = cli("export", str(final), "--format", "minimind", "--merge", "--out", str(tmp_path / "merged.pth"),
                 timeout=180)
    assert merged.returncode == 0, merged.stdout + merged.stderr
    assert (tmp_path / "merged.pth").stat().st_size > 0


@pytest.mark.parametrize("damage", ["none", "linked file", "linked directory", "forged manifest", "another base"])
def test_export_reads_a_checkpoint_base_copy_only_as_untrusted(tmp_path, undisturbed, damage):
    """What `export --merge` and `sample` take from `<remote>/init` (trainer/model/basecopy_read.py): the copy
    copied into a private directory, no link followed (before, the checkpoint's validation followed them), the
    manifest the record hashes, the base the adapter records; anything else is an ExportError saying what."""
    from minilmd.trainer.model.basecopy_read import private_copy
    from minilmd.trainer.model.export_paths import ExportError

    staged, record = _staged_base(tmp_path, undisturbed().checkpoint)
    copy = shutil.copytree(staged, tmp_path / "remote" / basecopy.REMOTE_BASE)
    checkpoint = copy / STAGED_CHECKPOINT
    model = json.loads((checkpoint / names.TRAINER_STATE).read_text())["config"]["model"]
    if damage == "linked file":
        (checkpoint / names.MODEL_FILE).rename(tmp_path / "elsewhere")
        (checkpoint / names.MODEL_FILE).symlink_to(tmp_path / "elsewhere")
    elif damage == "linked directory":
        checkpoint.rename(tmp_path / "elsewhere")
        checkpoint.symlink_to(tmp_path / "elsewhere")
    elif damage == "forged manifest":
        manifest = json.loads((checkpoint / names.MANIFEST).read_text())
        (checkpoint / names.MANIFEST).write_text(json.dumps({**manifest, "step": -1}))
    private = tmp_path / "private"
    private.mkdir()
    recorded = {**record, "manifest_sha256": "0" * 64} if damage == "another base" else record
    if damage == "none":
        assert private_copy(copy, recorded, model, private)
        assert sorted(p.relative_to(private) for p in private.rglob("*")) == \
            sorted(p.relative_to(copy) for p in copy.rglob("*"))
        return
    said = {"linked file": f"{checkpoint / names.MODEL_FILE}: a symbolic link",
            "linked directory": f"{checkpoint} is a symbolic link to {tmp_path / 'elsewhere'}: not followed",
            "forged manifest": "not the manifest its source.json hashes", "another base": "a copy of another base"}
    with pytest.raises(ExportError, match=re.escape(said[damage])):
        private_copy(copy, recorded, model, private)


def test_a_pth_bases_record_listing_more_than_the_model_can_hold_is_not_downloaded(tmp_path):
    """A .pth's size is its record's own word, which no hash covers: a record on the remote listing a sparse
    terabyte beside one was downloaded into scratch up to that size before its hash failed. The run's model
    bounds it now (model_shapes.pth_bound): refused before a byte is read."""
    pth, staged, remote, record = _pushed_pth_base(tmp_path)
    kept = tmp_path / "remote" / basecopy.REMOTE_BASE
    (kept / STAGED_RECORD).write_text(json.dumps({**record, "size": 1 << 40}))
    with (kept / STAGED_PTH).open("r+b") as f:
        f.truncate(1 << 40)
    dest = tmp_path / "dest"
    dest.mkdir()
    problems = basecopy.fetch(remote, str(pth), record, dest, max_pth=1 << 20)
    assert problems and "more than a .pth of this run's model can be" in problems[0], problems
    assert not (dest / STAGED_PTH).exists()
