"""Checkpoints: the atomic protocol, each way validation refuses a bad checkpoint, resume fallback, retention,
kills at each point of a save (real processes, real SIGKILL), the background saver, and `minilmd verify`."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from minilmd import checkpoint as ck
from minilmd import checkpoint_dirs, checkpoint_select
from minilmd.model_shapes import expected_state_shapes
from minilmd.names import QUARANTINE, REASON_FILE
from minilmd.trainer.checkpoint import save as ckpt_io
from minilmd.trainer.model.minimind import MiniMindForCausalLM
from minilmd.untrusted import sha256_regular
from weights_helpers import CHECKPOINT_MODEL, make_run, save_run, saved_steps, trainer_state

torch.set_num_threads(1)

TINY = CHECKPOINT_MODEL
REPO = Path(__file__).resolve().parent.parent


def expectation(**over) -> ck.Expectation:
    return ck.Expectation(model=over.get("model", dict(TINY)), data_fingerprint=over.get("data", "d" * 64),
                          tokenizer_fingerprint=over.get("tok", "t" * 64))


@pytest.fixture(scope="module")
def run():
    return make_run(3)


def test_save_layout_latest_and_roundtrip(tmp_path):
    model, opt = make_run(3)  # its own: this test steps it further
    path = ckpt_io.save(tmp_path, 3, model.state_dict(), opt.state_dict(), trainer_state(3))
    assert path.name == "step-00000003" and ck.step_of(path) == 3
    assert checkpoint_dirs.read_latest(tmp_path) == "step-00000003"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-")] == []
    manifest = json.loads((path / ck.MANIFEST).read_text())
    assert set(manifest["files"]) == set(ck.REQUIRED_FILES)
    assert ck.validate(path, expectation())["tokens_seen"] == 96

    model_state, opt_state, state = ckpt_io.load(path)
    assert set(model_state) == set(expected_state_shapes(TINY))
    for k, v in model.state_dict().items():
        assert torch.equal(model_state[k], v), k
    # Loaded into a fresh model/optimizer, the next step is bit-identical to the original's.
    twin = MiniMindForCausalLM(TINY)
    twin.load_state_dict(model_state, strict=True)
    twin_opt = torch.optim.AdamW(twin.parameters(), lr=1e-3)
    twin_opt.load_state_dict(opt_state)
    assert twin_opt.state_dict()["param_groups"] == opt.state_dict()["param_groups"]
    x = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(5))
    for m, o in ((model, opt), (twin, twin_opt)):
        m(x, labels=x).loss.backward()
        o.step()
        o.zero_grad()
    for (k, a), b in zip(model.state_dict().items(), twin.state_dict().values(), strict=True):
        assert torch.equal(a, b), k


def test_validate_is_torch_free(tmp_path, run):
    path = save_run(tmp_path, 3, *run)
    code = textwrap.dedent(f"""
        import sys
        sys.modules["torch"] = None  # any import of torch now fails
        from minilmd import checkpoint as ck
        from minilmd import checkpoint_dirs
        state = ck.validate({str(path)!r})
        print("ok", state["step"], checkpoint_dirs.list_checkpoints({str(tmp_path)!r})[0].name)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ok", "3", "step-00000003"]


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def refused(path, expected=None, exc=ck.CheckpointInvalid) -> str:
    with pytest.raises(exc) as info:
        ck.validate(path, expected)
    return str(info.value)


def test_flipped_byte_names_the_file(tmp_path, run):
    path = save_run(tmp_path, 3, *run)
    flip_byte(path / ck.OPTIMIZER_FILE, (path / ck.OPTIMIZER_FILE).stat().st_size - 7)
    msg = refused(path)
    assert "optimizer.safetensors: sha256 mismatch" in msg and "model.safetensors" not in msg


def test_truncated_file_is_a_size_problem(tmp_path, run):
    path = save_run(tmp_path, 3, *run)
    f = path / ck.MODEL_FILE
    size = f.stat().st_size
    os.truncate(f, size - 100)
    assert f"model.safetensors: size {size - 100} bytes, manifest.json says {size}" in refused(path)


def test_missing_manifest(tmp_path, run):
    path = save_run(tmp_path, 3, *run)
    (path / ck.MANIFEST).unlink()
    assert "no manifest.json" in refused(path)
    assert checkpoint_dirs.list_checkpoints(tmp_path) == []  # a directory without a manifest does not exist for readers


