"""Checkpoints whose manifest hashes all match but whose contents are malformed (issue 21): a safetensors header that
is a JSON list, entries without offsets or with offsets that overlap or run past the file, a trainer_state.json that
is a list, JSON nested deep enough to make json.loads raise RecursionError. Each is simply invalid, through the one
validation path: `verify` says INVALID with the reason, `sample` and `export` end with a one-line error, find_latest
quarantines it and takes the one before, the remote fetch sets it aside and fetches the good one beside it; a real
run resumes past it in scratch and from the remote."""
from __future__ import annotations

import hashlib
import json
import shutil
import struct
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from minilmd import checkpoint, checkpoint_dirs
from minilmd.checkpoint_select import find_latest
from minilmd.cli import app
from minilmd.config import load_config
from minilmd.daemon.jobs.sync import Syncer
from minilmd.names import QUARANTINE, REASON_FILE
from weights_helpers import save_checkpoint, tiny_model, train_tokenizer

torch.set_num_threads(1)
DEEP = 100_000
"""Far deeper than json.loads can follow (RecursionError), far below any size cap."""


def rehash(ckpt: Path, name: str) -> None:
    """Make the manifest agree with `name` as it now is: the tampering passes every size and sha256 check."""
    manifest = json.loads((ckpt / "manifest.json").read_text())
    data = (ckpt / name).read_bytes()
    manifest["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (ckpt / "manifest.json").write_text(json.dumps(manifest))


def rewrite_header(ckpt: Path, edit, name: str = "model.safetensors") -> None:
    path = ckpt / name
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    new = edit(header)
    hb = new if isinstance(new, bytes) else json.dumps(new).encode()
    path.write_bytes(struct.pack("<Q", len(hb)) + hb + raw[8 + n:])
    rehash(ckpt, name)


def rewrite_json(ckpt: Path, name: str, edit) -> None:
    new = edit(json.loads((ckpt / name).read_text()))
    (ckpt / name).write_bytes(new if isinstance(new, bytes) else json.dumps(new).encode())
    if name != "manifest.json":
        rehash(ckpt, name)


def tensors(header: dict) -> list[str]:
    return sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])


def _pop_offsets(h):
    del h[tensors(h)[0]]["data_offsets"]
    return h


def _overlap(h):
    first, second = tensors(h)[:2]
    h[second]["data_offsets"] = list(h[first]["data_offsets"])
    return h


def _beyond(h):
    end = max(h[k]["data_offsets"][1] for k in tensors(h))
    h["extra"] = {"dtype": "F32", "shape": [4], "data_offsets": [end, end + 16]}
    return h


def _set(key, value):
    def edit(h):
        h[tensors(h)[0]][key] = value
        return h
    return edit


def _nested(prefix: bytes) -> bytes:
    return prefix + b"[" * DEEP + b"]" * DEEP + b"}"


TAMPERINGS = {
    "header is a list": lambda c: rewrite_header(c, lambda h: [h]),
    "entry without offsets": lambda c: rewrite_header(c, _pop_offsets),
    "overlapping offsets": lambda c: rewrite_header(c, _overlap),
    "offsets beyond the file": lambda c: rewrite_header(c, _beyond),
    "offsets not integers": lambda c: rewrite_header(c, _set("data_offsets", ["0", "4"])),
    "offsets backwards": lambda c: rewrite_header(c, _set("data_offsets", [8, 4])),
    "shape not integers": lambda c: rewrite_header(c, _set("shape", ["x"])),
    "dtype a list": lambda c: rewrite_header(c, _set("dtype", ["F32"])),
    "entry a number": lambda c: rewrite_header(c, lambda h: {**h, tensors(h)[0]: 7}),
    "header nested deep": lambda c: rewrite_header(c, lambda h: _nested(b'{"x":'), "optimizer.safetensors"),
    "trainer_state a list": lambda c: rewrite_json(c, "trainer_state.json", lambda s: [s]),
    "trainer_state nested deep": lambda c: rewrite_json(c, "trainer_state.json", lambda s: _nested(b'{"x":')),
    "config a list": lambda c: rewrite_json(c, "trainer_state.json", lambda s: {**s, "config": [s["config"]]}),
    "model config a string": lambda c: rewrite_json(c, "trainer_state.json",
                                                    lambda s: {**s, "config": {**s["config"], "model": "x"}}),
    "param_groups a string": lambda c: rewrite_json(c, "optimizer.json", lambda m: {**m, "param_groups": "x"}),
    "optimizer scalars a list": lambda c: rewrite_json(c, "optimizer.json", lambda m: {**m, "scalars": [1]}),
    "manifest nested deep": lambda c: rewrite_json(c, "manifest.json", lambda m: _nested(b'{"x":')),
    "manifest a list": lambda c: rewrite_json(c, "manifest.json", lambda m: [m]),
}


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    """A root with two real checkpoints (steps 1 and 2, tokenizer inside), copied for each test."""
    root = tmp_path_factory.mktemp("good")
    tok = train_tokenizer(root / "tokenizer.json")
    save_checkpoint(root / "ckpt", tiny_model(seed=3), step=1, tokenizer=tok)
    save_checkpoint(root / "ckpt", tiny_model(seed=4), step=2, tokenizer=tok)
    return root / "ckpt"


