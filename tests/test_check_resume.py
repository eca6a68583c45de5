"""`minilmd run --check` says where the launch resumes from, and refuses what the launch would. A new user walking
through main found `run --check` saying OK for a finished run whose `[model]` had changed since, and the launch
then failing (exit 2) with `CheckpointMismatch: <scratch>/checkpoints/.tmp-step-...-fetch-PID: saved by a
different model config: ...`, the finished run now shown as `failed`. Now `--check` reads the checkpoint the launch
would resume from (in scratch as the trainer finds it, on the remote as the fetch would: its metadata only) and
says `resumes from step N (scratch|remote: ...)`, or refuses, exit 2, in the user's terms; the launch refuses before
it starts anything, in the same words, and the run stays `done`. Real runs, through `minilmd run` and the fake
trainer.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from minilmd.config import load_config
from minilmd.names import SCRATCH_BASE_ENV
from minilmd.protocol import SUPERVISOR_CONFIG
from supervisor_helpers import cli, events, run_supervisor, state, write_config
from trainer_corpus import synthetic_prepared

WIDER = ["--set", "model.hidden_size=64"]  # the runs here train ONE_LAYER_MODEL: hidden_size 32


def finished_run(tmp_path: Path, corpus, remote: bool = True):
    """A run trained to its end (20 steps, a checkpoint every 10): (its config, its RunConfig). With a remote, its
    scratch is emptied then, as a reboot empties /dev/shm: the launch would fetch from the remote."""
    config = write_config(tmp_path, corpus, remote=remote, train={"max_steps": 20})
    assert run_supervisor(config, tmp_path) == 0, (tmp_path / "supervisor.out").read_text()[-3000:]
    cfg = load_config(config)
    if remote:
        shutil.rmtree(cfg.scratch_dir)
    return config, cfg


def assert_refused_alike(config: Path, cfg, args: list[str], *words: str) -> None:
    """`run --check` and the launch both exit 2 with `words`, no class name, no temporary path; the launch started
    nothing (no event), and the finished run is still `done`, as `minilmd status` says."""
    before = events(cfg.run_dir)
    for cmd, timeout in ((("run", "--check", str(config), *args), 60), (("run", str(config), *args), 120)):
        out = cli(*cmd, timeout=timeout)
        text = out.stdout + out.stderr
        assert out.returncode == SUPERVISOR_CONFIG, text
        missing = [w for w in words if w not in text]
        assert not missing, f"missing {missing} in:\n{text}"
        assert "CheckpointMismatch" not in text and ".tmp-" not in text and "Traceback" not in text, text
    assert events(cfg.run_dir) == before
    assert state(cfg.run_dir)["phase"] == "done"
    shown = cli("status", str(cfg.run_dir)).stdout
    assert "failed" not in shown, shown


@pytest.mark.slow
def test_a_finished_run_with_another_model_on_its_remote_is_refused_at_check_and_launch_in_the_same_words(tmp_path,
                                                                                                          corpus):
    config, cfg = finished_run(tmp_path, corpus)
    remote = sorted(p.name for p in Path(cfg.run.remote).iterdir())
    said = cli("run", "--check", str(config))
    assert said.returncode == 0, said.stderr
    assert f"run is done (step 20/20; remote: {cfg.run.remote}/step-00000020): nothing to do" in said.stdout, \
        said.stdout
    assert_refused_alike(config, cfg, WIDER,
                         f"this run's checkpoints (step 20, on the remote {cfg.run.remote}) were trained with "
                         f"model.hidden_size 32; the config says 64",
                         "Put the old value back to resume them, or give the config a new run.dir")
    assert sorted(p.name for p in Path(cfg.run.remote).iterdir()) == remote  # nothing fetched, moved or written
    assert not cfg.checkpoint_dir.exists()


@pytest.mark.slow
def test_check_judges_the_remote_the_launch_fetches_when_another_user_took_the_default_scratch_root(
        tmp_path, corpus, monkeypatch):
    """A reboot empties /dev/shm and another user makes /dev/shm/minilmd-<uid> first: the launch makes a private,
    empty root and fetches from the remote. Before, `--check` skipped the resume look as for a scratch of another
    run's: no line of where it starts, the whole budget's time, and OK (exit 0) for a config of another model,
    which the launch then refuses (a new user's three-day run, after a reboot on a shared server)."""
    base = tmp_path / "shm"
    base.mkdir()
    base.chmod(0o1777)
    monkeypatch.setenv(SCRATCH_BASE_ENV, str(base))
    config = write_config(tmp_path, corpus, run={"scratch": ""}, train={"max_steps": 20})
    assert run_supervisor(config, tmp_path) == 0, (tmp_path / "supervisor.out").read_text()[-3000:]
    cfg = load_config(config)
    root = cfg.scratch_dir.parent
    assert root == base / f"minilmd-{os.geteuid()}"
    shutil.rmtree(root)  # the reboot
    root.write_text("")  # the name taken (a file needs no second user: tests/test_scratch_root.py)
    said = cli("run", "--check", str(config))
    assert said.returncode == 0, said.stdout + said.stderr
    assert "note: the default scratch root is taken: " in said.stdout, said.stdout
    assert f"run is done (step 20/20; remote: {cfg.run.remote}/step-00000020)" in said.stdout, said.stdout
    assert_refused_alike(config, cfg, WIDER,  # --check and the launch, before anything is made
                         f"this run's checkpoints (step 20, on the remote {cfg.run.remote}) were trained with "
                         f"model.hidden_size 32; the config says 64")
    assert root.is_file() and sorted(p.name for p in base.iterdir()) == [root.name]  # no private root made


@pytest.mark.slow
def test_a_run_with_another_model_or_corpus_in_scratch_is_refused_and_one_that_fits_resumes_from_there(tmp_path,
                                                                                                       corpus):
    config, cfg = finished_run(tmp_path, corpus, remote=False)
    said = cli("run", "--check", str(config))
    assert said.returncode == 0, said.stderr
    assert f"run is done (step 20/20; scratch: {cfg.checkpoint_dir / 'step-00000020'})" in said.stdout, said.stdout
    assert_refused_alike(config, cfg, WIDER,
                         f"this run's checkpoints (step 20, in scratch {cfg.checkpoint_dir}) were trained with "
                         f"model.hidden_size 32; the config says 64")
    other = synthetic_prepared(tmp_path / "other-corpus", corpus[0] / "tokenizer.json", corpus[1])
    assert_refused_alike(config, cfg, ["--set", f'data.prepared="{other}"'],
                         "this run's checkpoints (step 20, in scratch", "were trained with another corpus than the "
                         "corpus data.prepared names now (data fingerprint ", "Point data.prepared back at that corpus")


@pytest.mark.slow
def test_check_passes_by_a_damaged_newest_checkpoint_as_the_launch_does_and_moves_nothing(tmp_path, corpus):
    config, cfg = finished_run(tmp_path, corpus, remote=False)
    newest = cfg.checkpoint_dir / "step-00000020"
    state_file = newest / "trainer_state.json"
    state_file.write_text(state_file.read_text().replace('"step": 20', '"step": 21'))  # its hash no longer matches
    said = cli("run", "--check", str(config))
    assert said.returncode == 0, said.stderr
    assert f"resumes from step 10 (scratch: {cfg.checkpoint_dir / 'step-00000010'})" in said.stdout, said.stdout
    assert f"note: checkpoint {newest} is invalid: " in said.stdout, said.stdout
    assert newest.is_dir() and not (cfg.checkpoint_dir / "quarantine").exists()  # --check moved nothing


@pytest.mark.slow
def test_a_remote_checkpoint_with_another_model_recorded_is_refused_from_its_metadata_alone(tmp_path, corpus):
    """The look at the remote reads the manifest and trainer_state.json only: a remote checkpoint whose weights are
    gone is still told apart by what it recorded."""
    config, cfg = finished_run(tmp_path, corpus)
    (Path(cfg.run.remote) / "step-00000020" / "model.safetensors").unlink()
    said = cli("run", "--check", str(config), *WIDER)
    assert said.returncode == SUPERVISOR_CONFIG, said.stdout + said.stderr
    assert "(step 20, on the remote" in said.stderr and "model.hidden_size 32; the config says 64" in said.stderr


def test_the_fetchs_refusal_names_the_remote_checkpoint_in_the_checks_words(tmp_path, corpus):
    """The fetch's own refusal (a remote that did not answer the launch's look in time) names the remote checkpoint
    in `run --check`'s words, not its temporary copy in scratch (on main: `.tmp-step-00000010-fetch-PID`)."""
    import fake_trainer
    from minilmd.checkpoint import CheckpointMismatch, Expectation
    from minilmd.daemon.jobs.resumefrom import refusal
    from minilmd.daemon.jobs.sync import Syncer

    cfg = load_config(write_config(tmp_path, corpus))
    remote = Path(cfg.run.remote)
    fake_trainer.save(remote, 10, 1, cfg, {}, keep=2)
    wider = Expectation(model={**cfg.model_dict(), "hidden_size": 64})
    with pytest.raises(CheckpointMismatch) as caught:
        Syncer(cfg.checkpoint_dir, str(remote), wider).fetch_latest()
    assert str(caught.value.path) == str(remote / "step-00000010"), caught.value
    said = refusal(caught.value, f"on the remote {remote}")
    assert said.startswith(f"this run's checkpoints (step 10, on the remote {remote}) were trained with "
                           f"model.hidden_size 32; the config says 64: "), said
    assert not list(cfg.checkpoint_dir.glob(".tmp-*")) and (remote / "step-00000010" / "manifest.json").is_file()


def test_the_look_at_the_remote_follows_no_link_opens_no_fifo_and_reads_no_more_than_listed(tmp_path, corpus):
    """A local remote is a place others write: the look reads trainer_state.json as the fetch reads a remote file
    (from the root's descriptor, a regular file only, never past its listed size); one that is a link (here to a
    private file whose bytes would pass), a FIFO or longer than listed makes its checkpoint invalid, passed by for
    the older one, and nothing of the remote is moved."""
    import fake_trainer
    from minilmd.daemon.jobs.resumefrom import expectation
    from minilmd.daemon.jobs.sync import Syncer

    cfg = load_config(write_config(tmp_path, corpus))
    remote = Path(cfg.run.remote)
    for step in (10, 20):
        fake_trainer.save(remote, step, step, cfg, fake_trainer.fingerprints(cfg.data.prepared), keep=3)
    newest = remote / "step-00000020" / "trainer_state.json"
    kept = newest.read_bytes()
    private = tmp_path / "private.json"
    private.write_bytes(kept)
    syncer = Syncer(cfg.checkpoint_dir, str(remote), expectation(cfg))
    assert syncer.peek_latest() == ("step-00000020", [])
    for plant in ("link", "fifo", "longer"):
        newest.unlink()
        if plant == "link":
            newest.symlink_to(private)
        elif plant == "fifo":
            os.mkfifo(newest)
        else:
            newest.write_bytes(kept + b" ")
        name, passed = syncer.peek_latest()
        assert name == "step-00000010", (plant, passed)
        assert len(passed) == 1 and passed[0].startswith(f"checkpoint {remote / 'step-00000020'} is invalid: "), \
            (plant, passed)
    assert sorted(p.name for p in remote.iterdir()) == ["LATEST", "step-00000010", "step-00000020"]


def test_a_checkpoint_in_a_taken_default_scratch_root_is_not_the_runs_for_any_check(tmp_path, corpus, monkeypatch):
    """Another user took the default scratch root (here a link to a directory of his holding `s/checkpoints/
    step-00000005`): the launch never uses it. Before, only the resume look knew that: init.from's check and the
    remote's line took his planted step for the run's own, so a mistyped init.from passed `--check` (exit 0, never
    looked at) and the launch would have waited on it for ever (review2 F2). Now every check asks one answer,
    probes.scratch_checkpoints."""
    base = tmp_path / "shm"
    base.mkdir()
    base.chmod(0o1777)
    monkeypatch.setenv(SCRATCH_BASE_ENV, str(base))
    planted = tmp_path / "his" / "s" / "checkpoints" / "step-00000005"
    planted.mkdir(parents=True)
    (planted / "manifest.json").write_text("{}")
    (base / f"minilmd-{os.geteuid()}").symlink_to(tmp_path / "his")
    config = write_config(tmp_path, corpus, run={"scratch": ""}, init={"from": str(tmp_path / "tpyo" / "base.pth")})
    said = cli("run", "--check", str(config))
    assert said.returncode == SUPERVISOR_CONFIG, said.stdout + said.stderr
    assert "init.from" in said.stderr and str(tmp_path / "tpyo") in said.stderr, said.stderr


@pytest.mark.root
def test_a_staged_corpus_in_a_taken_default_scratch_root_is_not_the_runs_copy(tmp_path, corpus, monkeypatch):
    """A run that has started before, after a reboot: another user (nobody) made the default scratch root first and
    put `s/corpus` in it, and data.prepared is mistyped (its directory holds other corpora, not this name). The
    launch never uses his root: it makes a private, empty one, so no staged copy stands behind the typo. Before, the
    checks took his directory for the run's verified copy: `--check` said "trains from the verified copy in scratch,
    or waits for the share", exit 0, and the launch would have waited for the typo for ever; without his directory
    the same config is refused as a typo. Now the staged copy is looked for in the launch's scratch only
    (path_checks.launch_scratch, as the checkpoints are: probes.scratch_checkpoints)."""
    from minilmd.names import STAGED_CORPUS, STATE

    base = tmp_path / "shm"
    base.mkdir()
    base.chmod(0o1777)
    monkeypatch.setenv(SCRATCH_BASE_ENV, str(base))
    shares = tmp_path / "shares"
    shares.mkdir()
    shutil.copytree(corpus[0], shares / "corpus-a")
    config = write_config(tmp_path, (shares / "corpus-b", corpus[1]), run={"scratch": ""})
    cfg = load_config(config)
    cfg.run_dir.mkdir(parents=True)
    (cfg.run_dir / STATE).write_text("{}")  # has started before (path_checks.has_started: a regular file)
    his = base / f"minilmd-{os.geteuid()}"
    for made in (his, his / "s", his / "s" / STAGED_CORPUS):
        made.mkdir()
        os.chown(made, 65534, 65534)
    said = cli("run", "--check", str(config))
    assert said.returncode == SUPERVISOR_CONFIG, said.stdout + said.stderr
    text = said.stdout + said.stderr
    assert "holds other entries, but no corpus-b), and scratch holds no staged copy of it: a typo?" in text, text
    assert "verified copy in scratch" not in text, text