def test_corrupt_manifest(tmp_path, run):
    path = save_run(tmp_path, 3, *run)
    (path / ck.MANIFEST).write_text("{not json")
    assert "manifest.json is not valid JSON" in refused(path)


def test_nan_tensor_is_named(tmp_path, run):
    model, opt = run
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state["model.layers.1.mlp.up_proj.weight"][3, 4] = float("nan")
    state["model.norm.weight"][0] = float("inf")
    path = ckpt_io.save(tmp_path, 3, state, opt.state_dict(), trainer_state(3))
    msg = refused(path)
    assert "tensor model.layers.1.mlp.up_proj.weight has 1 non-finite value(s)" in msg
    assert "tensor model.norm.weight has 1 non-finite value(s)" in msg


def test_nan_in_optimizer_state_is_named(tmp_path, run):
    model, opt = run
    osd = opt.state_dict()
    osd = {"state": {i: {k: v.clone() for k, v in s.items()} for i, s in osd["state"].items()},
           "param_groups": osd["param_groups"]}
    osd["state"][2]["exp_avg_sq"].view(-1)[0] = float("nan")
    path = ckpt_io.save(tmp_path, 3, model.state_dict(), osd, trainer_state(3))
    assert "optimizer.safetensors: tensor state.2.exp_avg_sq has 1 non-finite" in refused(path)


def test_wrong_config_shows_the_difference(tmp_path, run):
    path = save_run(tmp_path, 3, *run)
    msg = refused(path, expectation(model={**TINY, "hidden_size": 128, "num_hidden_layers": 3}),
                  ck.CheckpointMismatch)
    assert "model.hidden_size: checkpoint 64, run 128" in msg and "model.num_hidden_layers: checkpoint 2, run 3" in msg


def test_tensors_not_matching_the_recorded_config(tmp_path, run):
    model, opt = run
    state = dict(model.state_dict())
    state.pop("model.layers.0.self_attn.k_norm.weight")
    state["model.norm.weight"] = torch.ones(65)
    state["extra.weight"] = torch.ones(2)
    path = ckpt_io.save(tmp_path, 3, state, opt.state_dict(), trainer_state(3))
    msg = refused(path)
    assert "missing tensor model.layers.0.self_attn.k_norm.weight [16]" in msg
    assert "unexpected tensor extra.weight [2]" in msg
    assert "tensor model.norm.weight has shape [65], the config needs [64]" in msg


def test_fp16_weights_refused(tmp_path, run):
    model, opt = run
    state = {k: v.half() if k == "model.norm.weight" else v for k, v in model.state_dict().items()}
    path = ckpt_io.save(tmp_path, 3, state, opt.state_dict(), trainer_state(3))
    assert "tensor model.norm.weight is F16, checkpoints hold F32" in refused(path)


def test_optimizer_step_disagreement(tmp_path, run):
    model, opt = run  # the optimizer made 3 steps
    path = ckpt_io.save(tmp_path, 5, model.state_dict(), opt.state_dict(), trainer_state(5))
    assert "optimizer step 3 (state.0.step" in refused(path) and "disagrees with checkpoint step 5" in refused(path)


def rewrite_trainer_state(path: Path, change) -> None:
    """Edit trainer_state.json and enter its new size and sha256 in the manifest: every hash still matches."""
    state_file = path / ck.TRAINER_STATE
    state = json.loads(state_file.read_text())
    change(state)
    state_file.write_text(json.dumps(state))
    manifest = json.loads((path / ck.MANIFEST).read_text())
    manifest["files"][ck.TRAINER_STATE] = {"sha256": sha256_regular(state_file), "size": state_file.stat().st_size}
    (path / ck.MANIFEST).write_text(json.dumps(manifest))


def files_intact(path: Path) -> bool:
    manifest = json.loads((path / ck.MANIFEST).read_text())
    return ck.verify_manifest(manifest, lambda n: (path / n).stat().st_size, lambda n: sha256_regular(path / n)) == []


def test_a_trainer_state_naming_another_step_than_the_manifest_is_invalid(tmp_path, run):
    path = save_run(tmp_path, 3, *run)  # the optimizer made 3 steps too
    rewrite_trainer_state(path, lambda state: state.update(step=4))
    assert files_intact(path)
    msg = refused(path)
    assert "trainer_state.json says step 4, manifest.json says 3" in msg and "directory name" not in msg