def tampered_root(good: Path, tmp_path: Path, how: str) -> Path:
    root = tmp_path / "ckpt"
    shutil.copytree(good, root)
    TAMPERINGS[how](root / "step-00000002")
    return root


@pytest.mark.parametrize("how", sorted(TAMPERINGS))
def test_a_malformed_checkpoint_with_matching_hashes_is_invalid_with_the_reason(good, tmp_path, how):
    root = tampered_root(good, tmp_path, how)
    with pytest.raises(checkpoint.CheckpointInvalid) as err:
        checkpoint.validate(root / "step-00000002")
    assert err.value.problems and all(isinstance(p, str) and p for p in err.value.problems)
    checkpoint.validate(root / "step-00000001")  # the one beside it is fine


@pytest.mark.slow
@pytest.mark.parametrize("how", sorted(TAMPERINGS))
def test_verify_sample_and_export_say_invalid_without_a_traceback(good, tmp_path, how):
    root = tampered_root(good, tmp_path, how)
    bad = str(root / "step-00000002")
    runner = CliRunner()
    verified = runner.invoke(app, ["verify", bad])
    assert verified.exit_code == 1 and isinstance(verified.exception, SystemExit), verified.output
    assert f"{bad}: INVALID" in verified.output and "  - " in verified.output
    for args in (["sample", bad, "--prompt", "hello", "--max-new-tokens", "2"],
                 ["export", bad, "--format", "hf", "--out", str(tmp_path / "hf")],
                 ["export", str(root / "LATEST"), "--format", "minimind", "--out", str(tmp_path / "m.pth")]):
        result = runner.invoke(app, args)
        assert result.exit_code == 1 and isinstance(result.exception, SystemExit), (args, result.output)
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"minilmd {args[0]}: ") and "invalid" in lines[0], lines
    assert not (tmp_path / "hf").exists() and not (tmp_path / "m.pth").exists()


@pytest.mark.parametrize("how", sorted(TAMPERINGS))
def test_find_latest_quarantines_it_and_takes_the_one_before(good, tmp_path, how):
    root = tampered_root(good, tmp_path, how)
    logged: list[str] = []
    assert find_latest([root], log=logged.append) == root / "step-00000001"
    assert len(list((root / QUARANTINE).glob("step-00000002*"))) == 1
    assert any("step-00000002 is invalid" in line for line in logged), logged


@pytest.mark.slow
@pytest.mark.parametrize("how", sorted(TAMPERINGS))
def test_a_malformed_remote_latest_is_set_aside_and_the_good_one_beside_it_fetched(good, tmp_path, how):
    remote = tampered_root(good, tmp_path, how)
    local = tmp_path / "scratch"
    logged: list[str] = []
    fetched = Syncer(local, str(remote), log=logged.append).fetch_latest()
    assert fetched == local / "step-00000001"
    checkpoint.validate(fetched)
    quarantined = list((remote / QUARANTINE).glob("step-00000002*"))
    assert len(quarantined) == 1 and (quarantined[0] / REASON_FILE).read_text().strip()
    assert checkpoint_dirs.read_latest(remote) == "step-00000001"  # LATEST names only a verified checkpoint


