"""Every reader of a file that another user, another run or another machine may have written, fuzzed: whatever the
bytes (random, any JSON value, 5,000 levels of `[`, bracket and quote soup) and whatever the file is (a FIFO nobody
writes, a link to /dev/zero, a directory, a sparse gigabyte), each reader gives its defined failure (Unreadable,
a bad line, an invalid checkpoint, None where the reader says "not there") and never another exception, a hang or
a big allocation. docs/failure-modes.md "Shared places" names these readers and this file.
"""
from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minilmd import checkpoint_dirs, corpus_meta, init_source, lockfile, names, procs, protocol, replycut, scratch
from minilmd.checkpoint import CheckpointInvalid, read_manifest, validate
from minilmd.config import ConfigError
from minilmd.corpus import chat, chat_files
from minilmd.corpus.prepare import lock as prepare_lock
from minilmd.corpus.sources import jsonl
from minilmd.corpus.tokenizer import TokenizerError, load_tokenizer
from minilmd.daemon.base import runstate
from minilmd.daemon.child import orphans
from minilmd.daemon.host import registry
from minilmd.daemon.jobs import staging
from minilmd.daemon.jobs.remote_local import open_remote
from minilmd.daemon.phases import initwait
from minilmd.daemon.views import curves
from minilmd.init_place import Refused
from minilmd.run_config_copy import run_config_of
from minilmd.safetensors_scan import scan_safetensors
from minilmd.untrusted import Unreadable

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=30)
deep = st.builds(lambda n, opener: (opener * n).encode(), st.integers(65, 5000),
                 st.sampled_from(["[", '{"a":', '[{"text":', '{"messages":[', '"[']))
contents = st.one_of(
    st.binary(max_size=2048),
    json_values.map(lambda v: json.dumps(v).encode()),
    deep,
    st.text(alphabet='[]{}":,\\ a1\n', max_size=400).map(str.encode),
)


@dataclass
class Reader:
    """A reader of one file: `name` is the file's name in the directory the reader is given, `call(dir)` reads
    it; the defined failures are the exception types in `fails`; any other exception fails the test."""

    name: str
    call: Callable[[Path], object]
    fails: tuple[type[BaseException], ...] = ()
    kinds: bool = True
    """Whether the reader is also given a FIFO, a link to /dev/zero, a directory and a sparse gigabyte (False for
    one only ever called on a file whose kind and size were checked first)."""
    tail: bool = False
    """A reader of a bounded tail of a file that may be long (metrics.jsonl): not given the sparse gigabyte."""


def _entry(d: Path):
    return registry._read_entry(d / "e.json", os.lstat(d / "e.json"), shared=False)


def _predecessor(d: Path):
    return init_source.predecessor_state(init_source.Predecessor("pred", d, d))


def _checkpoint(d: Path):
    return init_source.InitSource("checkpoint", d)


def _run_config_copy(d: Path):
    return run_config_of(d)


def _replies_cut(d: Path):
    """run --check's count of a chat split whose index is hostile, beside a loss mask of 64 tokens."""
    (d / "train" / names.LOSS_MASK).write_bytes(bytes(64))
    return replycut.chat_replies_cut(d / "train", 8, {"documents": 16, "tokens": 64, "target_tokens": 100}, 96)


READERS = {
    "registry entry": Reader("e.json", _entry, (Unreadable,)),
    "state.json": Reader(names.STATE, runstate.load_state, (Unreadable,)),
    "state.json (read_state)": Reader(names.STATE, runstate.read_state),
    "heartbeat": Reader(names.HEARTBEAT, runstate.read_heartbeat),
    "metrics.jsonl": Reader(names.METRICS, lambda d: curves.read_jsonl(d / names.METRICS), tail=True),
    "trainer.json": Reader(names.TRAINER_RECORD, lambda d: orphans._read_record(procs.scope_of(d))),
    "fault note": Reader(names.FAULT, protocol.read_fault),
    "scratch owner.json": Reader(names.SCRATCH_OWNER, scratch.read_owner, (ValueError,)),
    "corpus meta.json (read_meta)": Reader(names.CORPUS_META, corpus_meta.read_meta, (corpus_meta.CorpusError,)),
    "corpus meta.json (read_corpus_meta)": Reader(names.CORPUS_META, corpus_meta.read_corpus_meta),
    "staged corpus meta.json (verify_staged)": Reader(names.CORPUS_META, lambda d: staging.verify_staged(d, False)),
    "checkpoint manifest": Reader(names.MANIFEST, read_manifest, (CheckpointInvalid,)),
    "checkpoint manifest (validate)": Reader(names.MANIFEST, validate, (CheckpointInvalid,)),
    "init.from manifest (fingerprint)": Reader(names.MANIFEST, lambda d: init_source.fingerprint(_checkpoint(d)),
                                               (init_source.InitSourceError,)),
    "init.from trainer_state.json (source_model)": Reader(
        names.TRAINER_STATE, lambda d: init_source.source_model(_checkpoint(d)), (init_source.InitSourceError,)),
    "checkpoint trainer_state.json (lineage)": Reader(
        f"{names.step_name(1)}/{names.TRAINER_STATE}", initwait.lineage),
    "another run's run.toml (run_config_of)": Reader(names.RUN_CONFIG_COPY, _run_config_copy,
                                                     (ConfigError, Refused)),
    "another run's run.toml (init.from predecessor)": Reader(
        names.RUN_CONFIG_COPY, lambda d: init_source.predecessor(str(d)), (init_source.InitSourceError,)),
    "predecessor state.json": Reader(names.STATE, _predecessor, (Unreadable,)),
    "staged init record": Reader(init_source.STAGED_RECORD, init_source.staged_record, (Unreadable,)),
    "LATEST pointer": Reader(names.LATEST, checkpoint_dirs.read_latest),
    "LATEST pointer (named_checkpoint)": Reader(names.LATEST, lambda d: checkpoint_dirs.named_checkpoint(
        d / names.LATEST), (checkpoint_dirs.PointerError,)),
    "BEST pointer": Reader(names.BEST, checkpoint_dirs.read_best),
    "tokenizer.json": Reader(names.TOKENIZER_FILE, load_tokenizer, (TokenizerError,)),
    "tokenizer_config.json": Reader(names.TOKENIZER_CONFIG, chat_files.read_tokenizer_config, (chat.ChatError,)),
    "remote LATEST pointer": Reader(names.LATEST, lambda d: open_remote(str(d)).read_text(names.LATEST)),
    "remote checkpoint manifest": Reader(f"{names.step_name(1)}/{names.MANIFEST}",
                                         lambda d: open_remote(str(d)).manifest_or_problems(names.step_name(1))),
    "chat doc_lengths.npy (chat_replies_cut)": Reader(f"train/{names.DOC_LENGTHS}", _replies_cut,
                                                      (OSError, replycut.CorpusLies)),
    "safetensors header": Reader(names.MODEL_FILE, lambda d: scan_safetensors(d / names.MODEL_FILE), (ValueError,),
                                 kinds=False),
}