def test_a_directory_name_naming_another_step_than_the_manifest_is_invalid(tmp_path, run):
    path = save_run(tmp_path, 3, *run)  # manifest, trainer_state and optimizer all say step 3
    path = path.rename(path.with_name("step-00000004"))
    assert files_intact(path)
    msg = refused(path)
    assert "directory name says step 4, manifest.json says 3" in msg and "trainer_state.json" not in msg


@pytest.mark.parametrize("kind", ["data", "tokenizer"])
def test_fingerprint_mismatch(tmp_path, run, kind):
    path = save_run(tmp_path, 3, *run)
    with pytest.raises(ck.CheckpointMismatch) as info:
        ck.validate(path, expectation(**{"data" if kind == "data" else "tok": "f" * 64}))
    assert info.value.kind == kind and f"{kind} fingerprint differs" in str(info.value)


def test_find_latest_falls_back_and_quarantines(tmp_path, run):
    model, opt = run
    root = tmp_path / "local"
    good = save_run(root, 3, model, opt)
    bad = save_run(root, 4)
    flip_byte(bad / ck.MODEL_FILE, 200)
    logs = []
    assert checkpoint_select.find_latest([root], expectation(), log=logs.append) == good
    assert not bad.exists()
    (qdir,) = (root / QUARANTINE).iterdir()
    assert qdir.name.startswith("step-00000004-")
    assert "model.safetensors: sha256 mismatch" in (qdir / REASON_FILE).read_text()
    assert "step-00000004" in logs[0] and "sha256 mismatch" in logs[0]
    assert checkpoint_select.find_latest([tmp_path / "nothing-here"], expectation()) is None


def test_find_latest_across_roots_local_first(tmp_path, run):
    local, remote = tmp_path / "local", tmp_path / "remote"
    save_run(local, 3, *run)
    same_step_remote = save_run(remote, 3, *run)
    assert checkpoint_select.find_latest([local, remote], expectation()) == local / "step-00000003"
    newer_remote = save_run(remote, 4)
    assert checkpoint_select.find_latest([local, remote], expectation()) == newer_remote
    assert same_step_remote.exists()


def test_find_latest_refuses_a_different_run(tmp_path, run):
    path = save_run(tmp_path, 3, *run, data="e" * 64)
    with pytest.raises(ck.CheckpointMismatch) as info:
        checkpoint_select.find_latest([tmp_path], expectation(), log=lambda s: None)
    assert info.value.kind == "data" and path.exists()  # refused, not quarantined


def test_prune_keeps_the_newest_valid(tmp_path, run):
    model, opt = run
    for step in (3, 4, 5, 6):
        ckpt_io.save(tmp_path, step, model.state_dict(), opt.state_dict(), trainer_state(step))
    # The optimizer of `run` made 3 steps, so only step 3 is valid: pruning to 1 must keep it, and the damaged
    # newer ones are moved aside (they never count towards `keep`), not deleted.
    deleted = checkpoint_select.prune(tmp_path, keep=1, log=lambda s: None)
    assert deleted == []
    assert [p.name for p in checkpoint_dirs.list_checkpoints(tmp_path)] == ["step-00000003"]
    assert len(list((tmp_path / QUARANTINE).iterdir())) == 3


def test_prune_deletes_beyond_keep_and_respects_protect(tmp_path):
    paths = saved_steps(tmp_path, 5)
    deleted = checkpoint_select.prune(tmp_path, keep=2, protect=[paths[1]], log=lambda s: None)
    assert sorted(ck.step_of(p) for p in deleted) == [2, 3]
    assert [ck.step_of(p) for p in checkpoint_dirs.list_checkpoints(tmp_path)] == [1, 4, 5]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_clean_stale_tmp(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".tmp-step-00000007-{dead.pid}"
    mine = tmp_path / f".tmp-step-00000008-{os.getpid()}"
    live = tmp_path / f".tmp-step-00000009-{os.getppid()}"
    for d in (stale, mine, live):
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"x")
    assert sorted(checkpoint_dirs.clean_stale_tmp(tmp_path)) == sorted([stale, mine])
    assert live.exists() and not stale.exists()