# --- real runs ---------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("how", ["header is a list", "manifest nested deep"])
def test_a_run_resumes_past_a_malformed_newest_checkpoint_in_scratch(tmp_path, corpus, how):
    from in_process import train_in_process
    from supervisor_helpers import run_supervisor, state, write_config

    config = write_config(tmp_path, corpus, remote=False,
                          train={"max_steps": 12, "checkpoint_every": 4, "micro_batch_size": 4, "keep_local": 3})
    cfg = load_config(config)
    cfg.run_dir.mkdir(parents=True)
    out = train_in_process(config)  # the test's process: no signal or fault here (tests/in_process.py)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    TAMPERINGS[how](cfg.checkpoint_dir / "step-00000012")

    assert run_supervisor(config, tmp_path, timeout=300, fake=False) == 0
    log = (cfg.run_dir / "logs" / "attempt-0001.log").read_text()
    assert "step-00000012 is invalid" in log and "resumed from" in log and "step-00000008" in log, log[-3000:]
    assert state(cfg.run_dir)["restarts"] == []
    assert len(list((cfg.checkpoint_dir / QUARANTINE).glob("step-00000012*"))) == 1
    checkpoint.validate(cfg.checkpoint_dir / "step-00000012")  # trained again


@pytest.mark.slow
def test_a_run_fetches_the_good_step_beside_a_malformed_remote_latest(tmp_path, corpus):
    from reliability_helpers import event_texts, remote_of_an_earlier_run
    from supervisor_helpers import READS_THE_SAME, run_supervisor, state

    config, remote = remote_of_an_earlier_run(tmp_path, corpus, max_steps=30)
    cfg = load_config(config)
    rewrite_json(remote / "step-00000020", "trainer_state.json", lambda s: _nested(b'{"x":'))

    assert run_supervisor(config, tmp_path, timeout=120, quick=READS_THE_SAME) == 0
    assert len(list((remote / QUARANTINE).glob("step-00000020*"))) == 1
    assert any("step-00000010" in m for m in event_texts(cfg.run_dir, "fetch"))
    assert "resuming at step 10" in (cfg.run_dir / "logs" / "attempt-0001.log").read_text()
    assert state(cfg.run_dir)["restarts"] == []
    assert checkpoint_dirs.read_latest(remote) == "step-00000030"


# --- fuzz: any JSON where the format has an object, behind matching hashes -------------------------------------

json_values = st.recursive(st.none() | st.booleans() | st.integers(-3, 1 << 40) | st.floats(allow_nan=True)
                           | st.text(max_size=6),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                       max_size=3), max_leaves=10)
FIELDS = {"model.safetensors": ("dtype", "shape", "data_offsets", None),
          "trainer_state.json": ("step", "config", "fingerprints", "init", "early_stop"),
          "optimizer.json": ("param_groups", "param_names", "scalars", "tuple_keys")}


@pytest.mark.slow  # 120 checkpoints validated
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(sorted(FIELDS)), st.integers(0, 63), st.integers(0, 63), json_values)
def test_validate_raises_only_checkpoint_invalid_for_any_json_in_any_part(good, tmp_path, name, which, pick, value):
    ckpt = tmp_path / "fuzz"
    shutil.rmtree(ckpt, ignore_errors=True)
    shutil.copytree(good / "step-00000002", ckpt)
    field = FIELDS[name][which % len(FIELDS[name])]
    if name == "model.safetensors":
        def edit(h):
            key = tensors(h)[pick % len(tensors(h))]
            if field is None:
                h[key] = value
            else:
                h[key][field] = value
            return h
        rewrite_header(ckpt, edit)
    else:
        rewrite_json(ckpt, name, lambda s: {**s, field: value})
    try:
        checkpoint.validate(ckpt)
    except checkpoint.CheckpointInvalid as e:
        assert e.problems
