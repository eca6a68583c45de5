"""Bad input everywhere a user can give it, through the real commands: one clear message naming what and where,
the documented exit status, and nothing created or left behind.

- config, via `minilmd run` and `minilmd train`: wrong types, unknown keys, a missing budget, paths that do not
  exist or are not writable, a remote URL of an unknown protocol, seq_len beyond the model: exit 2, every problem
  in one message, no run directory, no scratch;
- corpus, via `minilmd prepare`: each bad-line kind, a 100 MB single line, an empty file, a directory given as a
  file: exit 65 (2 for arguments), file:line:reason named, no output directory;
- prepared data, via `minilmd train` and `minilmd run`: tokens.bin and doc_lengths.npy that disagree, ids beyond
  the vocabulary, a wrong format version: exit 65, final (no restarts);
- operator: `status`/`stop`/`logs` on a directory that is not a run; a stale lock and an orphaned trainer left by
  a supervisor killed with SIGKILL.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from in_process import train_in_process
from minilmd.config import load_config
from minilmd.protocol import EXIT_DATA, SUPERVISOR_CONFIG
from reliability_helpers import copy_corpus
from supervisor_helpers import cli, env_for, start_supervisor, state, step_of_state, wait_for, write_config

# Every test runs real `minilmd` processes (about 0.4 s each for a prepare, seconds for a run): the slow tier. The
# fast tier keeps each bad-line kind in process and one exit 65 through the CLI (test_prepare.py).
pytestmark = pytest.mark.slow

TOKENIZER_OF = lambda corpus: corpus[0] / "tokenizer.json"


def minilmd(*args: str, timeout: float = 120, fake: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minilmd.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env_for(fake=fake))


# --- config ---------------------------------------------------------------------------------------------------------
def bad_config(tmp_path: Path, read_only: Path) -> tuple[Path, list[str]]:
    """A config with seven problems at once, and a fragment of the message expected for each."""
    text = f"""
[run]
name = "bad"
dir = "{read_only / 'run'}"
scratch = "{tmp_path / 'scratch'}"
remote = "nosuchproto://bucket/run"
colour = "blue"

[data]
prepared = "{tmp_path / 'no-such-corpus'}"

[model]
max_position_embeddings = 128