def test_verify_manifest_with_callbacks(tmp_path, run):
    path = save_run(tmp_path, 3, *run)
    manifest = json.loads((path / ck.MANIFEST).read_text())
    sizes = {n: (path / n).stat().st_size for n in manifest["files"]}
    good = ck.verify_manifest(manifest, sizes.get, lambda n: sha256_regular(path / n))
    assert good == []
    sizes.pop(ck.TRAINER_STATE)
    assert ck.verify_manifest(manifest, sizes.get, lambda n: "0") == ["trainer_state.json: missing (listed in "
                                                                       "manifest.json)"]


def test_rng_roundtrip():
    import random

    import numpy as np

    state = json.loads(json.dumps(ckpt_io.capture_rng()))
    first = (random.random(), np.random.rand(), torch.rand(3))
    ckpt_io.restore_rng(state)
    again = (random.random(), np.random.rand(), torch.rand(3))
    assert first[0] == again[0] and first[1] == again[1] and torch.equal(first[2], again[2])


def test_async_checkpointer_snapshots_and_prunes(tmp_path):
    model, opt = make_run(2)
    saver = ckpt_io.AsyncCheckpointer(tmp_path, keep=1, log=lambda s: None)
    blocked = saver.save(2, model, opt, trainer_state(2))
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():  # the loop goes on changing the live weights while the writer runs
        for p in model.parameters():
            p.add_(1.0)
    path = saver.wait()
    assert blocked >= 0 and path == tmp_path / "step-00000002"
    saved, _, _ = ckpt_io.load(path)
    assert all(torch.equal(saved[k], v) for k, v in expected.items())
    assert ck.validate(path, expectation())["step"] == 2
    opt_meta = json.loads((path / ck.OPTIMIZER_META).read_text())
    assert opt_meta["param_names"][0] == "model.embed_tokens.weight"

    x = torch.randint(0, 256, (2, 16))
    model(x, labels=x).loss.backward()
    opt.step()
    saver.save(3, model, opt, trainer_state(3))
    saver.wait()
    assert [p.name for p in checkpoint_dirs.list_checkpoints(tmp_path)] == ["step-00000003"]  # keep=1 pruned step 2


SAVER = """
import sys, torch
sys.path.insert(0, {tests!r})
from weights_helpers import make_run, save_run
from pathlib import Path
model, opt = make_run(3)
save_run(Path({root!r}), 3, model, opt)
x = torch.randint(0, 256, (2, 16))
model(x, labels=x).loss.backward(); opt.step()
save_run(Path({root!r}), 4, model, opt)
"""


