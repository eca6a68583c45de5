"""What a trainer start reads besides the corpus is staged too (daemon/jobs/initstage.py): the val split of
`[eval] probe` and the weights `[init] from` names. The trainer reads only their copies in scratch, so a share gone
at a restart (renamed away here, the way an NFS outage looks to a reader) costs nothing, and a source unreachable at
the first start is waited for (status says so), never a final exit; a source there and wrong stays final."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
from pathlib import Path

import pytest

from minilmd import checkpoint_dirs
from minilmd.config import load_config
from minilmd.daemon.jobs import initstage
from minilmd.daemon.jobs.staging import SourceInvalid
from minilmd.daemon.jobs.staging_errors import SourceUnreachable
from minilmd.init_source import InitSourceError, fingerprint, resolve
from minilmd.names import FAULTS_FIRED, TRAINER_STATE
from reliability_helpers import trainers_of
from supervisor_helpers import (
    cli,
    run_supervisor,
    start_supervisor,
    state,
    step_of_state,
    wait_for,
    wait_or_kill,
    write_config,
)

pytestmark = pytest.mark.slow  # most tests stage real corpora and checkpoints or run a real supervisor


def _files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def _kill_a_supervisor_after_its_first_checkpoint(config: Path, cfg, out: Path) -> None:
    """A supervisor SIGKILLed past its first checkpoint, its trainers too (systemd's restart comes next)."""
    first = start_supervisor(config, out, FAKE_STEP_S="0.05")
    try:
        wait_for(lambda: step_of_state(cfg.run_dir) >= 12, 60, "a first checkpoint")
        first.kill()
        first.wait()
        for pid in [p for pids in trainers_of(cfg.run_dir).values() for p in pids]:
            os.kill(pid, signal.SIGKILL)
    finally:
        if first.poll() is None:
            first.kill()


# --- the staging itself -------------------------------------------------------------------------------------------
def test_the_probe_stages_its_val_split_only_reuses_a_good_copy_and_recopies_a_damaged_one(tmp_path, corpus):
    source = shutil.copytree(corpus[0], tmp_path / "share" / "probe")
    scratch = tmp_path / "scratch"
    staged = initstage.stage_probe(str(source), scratch)
    assert _files_under(staged) == {"meta.json", "val/tokens.bin", "val/doc_lengths.npy"}
    assert (staged / "meta.json").read_bytes() == (source / "meta.json").read_bytes()
    assert initstage.probe_problems(staged) == []

    tokens = staged / "val" / "tokens.bin"
    with open(tokens, "r+b") as f:
        f.write(b"\xff\xff")  # a bad page in scratch
    assert initstage.probe_problems(staged)
    logged: list[str] = []
    initstage.stage_probe(str(source), scratch, logged.append)
    assert initstage.probe_problems(staged) == [] and not any("reusing" in m for m in logged), logged
    initstage.stage_probe(str(source), scratch, logged.append)
    assert "reusing" in logged[-1], logged


def test_a_probe_gone_is_unreachable_a_probe_there_and_wrong_is_invalid(tmp_path, corpus):
    gone = re.escape(f"{tmp_path / 'gone'}: not there (its share gone?)")  # shared_place's words, as the corpus's
    with pytest.raises(initstage.SourceUnreachable, match=gone):
        initstage.stage_probe(str(tmp_path / "gone"), tmp_path / "scratch")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("not a corpus")  # (an empty directory: a share not mounted)
    with pytest.raises(SourceInvalid, match="no meta.json"):
        initstage.stage_probe(str(tmp_path / "other"), tmp_path / "scratch")
    wrong = shutil.copytree(corpus[0], tmp_path / "wrong")
    (wrong / "val" / "tokens.bin").write_bytes(b"\x01\x00" * 10)  # not what its meta.json lists
    with pytest.raises(SourceInvalid, match="meta.json"):
        initstage.stage_probe(str(wrong), tmp_path / "scratch")
    assert not (tmp_path / "scratch" / "probe").exists()


def test_an_empty_probe_directory_is_an_unmounted_share_waited_for_or_its_copy_used(tmp_path, corpus):
    """A probe corpus that is a mount point reads as an empty directory while its share is not mounted: on main
    "no meta.json", a final data error (65), though scratch held a verified copy (the main corpus's rule since
    651f68c)."""
    source = shutil.copytree(corpus[0], tmp_path / "share" / "probe")
    staged = initstage.stage_probe(str(source), tmp_path / "scratch")
    os.rename(source, source.with_name("mounted-elsewhere"))
    source.mkdir()  # the mount point's stub
    logged: list[str] = []
    assert initstage.stage_probe(str(source), tmp_path / "scratch", logged.append) == staged
    assert any("empty directory" in m and "reusing its verified copy" in m for m in logged), logged
    with pytest.raises(initstage.SourceUnreachable, match="empty directory"):
        initstage.stage_probe(str(source), tmp_path / "empty-scratch")  # nothing staged yet: waited for
    assert not (tmp_path / "empty-scratch" / "probe").exists()


def test_init_from_stages_a_checkpoint_with_the_sources_own_record(tmp_path, undisturbed):
    base = shutil.copytree(undisturbed().checkpoint, tmp_path / "share" / "base")
    staged = initstage.stage_init(str(base), tmp_path / "scratch")
    record = json.loads((staged / "source.json").read_text())
    assert record == {"from": str(base), **fingerprint(resolve(str(base)))}
    assert record["path"] == str(base.resolve())  # the source's path, not scratch's: lineage and same_source
    assert initstage.init_problems(staged) == []
    copy = staged / "checkpoint"
    assert _files_under(copy) == _files_under(base)
    victim = next(p for p in copy.iterdir() if p.suffix == ".safetensors")
    victim.write_bytes(victim.read_bytes()[:-8] + b"\0" * 8)
    assert initstage.init_problems(staged)
    initstage.stage_init(str(base), tmp_path / "scratch")  # re-fetched: the damaged copy is not reused
    assert initstage.init_problems(staged) == []


def test_init_from_gone_is_unreachable_there_and_wrong_stays_final(tmp_path):
    with pytest.raises(initstage.SourceUnreachable):
        initstage.stage_init(str(tmp_path / "gone.pth"), tmp_path / "scratch")
    (tmp_path / "notes.txt").write_text("not weights")
    with pytest.raises(InitSourceError, match="not a MiniMind .pth"):
        initstage.stage_init(str(tmp_path / "notes.txt"), tmp_path / "scratch")


def test_the_staged_state_field_round_trips_and_status_shows_it():
    from minilmd.daemon.base.statesections import Staging
    from minilmd.daemon.views.status import _staging_lines

    assert "unreachable" not in Staging().to_dict()  # today's keys while nothing is unreachable
    s = Staging.from_dict({"state": "done", "unreachable": "/nfs/probe/meta.json: gone",
                           "unreachable_since": 1.0e9})
    (line,) = _staging_lines(s)
    assert "init source unreachable since 2001-09-09" in line and "retrying" in line and "/nfs/probe" in line


# --- under the supervisor ------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_probe_unreachable_at_the_first_start_is_waited_for_then_the_run_proceeds(tmp_path, corpus):
    probe = tmp_path / "share" / "probe"
    probe.parent.mkdir()  # the share not mounted: its mount point an empty stub (no share beside others: a typo)
    config = write_config(tmp_path, corpus, remote=False, eval={"probe": str(probe)},
                          restart={"backoff_initial": "0.1s", "backoff_max": "0.3s"})
    run_dir = load_config(config).run_dir
    proc = start_supervisor(config, tmp_path / "supervisor.out")
    try:
        wait_for(lambda: (state(run_dir).get("staging") or {}).get("unreachable_since"), 60,
                 "the probe to be found unreachable")
        shown = cli("status", str(run_dir)).stdout  # the probe's wait, not init.from's (there is none)
        assert "probe source unreachable since" in shown and "retrying" in shown and "eval.probe" in shown, shown
        assert state(run_dir).get("child") is None and proc.poll() is None  # no trainer, no exit: waiting
        shutil.copytree(corpus[0], probe)  # the share is back
        assert wait_or_kill(proc, 120) == 0, (tmp_path / "supervisor.out").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    staging = state(run_dir)["staging"]
    assert "unreachable_since" not in staging, staging
    assert _files_under(load_config(config).scratch_dir / "probe") == {"meta.json", "val/tokens.bin",
                                                                         "val/doc_lengths.npy"}


@pytest.mark.slow
@pytest.mark.parametrize("gone", ["probe", "base"])
def test_a_lora_run_whose_probe_or_base_is_gone_at_a_restart_finishes(tmp_path, corpus, undisturbed, gone):
    """The share renamed away after staging, then a SIGKILL of the trainer: the restart reads scratch only. On
    main this ended the run: exit 65 for the probe, 2 for the base."""
    share = tmp_path / "share"
    base = shutil.copytree(undisturbed().checkpoint, share / "base")
    probe = shutil.copytree(corpus[0], share / "probe")
    config = write_config(tmp_path, corpus, remote=False, init={"from": str(base)}, eval={"probe": str(probe)},
                          lora={"rank": 4, "alpha": 8.0},
                          train={"max_steps": 12, "checkpoint_every": 4, "eval_every": 4},
                          restart={"hang_timeout": "120s"})
    cfg = load_config(config)
    proc = start_supervisor(config, tmp_path / "supervisor.out", fake=False, MINILMD_FAULT="hang@6")
    try:  # the trainer hangs at step 6, past its first checkpoint: the share goes, then the trainer is killed
        wait_for(lambda: (cfg.run_dir / FAULTS_FIRED).is_file(), 180, "the trainer to reach step 6")
        killed_at = 6
        os.rename(share / gone, share / f"{gone}.gone")
        pids = [p for pids in trainers_of(cfg.run_dir).values() for p in pids]
        assert pids
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        code = wait_or_kill(proc, 300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, (tmp_path / "supervisor.out").read_text()[-3000:]
    restarts = state(cfg.run_dir)["restarts"]
    assert restarts and restarts[0]["cause"] == "killed", restarts
    final = checkpoint_dirs.list_checkpoints(cfg.checkpoint_dir)[-1]
    record = json.loads((final / TRAINER_STATE).read_text())["init"]
    assert record["path"] == str(base.resolve()) and record["from"] == str(base), record  # the source, not scratch
    metrics = [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("kind") == "eval" and r.get("probe_loss") is not None and r["step"] > killed_at
               for r in metrics), metrics[-5:]  # the probe, evaluated after the restart, from its staged copy


def test_a_run_without_probe_or_init_stages_nothing_more(tmp_path, corpus):
    config = write_config(tmp_path, corpus, remote=False)
    assert run_supervisor(config, tmp_path) == 0
    scratch = load_config(config).scratch_dir
    assert not (scratch / "probe").exists() and not (scratch / "init").exists()


@pytest.mark.slow
def test_a_supervisor_restarted_while_the_share_is_gone_resumes_from_scratch_alone(tmp_path, corpus, undisturbed):
    """systemd restarts a killed supervisor during the outage: the base and the probe staged by the first one are
    reused from scratch (verified), the source is not needed, the run finishes."""
    share = tmp_path / "share"
    base = shutil.copytree(undisturbed().checkpoint, share / "base")
    probe = shutil.copytree(corpus[0], share / "probe")
    config = write_config(tmp_path, corpus, remote=False, init={"from": str(base)}, eval={"probe": str(probe)},
                          lora={"rank": 4, "alpha": 8.0})
    cfg = load_config(config)
    _kill_a_supervisor_after_its_first_checkpoint(config, cfg, tmp_path / "first.out")
    os.rename(share, tmp_path / "share.gone")
    assert run_supervisor(config, tmp_path, FAKE_STEP_S="0.05") == 0, (tmp_path / "supervisor.out").read_text()
    text = (tmp_path / "supervisor.out").read_text()
    assert "reusing the verified copy of init.from" in text and "reusing its verified copy" in text, text[-3000:]


@pytest.mark.slow
def test_a_staged_base_damaged_in_scratch_is_fetched_again_and_the_run_finishes(tmp_path, corpus, undisturbed):
    """A bad page in scratch's copy of the LoRA base: the restarted trainer refuses it as data (65), the copy fails
    verification, the supervisor stages it again from the source and the run goes on (a config error, final,
    would have ended it)."""
    base = shutil.copytree(undisturbed().checkpoint, tmp_path / "share" / "base")
    config = write_config(tmp_path, corpus, remote=False, init={"from": str(base)}, lora={"rank": 4, "alpha": 8.0},
                          train={"max_steps": 12, "checkpoint_every": 4}, restart={"hang_timeout": "120s"})
    cfg = load_config(config)
    proc = start_supervisor(config, tmp_path / "supervisor.out", fake=False, MINILMD_FAULT="hang@6")
    try:
        wait_for(lambda: (cfg.run_dir / FAULTS_FIRED).is_file(), 180, "the trainer to reach step 6")
        weights = next((cfg.scratch_dir / "init" / "checkpoint").glob("*.safetensors"))
        data = bytearray(weights.read_bytes())
        data[-8:] = b"\0" * 8
        weights.write_bytes(bytes(data))
        for pid in [p for pids in trainers_of(cfg.run_dir).values() for p in pids]:
            os.kill(pid, signal.SIGKILL)
        code = wait_or_kill(proc, 300)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = (tmp_path / "supervisor.out").read_text()
    assert code == 0, out[-3000:]
    assert "staged copy of init.from" in out and "re-staging" in out, out[-3000:]
    assert initstage.init_problems(cfg.scratch_dir / "init") == []


def test_a_probe_there_and_not_a_corpus_stays_a_final_data_error(tmp_path, corpus):
    (tmp_path / "not-a-corpus").mkdir()
    (tmp_path / "not-a-corpus" / "notes.txt").write_text("not a corpus")  # empty: a share not mounted, waited for
    config = write_config(tmp_path, corpus, remote=False, eval={"probe": str(tmp_path / "not-a-corpus")})
    assert run_supervisor(config, tmp_path) == 65, (tmp_path / "supervisor.out").read_text()[-2000:]
    assert "no meta.json" in state(load_config(config).run_dir)["last_error"]


def test_the_probe_reads_its_val_split_only(tmp_path, corpus):
    """The trainer's probe rows come from meta.json and val/ alone: a copy without its train split (what staging
    puts in scratch) gives the same rows as the whole corpus; on main the train split was mapped and scanned."""
    from minilmd.plan.early_stop import probe_batches

    whole = load_config(write_config(tmp_path, corpus, remote=False, eval={"probe": str(corpus[0])}))
    val_only = shutil.copytree(corpus[0], tmp_path / "val-only")
    shutil.rmtree(val_only / "train")
    staged = load_config(write_config(tmp_path, corpus, name="t", remote=False,
                                      eval={"probe": str(corpus[0]), "probe_staged": str(val_only)}))
    expected, got = probe_batches(whole), probe_batches(staged)
    assert expected and len(got) == len(expected)
    assert all((a.input_ids == b.input_ids).all() for a, b in zip(expected, got, strict=True))


def test_a_corpus_source_whose_reads_stall_mid_copy_shows_stalled(tmp_path, corpus, faultfs):
    """The corpus's tokens.bin answers its stat but its reads block: status says so until they return."""
    from reliability_helpers import copy_corpus

    copy_corpus(corpus[0], faultfs.backing / "corpus")
    config = write_config(tmp_path, (faultfs.root / "corpus", corpus[1]), remote=False)
    cfg = load_config(config)
    faultfs.stall("corpus/train/tokens.bin", 600)
    proc = start_supervisor(config, tmp_path / "supervisor.out", MINILMD_SYNC_STALLED_AFTER="1")
    try:
        wait_for(lambda: (state(cfg.run_dir).get("staging") or {}).get("stalled"), 120, "the stall shown")
        shown = cli("status", str(cfg.run_dir)).stdout
        assert f"the corpus source {faultfs.root / 'corpus'} not answering since" in shown and "(stalled)" in shown
        faultfs.clear()
        assert wait_or_kill(proc, 180) == 0, (tmp_path / "supervisor.out").read_text()[-3000:]
    finally:
        faultfs.clear()
        if proc.poll() is None:
            proc.kill()
    assert "stalled" not in state(cfg.run_dir)["staging"]
    assert "answering again" in (tmp_path / "supervisor.out").read_text()


def test_a_corpus_source_failing_with_eio_is_waited_for_past_the_no_progress_limit(tmp_path, corpus, faultfs):
    """The NFS behind the corpus answers EIO while the supervisor stages: on main every try counted towards
    restart.no_progress_limit, and a few minutes of outage ended the run with 79, final."""
    import errno

    from reliability_helpers import copy_corpus

    copy_corpus(corpus[0], faultfs.backing / "corpus")
    config = write_config(tmp_path, (faultfs.root / "corpus", corpus[1]), remote=False,
                          restart={"backoff_initial": "0.1s", "backoff_max": "0.3s", "no_progress_limit": 2})
    cfg = load_config(config)
    faultfs.add_rule("*", "corpus/meta.json", "error", errno=errno.EIO)
    proc = start_supervisor(config, tmp_path / "supervisor.out")
    try:
        waits = lambda: [m for m in (tmp_path / "supervisor.out").read_text().splitlines()
                         if "corpus source unreachable" in m and "not a failure" in m]
        wait_for(lambda: len(waits()) > 3, 120, "more tries than restart.no_progress_limit, each waited for")
        shown = cli("status", str(cfg.run_dir)).stdout
        assert "corpus source unreachable since" in shown and "retrying" in shown, shown
        st = state(cfg.run_dir)
        assert proc.poll() is None and st["phase"] == "staging" and st["no_progress_streak"] == 0, st
        faultfs.clear()  # the NFS answers again
        assert wait_or_kill(proc, 180) == 0, (tmp_path / "supervisor.out").read_text()[-3000:]
    finally:
        faultfs.clear()
        if proc.poll() is None:
            proc.kill()
    assert faultfs.hits("error")
    st = state(cfg.run_dir)
    assert st["restarts"] == [] and "unreachable_since" not in st["staging"], st
    assert "corpus source reachable again after" in (tmp_path / "supervisor.out").read_text()


def test_a_probe_meta_json_that_is_a_fifo_or_dev_zero_is_refused_without_blocking(tmp_path, corpus):
    """Another run's probe corpus with a FIFO or a link to /dev/zero as meta.json: on main staging blocked on the
    FIFO for ever, or read /dev/zero until memory ran out, inside the supervisor."""
    probe = tmp_path / "probe"
    shutil.copytree(corpus[0], probe)
    (probe / "meta.json").unlink()
    os.mkfifo(probe / "meta.json")
    with pytest.raises(SourceInvalid, match="not a prepared corpus's meta.json"):
        initstage.stage_probe(str(probe), tmp_path / "scratch")
    (probe / "meta.json").unlink()
    (probe / "meta.json").symlink_to("/dev/zero")
    with pytest.raises(SourceInvalid, match="not a prepared corpus's meta.json"):
        initstage.stage_probe(str(probe), tmp_path / "scratch")
    assert not (tmp_path / "scratch" / "probe").exists()


def test_a_source_file_that_grows_while_copied_whole_is_unreachable_not_copied_without_end(tmp_path):
    """A file copied whole (a checkpoint part, a probe split) that another process appends to as it is read: the
    copy stops one byte past the size it had (the room counted in scratch) and says so; the staging worker waits
    and copies it again, as for any source it cannot read now."""
    src = tmp_path / "part.bin"
    src.write_bytes(b"x" * (initstage.CHUNK + 10))

    def append():
        with open(src, "ab") as f:
            f.write(b"y" * initstage.CHUNK)

    with pytest.raises(SourceUnreachable, match="changed while being read"):
        initstage._copy(src, tmp_path / "dest" / "part.bin", answered=append)
    assert initstage._copy(src, tmp_path / "again.bin")[0] == src.stat().st_size  # still now: copied whole
    assert (tmp_path / "again.bin").read_bytes() == src.read_bytes()


@pytest.mark.slow
@pytest.mark.parametrize("outage", ["gone", "unmounted"])
def test_a_supervisor_restarted_while_the_corpus_share_is_gone_trains_from_its_staged_copy(tmp_path, corpus, outage):
    """systemd restarts a killed supervisor while the corpus's share is gone: on main the launch check refused it
    ("data.prepared ...: no such directory", exit 2, final) though staging trains from the verified copy in
    scratch. The same when the corpus directory is a mount point and its share is not mounted: an empty directory
    (on main "no meta.json there", exit 2, and staging's "no meta.json", 65). A first launch with no such corpus
    stays a config error, and so does a directory holding other files but no meta.json."""
    share = shutil.copytree(corpus[0], tmp_path / "share" / "corpus")
    config = write_config(tmp_path, (share, corpus[1]), remote=False)
    cfg = load_config(config)
    _kill_a_supervisor_after_its_first_checkpoint(config, cfg, tmp_path / "first.out")
    if outage == "gone":
        os.rename(tmp_path / "share", tmp_path / "share.gone")
    else:
        os.rename(share, tmp_path / "share.gone")
        share.mkdir()  # the mount point's stub
    shown = cli("run", "--check", str(config))
    assert shown.returncode == 0 and "waits: data.prepared" in shown.stdout, shown.stdout + shown.stderr
    assert run_supervisor(config, tmp_path, FAKE_STEP_S="0.05") == 0, (tmp_path / "supervisor.out").read_text()
    assert "training from its verified copy" in (tmp_path / "supervisor.out").read_text()

    fresh = write_config(tmp_path, (share, corpus[1]), name="fresh", remote=False)
    refused = cli("run", "--check", str(fresh))
    said = "no such directory" if outage == "gone" else "an empty directory"
    assert refused.returncode == 2 and said in refused.stderr, refused.stdout + refused.stderr
    if outage == "unmounted":
        (share / "notes.txt").write_text("not a corpus")
        refused = cli("run", "--check", str(config))
        assert refused.returncode == 2 and "no meta.json there" in refused.stderr, refused.stdout + refused.stderr