[train]
lr = "fast"
seq_len = 256
"""
    path = tmp_path / "bad.toml"
    path.write_text(text, encoding="utf-8")
    expected = ["run.dir", "is not writable", "unknown protocol 'nosuchproto'", "unknown key run.colour",
                "no such directory", "train.lr = 'fast'", "larger than model.max_position_embeddings",
                "max_steps"]
    return path, expected


@pytest.mark.parametrize("command", ["run", "train"])
def test_a_config_with_every_kind_of_problem_is_refused_at_once_and_creates_nothing(tmp_path, read_only_dir,
                                                                                     command):
    config, fragments = bad_config(tmp_path, read_only_dir)
    out = minilmd(command, str(config))
    text = out.stdout + out.stderr
    assert out.returncode == SUPERVISOR_CONFIG, text
    missing = [f for f in fragments if f not in text]
    assert not missing, f"missing {missing} in:\n{text}"
    assert str(config) in text and "Traceback" not in text
    assert not (tmp_path / "scratch").exists() and not (read_only_dir / "run").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.toml", "ro"]


def test_a_config_that_is_not_toml_or_does_not_exist(tmp_path):
    broken = tmp_path / "broken.toml"
    broken.write_text("[run\nname = \n", encoding="utf-8")
    for command in ("run", "train"):
        for path in (broken, tmp_path / "missing.toml"):
            out = minilmd(command, str(path))
            assert out.returncode == SUPERVISOR_CONFIG, out.stdout + out.stderr
            assert str(path) in out.stdout + out.stderr and "Traceback" not in out.stdout + out.stderr


# --- corpus: minilmd prepare ------------------------------------------------------------------------------------------
BAD_LINES = {
    "invalid_utf8": b'{"text": "ok \xff\xfe"}\n',
    "invalid_json": b'{"text": "unterminated\n',
    "missing_text": b'{"content": "no text key"}\n',
    "text_not_string": b'{"text": 42}\n',
    "empty_text": b'{"text": ""}\n',
}


def prepare(tmp_path: Path, corpus, *inputs: Path, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return minilmd("prepare", *map(str, inputs), "--tokenizer", str(TOKENIZER_OF(corpus)), "--out",
                   str(tmp_path / "out"), "--workers", "0", *extra, timeout=300)


@pytest.mark.parametrize("reason", sorted(BAD_LINES))
def test_each_bad_line_kind_is_named_with_file_and_line_and_nothing_is_written(tmp_path, corpus, reason):
    src = tmp_path / "in.jsonl"
    src.write_bytes(b'{"text": "first good line"}\n{"text": "second good line"}\n' + BAD_LINES[reason])
    out = prepare(tmp_path, corpus, src)
    assert out.returncode == EXIT_DATA, out.stdout + out.stderr
    assert f"{src}:3: {reason.replace('_', ' ')}" in out.stdout + out.stderr
    assert not (tmp_path / "out").exists()
    skipped = prepare(tmp_path, corpus, src, extra=("--on-bad-line", "skip", "--val-fraction", "0"))  # 2 documents
    assert skipped.returncode == 0, skipped.stdout + skipped.stderr
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["bad_lines"]["by_reason"] == {reason: 1}


def test_a_100_mb_single_line_that_is_not_json_is_named_without_echoing_it(tmp_path, corpus):
    src = tmp_path / "huge.jsonl"
    with open(src, "wb") as f:
        f.write(b'{"text": "' + b"a" * 100_000_000 + b"\n")
    out = prepare(tmp_path, corpus, src)
    assert out.returncode == EXIT_DATA
    assert f"{src}:1: invalid json" in out.stdout + out.stderr
    assert len(out.stdout + out.stderr) < 5000  # the line itself is not printed
    assert not (tmp_path / "out").exists()


def test_an_empty_file_and_a_directory_given_as_a_file_are_refused(tmp_path, corpus):
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    out = prepare(tmp_path, corpus, empty)
    assert out.returncode == EXIT_DATA, out.stdout + out.stderr
    assert "empty" in (out.stdout + out.stderr).lower() and "Traceback" not in out.stdout + out.stderr
    a_dir = tmp_path / "a-directory.jsonl"
    a_dir.mkdir()
    out = prepare(tmp_path, corpus, a_dir)
    text = out.stdout + out.stderr
    assert out.returncode in (EXIT_DATA, SUPERVISOR_CONFIG), text
    assert str(a_dir) in text and "director" in text.lower() and "Traceback" not in text
    assert not (tmp_path / "out").exists()


# --- prepared data ----------------------------------------------------------------------------------------------------
def _rewrite_meta(root: Path, change) -> None:
    meta = json.loads((root / "meta.json").read_text())
    change(meta)
    (root / "meta.json").write_text(json.dumps(meta))


def _refresh_hash(root: Path, rel: str) -> None:
    import hashlib

    data = (root / rel).read_bytes()
    _rewrite_meta(root, lambda m: m["files"][rel].update(size=len(data), sha256=hashlib.sha256(data).hexdigest()))


def damage_lengths(root: Path) -> str:
    lengths = np.load(root / "train" / "doc_lengths.npy")
    lengths[0] += 5
    np.save(root / "train" / "doc_lengths.npy", lengths)
    _refresh_hash(root, "train/doc_lengths.npy")
    return "doc_lengths"


def ids_beyond_vocab(root: Path) -> str:
    tokens = np.fromfile(root / "train" / "tokens.bin", dtype="<u2")
    tokens[5] = 60000
    tokens.tofile(root / "train" / "tokens.bin")
    _refresh_hash(root, "train/tokens.bin")
    return "60000"


def wrong_version(root: Path) -> str:
    _rewrite_meta(root, lambda m: m.update(version=99))
    return "version"


@pytest.mark.parametrize("damage", [damage_lengths, ids_beyond_vocab, wrong_version])
def test_bad_prepared_data_is_a_final_data_error_in_train_and_run(tmp_path, corpus, damage):
    bad = copy_corpus(corpus[0], tmp_path / "bad-corpus")
    fragment = damage(bad)
    config = write_config(tmp_path, (bad, corpus[1]), remote=False)
    cfg = load_config(config)
    cfg.run_dir.mkdir(parents=True)
    out = train_in_process(config)  # the test's process: nothing signals it (tests/in_process.py)
    assert out.returncode == EXIT_DATA, out.stdout[-2000:] + out.stderr[-2000:]
    assert fragment in out.stdout + out.stderr and "Traceback" not in out.stdout + out.stderr

    sup = minilmd("run", str(config), fake=False, timeout=180)
    assert sup.returncode == EXIT_DATA, sup.stdout[-3000:]
    st = state(cfg.run_dir)
    assert st["phase"] == "failed" and st["restarts"] == [] and fragment in st["last_error"], st["last_error"]


# --- operator -------------------------------------------------------------------------------------------------------
def test_operator_commands_on_a_directory_that_is_not_a_run(tmp_path):
    (tmp_path / "some-file").write_text("x")
    for target in (tmp_path, tmp_path / "missing", tmp_path / "some-file"):
        for command in ("status", "stop", "logs"):
            out = cli(command, str(target), timeout=30)
            assert out.returncode == 2, (command, target, out.stdout + out.stderr)
            assert str(target) in out.stderr and "Traceback" not in out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["some-file"]


def test_a_stale_lock_and_an_orphan_of_a_killed_supervisor(tmp_path, corpus):
    """SIGKILL leaves the lock file (not held), state.json saying "running" and the trainer running. status tells
    the truth, stop stops the orphan (it saves first), and a new `minilmd run` takes the run over."""
    config = write_config(tmp_path, corpus, remote=False, train={"max_steps": 100000, "checkpoint_every": 50})
    cfg = load_config(config)
    sup = start_supervisor(config, tmp_path / "sup.out", FAKE_STEP_S="0.02")
    wait_for(lambda: step_of_state(cfg.run_dir) >= 5, 60, "training")
    orphan = state(cfg.run_dir)["child"]["pid"]
    sup.send_signal(signal.SIGKILL)
    sup.wait(30)
    assert (cfg.run_dir / "supervisor.lock").exists()
    text = cli("status", str(cfg.run_dir)).stdout
    assert "supervisor not running (killed or crashed" in text and "but its trainer is (pid" in text, text
    out = cli("stop", str(cfg.run_dir), timeout=200)
    assert out.returncode == 0 and str(orphan) in out.stdout and "stopped" in out.stdout, out.stdout + out.stderr
    assert not Path(f"/proc/{orphan}").exists() or "Z" in Path(f"/proc/{orphan}/stat").read_text().split()[2]
    saved = sorted(p.name for p in cfg.checkpoint_dir.glob("step-*"))
    assert saved, "the orphan did not save on SIGTERM"
    again = start_supervisor(config, tmp_path / "sup.out", FAKE_STEP_S="0.02")
    try:
        wait_for(lambda: state(cfg.run_dir).get("phase") == "training"
                 and (state(cfg.run_dir).get("supervisor") or {}).get("pid") == again.pid, 60, "the takeover")
        assert cli("stop", str(cfg.run_dir), timeout=120).returncode == 0
        assert again.wait(60) == 0
    finally:
        if again.poll() is None:
            again.kill()