@pytest.mark.slow
@pytest.mark.parametrize("point", ck.KILL_POINTS)
def test_sigkill_inside_save_leaves_a_usable_root(tmp_path, point):
    root = tmp_path / "ckpt"
    env = {**os.environ, ck.KILL_ENV: f"{point}@4", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", SAVER.format(tests=str(REPO / "tests"), root=str(root))],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    step4 = root / "step-00000004"
    if point == "before_latest":
        assert checkpoint_dirs.read_latest(root) == "step-00000003" and step4.exists()
        want = step4  # renamed into place: complete, only the pointer is behind
    else:
        assert not step4.exists() and [p.name for p in root.glob(".tmp-step-00000004-*")]
        want = root / "step-00000003"
    assert checkpoint_select.find_latest([root], expectation(), log=lambda s: None) == want
    # The next writer cleans the debris of the dead one.
    checkpoint_dirs.clean_stale_tmp(root)
    assert not list(root.glob(".tmp-*"))


def run_cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minilmd.cli", *args], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.slow
def test_verify_command(tmp_path, run):
    good = save_run(tmp_path / "root", 3, *run)
    out = run_cli("verify", str(good))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "step-00000003" in out.stdout and "ok" in out.stdout

    bad = save_run(tmp_path / "root", 4)
    os.truncate(bad / ck.MODEL_FILE, 1000)
    out = run_cli("verify", str(tmp_path / "root"), "--json")
    assert out.returncode == 1
    report = json.loads(out.stdout)
    by_name = {Path(r["path"]).name: r for r in report["checkpoints"]}
    assert by_name["step-00000003"]["ok"] is True
    assert by_name["step-00000004"]["ok"] is False
    assert "model.safetensors: size 1000 bytes" in by_name["step-00000004"]["problems"][0]
    assert bad.exists()  # verify reports, it never moves anything

    out = run_cli("verify", str(tmp_path / "nope"))
    assert out.returncode == 1 and "no checkpoint" in (out.stdout + out.stderr)


def test_two_concurrent_prunes_never_fail(tmp_path):
    """The trainer's saver and the supervisor both prune the local root; neither may trip over the other."""
    import threading

    saved_steps(tmp_path, 6)
    errors = []

    def prune():
        try:
            checkpoint_select.prune(tmp_path, keep=2, log=lambda s: None)
        except Exception as e:  # noqa: BLE001 - any error of either thread fails the test below
            errors.append(e)

    threads = [threading.Thread(target=prune) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert [ck.step_of(p) for p in checkpoint_dirs.list_checkpoints(tmp_path)] == [5, 6]
    assert not (tmp_path / QUARANTINE).exists()


def test_verify_with_a_run_config_shows_the_model_difference(tmp_path, run):
    good = save_run(tmp_path / "root", 3, *run)
    config = tmp_path / "run.toml"
    model = {**TINY, "hidden_size": 96}
    config.write_text("[run]\nname = \"r\"\ndir = \"" + str(tmp_path / "run") + "\"\n"
                      "[data]\nprepared = \"" + str(tmp_path / "no-corpus") + "\"\n"
                      "[train]\nmax_steps = 10\nseq_len = 64\n"
                      "[model]\n" + "".join(f"{k} = {v!r}\n" for k, v in model.items()))
    out = run_cli("verify", str(good), "--config", str(config))
    assert out.returncode == 1
    assert "model.hidden_size: checkpoint 64, run 96" in out.stdout
    assert "fingerprints not checked" in out.stderr  # the corpus is not there: said, not silently skipped


def test_a_resume_reads_the_files_a_run_carries_once_as_the_manifest_lists_them(tmp_path, run):
    """resume.read_checkpoint: a DPO run's reference comes with the rest of the checkpoint (rank 0 reads it when the
    job spans nodes), checked against the manifest by the checkpoint format's own rule; a checkpoint without one
    carries nothing, and a reference that is not the file the manifest lists is an invalid checkpoint."""
    from minilmd.names import DPO_REFERENCE
    from minilmd.trainer.loop.resume import read_checkpoint

    model, opt = run
    plain = ckpt_io.save(tmp_path / "plain", 3, model.state_dict(), opt.state_dict(), trainer_state(3))
    assert read_checkpoint(plain).carried == {}
    dpo = ckpt_io.save(tmp_path / "dpo", 3, model.state_dict(), opt.state_dict(), trainer_state(3),
                       extra={DPO_REFERENCE: b"sums"})
    found = read_checkpoint(dpo)
    assert found.carried == {DPO_REFERENCE: b"sums"} and found.state["step"] == 3
    (dpo / DPO_REFERENCE).write_bytes(b"SUMS")  # the size the manifest lists, other bytes
    with pytest.raises(ck.CheckpointInvalid, match=f"{DPO_REFERENCE}: sha256 mismatch"):
        read_checkpoint(dpo)


def test_a_background_write_carries_the_files_and_notes_of_its_own_save_call(tmp_path, monkeypatch):
    """DPO's reference pass sets new extra files and manifest notes for each periodic save (trainer/loop/saving.py
    save_pass) while the previous save may still be written: that write must keep what its own call was given (before:
    it read them when it ran, so a step 0 could carry a later pass's files under an earlier pass's notes)."""
    import threading
    import time

    gate = threading.Event()

    class HeldClock:  # the writer thread's first read of the clock waits until the caller has moved on
        def __getattr__(self, name):
            return getattr(time, name)

        def perf_counter(self) -> float:
            if threading.current_thread() is not threading.main_thread():
                assert gate.wait(30), "never released"
            return time.perf_counter()

    monkeypatch.setattr(ckpt_io, "time", HeldClock())
    model = torch.nn.Linear(4, 4)
    saver = ckpt_io.AsyncCheckpointer(tmp_path, keep=None)
    saver.extra, saver.notes = {"a.bin": b"first"}, {"n": 1}
    saver.save(0, model, torch.optim.AdamW(model.parameters()), {"step": 0})
    saver.extra, saver.notes = {"a.bin": b"second"}, {"n": 2}  # set for the next save while this one is written
    gate.set()
    saver.wait()
    step0 = tmp_path / "step-00000000"
    assert (step0 / "a.bin").read_bytes() == b"first" and json.loads((step0 / "manifest.json").read_text())["n"] == 1
