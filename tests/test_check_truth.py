"""`minilmd run CONFIG --check` says OK only where the launch goes on to train on what the config names: a new user's
walk-through of main found it saying OK where the launch trained on the wrong data, waited for ever or failed.
Each observation goes through `minilmd run --check` and a real `minilmd run` (the fake trainer behind it):

- a typo in data.prepared of a run that has trained before (its staged copy of the old corpus in scratch): on main
  "waits: ... (its share gone?)", and the launch trained from the OLD copy without a word; now exit 2, and staging
  never trains from a copy of another source;
- a typo in init.from at a first launch: on main "waits: init.from ... cannot be reached now", and the launch
  retried in staging for ever; now exit 2. An unmounted share (its mount point an empty stub) is still waited for;
- train.device = "cuda" on a machine without an NVIDIA driver: on main OK, and the launch stopped at once (exit 2);
  "auto" there says it trains on the CPU;
- a corpus too small for one packed window: on main OK, and the trainer failed (exit 65); prepare warns of it;
- another supervisor owning the run: on main OK; now the holder is named, exit 2;
- no run.remote: the checkpoints stay only in scratch, which --check and status now say.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from minilmd.config import load_config
from minilmd.daemon.jobs.staging import stage
from minilmd.daemon.jobs.staging_errors import SourceUnreachable
from minilmd.names import STAGED_CORPUS_SOURCE
from minilmd.protocol import SUPERVISOR_CONFIG
from minilmd.shared_place import gone_or_typo
from supervisor_helpers import cli, env_for, events, run_supervisor, write_config


def _set(key: str, value: str) -> list[str]:
    return ["--set", f'{key}="{value}"']


# --- 1. data.prepared: a typo at a restart ----------------------------------------------------------------------------
@pytest.mark.slow
def test_a_typo_in_data_prepared_of_a_run_that_trained_before_is_refused_not_trained_from_the_old_copy(tmp_path,
                                                                                                       corpus):
    share = shutil.copytree(corpus[0], tmp_path / "nu" / "p3")
    config = write_config(tmp_path, (share, corpus[1]), remote=False)
    cfg = load_config(config)
    assert run_supervisor(config, tmp_path) == 0, (tmp_path / "supervisor.out").read_text()[-2000:]
    assert (cfg.scratch_dir / "corpus" / "meta.json").is_file()
    typo = _set("data.prepared", str(tmp_path / "nu" / "p33"))
    before = events(cfg.run_dir)
    for args, timeout in ((("run", "--check", str(config), *typo), 60), (("run", str(config), *typo), 120)):
        out = cli(*args, timeout=timeout)
        text = out.stdout + out.stderr
        assert out.returncode == SUPERVISOR_CONFIG, text
        assert "data.prepared changed and is not there" in text and f"{tmp_path / 'nu'} holds other entries" in text
        assert f"this run staged {str(share)!r} before" in text and "waits:" not in text, text
    assert events(cfg.run_dir) == before  # the launch started nothing

    shutil.rmtree(share)  # the same data.prepared, its share gone: still trained from the verified copy
    shown = cli("run", "--check", str(config))
    assert shown.returncode == 0 and "trains from the verified copy in scratch" in shown.stdout, shown.stderr
    # no record of the copy's source (staged by an older minilmd): no evidence of a typo, the share gone waited for
    (cfg.scratch_dir / STAGED_CORPUS_SOURCE).unlink()
    (tmp_path / "nu" / "other").mkdir()  # the directory above holds other entries: a typo's evidence, were it one
    shown = cli("run", "--check", str(config), *typo)
    assert shown.returncode == 0 and "this run has started before" in shown.stdout, shown.stdout + shown.stderr


def test_a_link_on_the_way_that_leads_nowhere_is_the_share_gone_not_a_typo(tmp_path):
    """~/corpora -> /net/fs/corpora with the share gone: the walk up met the dangling link and called the home
    directory above it, which holds other entries, evidence of a typo."""
    (tmp_path / "home" / "other").mkdir(parents=True)
    (tmp_path / "home" / "corpora").symlink_to(tmp_path / "net" / "fs" / "corpora")
    assert gone_or_typo(tmp_path / "home" / "corpora" / "wiki") == ""
    (tmp_path / "home" / "corpus").mkdir()  # a real directory holding other entries: a typo's evidence still
    (tmp_path / "home" / "corpus" / "wiki").mkdir()
    assert "holds other entries, but no wikk" in gone_or_typo(tmp_path / "home" / "corpus" / "wikk")


def test_a_copy_without_a_record_of_its_source_is_trained_from_and_a_trailing_slash_is_the_same_source(tmp_path,
                                                                                                       corpus):
    a = shutil.copytree(corpus[0], tmp_path / "nfs" / "a")
    staged = stage(str(a) + "/", tmp_path / "shm")  # recorded as spelt, with its "/"
    shutil.rmtree(a)
    logs: list[str] = []
    assert stage(str(a), tmp_path / "shm", log=logs.append) == staged
    (tmp_path / "shm" / STAGED_CORPUS_SOURCE).unlink()  # staged by a minilmd before the record
    assert stage(str(a), tmp_path / "shm", log=logs.append) == staged
    assert sum("training from its verified copy" in m for m in logs) == 2, logs


def test_staging_never_trains_from_a_verified_copy_of_another_source(tmp_path, corpus):
    """On main a source that could not be read was replaced by whatever verified copy scratch held, of any corpus."""
    a = shutil.copytree(corpus[0], tmp_path / "nfs" / "a")
    staged = stage(str(a), tmp_path / "shm")
    with pytest.raises(SourceUnreachable, match="the copy in scratch is not of this source"):
        stage(str(tmp_path / "nfs" / "b"), tmp_path / "shm")
    logs: list[str] = []
    shutil.rmtree(a)
    assert stage(str(a), tmp_path / "shm", log=logs.append) == staged  # its own source gone: trained from
    assert any("training from its verified copy" in m for m in logs), logs


# --- 2. init.from: a typo at a first launch ---------------------------------------------------------------------------
@pytest.mark.slow
def test_a_typo_in_init_from_at_a_first_launch_is_refused_not_waited_for(tmp_path, corpus):
    share = tmp_path / "nu"
    share.mkdir()
    (share / "base.pth").write_bytes(b"\0" * 4096)
    config = write_config(tmp_path, corpus, remote=False, init={"from": str(share / "base.pth")})
    typo = _set("init.from", str(share / "basee.pth"))
    for args, timeout in ((("run", "--check", str(config), *typo), 60), (("run", str(config), *typo), 120)):
        out = cli(*args, timeout=timeout)
        text = out.stdout + out.stderr
        assert out.returncode == SUPERVISOR_CONFIG, text
        assert f"init.from = {str(share / 'basee.pth')!r}" in text and f"{share} holds other entries" in text, text
    assert not load_config(config).run_dir.exists()

    os.rename(share, tmp_path / "nu.gone")
    share.mkdir()  # the mount point of a share not mounted: waited for
    shown = cli("run", "--check", str(config), *typo)
    assert shown.returncode == 0 and "waits: init.from" in shown.stdout, shown.stdout + shown.stderr


# --- 4. a corpus too small for one packed window ----------------------------------------------------------------------
@pytest.mark.slow
def test_a_corpus_too_small_for_one_packed_window_is_refused_at_check_and_launch_and_prepare_warns(tmp_path, corpus):
    from data_helpers import run_prepare, write_jsonl
    from trainer_corpus import write_prepared

    root, vocab = corpus
    small = write_prepared(tmp_path / "small", [[5, 6, 7] * 5, [8, 9] * 5], [[5, 6, 7] * 4], vocab,
                           root / "tokenizer.json")  # 29 train tokens: no window of 32 fits (it takes 63)
    config = write_config(tmp_path, (small, vocab), remote=False)
    cfg = load_config(config)
    for args, timeout in ((("run", "--check", str(config)), 60), (("run", str(config)), 120)):
        out = cli(*args, timeout=timeout)
        text = out.stdout + out.stderr
        assert out.returncode == SUPERVISOR_CONFIG, text
        assert "the train split has 29 tokens; packed mode needs at least 2 x seq_len - 1 = 63" in text, text
    assert not cfg.run_dir.exists()
    padded = cli("run", "--check", str(config), "--set", 'data.mode="padded"')  # a document a row: no windows
    assert padded.returncode == 0, padded.stdout + padded.stderr

    texts = ["很好的酒店", "服务不错", "一般般吧", "价格有点贵", "早餐还行", "房间很小"]
    src = write_jsonl(tmp_path / "few.jsonl", texts)
    meta, logged = run_prepare([src], root / "tokenizer.json", tmp_path / "prepared", val_fraction=0.5)
    assert "(0 windows)" in logged
    assert f"warning: the train split has {meta['splits']['train']['tokens']:,} tokens; packed mode needs" in logged


# --- 3. train.device without an NVIDIA driver -------------------------------------------------------------------------
@pytest.mark.slow
def test_cuda_without_a_driver_is_refused_and_auto_says_it_trains_on_the_cpu(tmp_path, corpus):
    from minilmd.daemon.host.nvml import open_nvml_or_reason

    why = open_nvml_or_reason()
    if not isinstance(why, str):
        why.close()
        pytest.skip("this machine has an NVIDIA driver")
    config = write_config(tmp_path, corpus, remote=False)
    cuda = ["--set", 'train.device="cuda"']
    for args, timeout in ((("run", "--check", str(config), *cuda), 60), (("run", str(config), *cuda), 120)):
        out = cli(*args, timeout=timeout)
        text = out.stdout + out.stderr
        assert out.returncode == SUPERVISOR_CONFIG and f"train.device = cuda, but {why}" in text, text
    assert not load_config(config).run_dir.exists()
    auto = cli("run", "--check", str(config), "--set", 'train.device="auto"')
    assert auto.returncode == 0 and f"note: train.device = auto trains on the CPU here ({why})" in auto.stdout, \
        auto.stdout + auto.stderr
    cpu = cli("run", "--check", str(config), "--set", 'train.device="cpu"')
    assert cpu.returncode == 0 and "trains on the CPU here" not in cpu.stdout, cpu.stdout + cpu.stderr


# --- 5. another supervisor owns the run -------------------------------------------------------------------------------
HOLD_THE_LOCK = """
import sys, time
from minilmd.daemon.host.lock import RunLock
RunLock(sys.argv[1]).acquire()
print("held", flush=True)
time.sleep(600)
"""


@pytest.mark.slow
def test_check_names_the_supervisor_that_owns_the_run(tmp_path, corpus):
    config = write_config(tmp_path, corpus, remote=False)
    cfg = load_config(config)
    assert cli("run", "--check", str(config)).returncode == 0
    assert not cfg.run_dir.exists()  # --check creates neither the run directory nor its lock
    holder = subprocess.Popen([sys.executable, "-c", HOLD_THE_LOCK, str(cfg.run_dir)], stdout=subprocess.PIPE,
                              text=True, env=env_for())
    try:
        assert holder.stdout.readline().strip() == "held"
        out = cli("run", "--check", str(config))
        text = out.stdout + out.stderr
        assert out.returncode == SUPERVISOR_CONFIG, text
        assert f"run already owned by another supervisor: pid {holder.pid} on " in text, text
    finally:
        holder.kill()
        holder.wait()
    assert cli("run", "--check", str(config)).returncode == 0  # the lock file left behind is held by nobody


# --- 6. no run.remote: the checkpoints stay in scratch ----------------------------------------------------------------
@pytest.mark.slow
def test_without_a_remote_check_and_status_say_the_checkpoints_stay_only_in_scratch(tmp_path, corpus):
    config = write_config(tmp_path, corpus, remote=False)
    cfg = load_config(config)
    shown = cli("run", "--check", str(config))
    assert shown.returncode == 0, shown.stderr
    assert f"note: no run.remote: the checkpoints stay only in scratch ({cfg.checkpoint_dir})" in shown.stdout
    with_remote = write_config(tmp_path, corpus, name="r", remote=True)
    assert "no run.remote" not in cli("run", "--check", str(with_remote)).stdout

    assert run_supervisor(config, tmp_path) == 0, (tmp_path / "supervisor.out").read_text()[-2000:]
    status = cli("status", str(cfg.run_dir)).stdout
    assert f"remote: none configured (checkpoints only in scratch, the newest at {cfg.checkpoint_dir}" in status, \
        status