def _fd_reader(read: Callable[[int], object]) -> Callable[[Path], object]:
    def call(path: Path):
        fd = os.open(path, os.O_RDONLY)
        try:
            return read(fd)
        finally:
            os.close(fd)
    return call


FD_READERS = {  # lock and lease files: opened safely by their callers (O_NOFOLLOW, regular), the body parsed here
    "lock file body (run, trainer, GPU lease: minilmd/lockfile.py)": lockfile.read_body,
    "prepare lock holder line": prepare_lock._holder_line,
}
LINE_READERS = {  # corpus lines and JSON-lines: every line parses or is a bad line
    "text corpus lines": lambda blob: jsonl.parse_block(blob, 1),
    "chat corpus lines": lambda blob: chat.parse_chat_block(blob, 1),
    "metrics and events lines": lambda blob: runstate.json_records(blob.split(b"\n")),
}


def _place(d: Path, reader: Reader) -> Path:
    path = d / reader.name
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _read(d: Path, reader: Reader):
    try:
        return reader.call(d)
    except reader.fails:
        return None


FUZZ = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.mark.slow
@pytest.mark.parametrize("which", sorted(READERS))
@FUZZ
@given(data=contents)
def test_a_reader_of_a_hostile_file_gives_its_defined_failure(tmp_path, which, data):
    reader = READERS[which]
    _place(tmp_path, reader).write_bytes(data)
    _read(tmp_path, reader)


@pytest.mark.parametrize("which", sorted(FD_READERS))
@FUZZ
@given(data=contents)
def test_a_lock_or_lease_body_is_read_whatever_it_holds(tmp_path, which, data):
    (tmp_path / "lock").write_bytes(data)
    _fd_reader(FD_READERS[which])(tmp_path / "lock")


@pytest.mark.parametrize("which", sorted(LINE_READERS))
@FUZZ
@given(lines=st.lists(contents, max_size=4))
def test_every_hostile_line_is_a_bad_line_or_a_record(which, lines):
    LINE_READERS[which](b"\n".join(line.replace(b"\n", b" ") for line in lines) + b"\n")


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


def _directory(path: Path) -> None:
    path.mkdir()


def _sparse(path: Path) -> None:
    with open(path, "wb") as f:
        f.truncate(1 << 30)


KINDS = {"a FIFO nobody writes": _fifo, "a link to /dev/zero": _zero, "a directory": _directory,
         "a sparse gigabyte": _sparse}


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("which", sorted(w for w, r in READERS.items() if r.kinds))
def test_a_reader_never_blocks_on_or_reads_what_is_not_a_small_regular_file(tmp_path, which, kind):
    reader = READERS[which]
    if reader.tail and kind == "a sparse gigabyte":
        pytest.skip("reads a bounded tail of a long file by design (tests/test_hostile_run_files.py)")
    path = _place(tmp_path, reader)
    KINDS[kind](path)
    errors: list[BaseException] = []

    def read():
        try:
            _read(tmp_path, reader)
        except BaseException as e:  # noqa: BLE001 - reported by the test below
            errors.append(e)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(timeout=60)  # a generous bound on a hang, not a timing assertion
    if thread.is_alive():
        if kind == "a FIFO nobody writes":  # unblock it so that the thread ends
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail(f"{which} blocked on {kind}")
    assert not errors, f"{which} on {kind}: {errors[0]!r}"
