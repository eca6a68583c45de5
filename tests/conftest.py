"""Shared test set-up: the corpora and the tokenizer that many test modules use, each made once per session.

Tests run on CPU, on 2 cores: torch keeps to one thread per process. The session fixtures are shared by every
test that asks for them: a test that changes one works on a copy (shutil.copytree), and each fixture checks at
the end of the session that nothing changed it (a changed one is reported as an error of that fixture).

Plain helpers (functions a test calls, also used by the soak script) stay in modules of their own:
trainer_corpus.py (prepared corpora, tiny model configs, run configs, `minilmd train`), supervisor_helpers.py
(`minilmd run` as a process and its files), reliability_helpers.py (watchers for the reliability tests),
data_helpers.py (JSONL sources and tokenizers for the data tests), weights_helpers.py (in-process tiny models and
checkpoints), waiting.py (wait_until), faults_fixtures.py (FUSE, tmpfs and memory-cgroup faults).
"""
from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import pytest  # noqa: E402

from data_helpers import demo_slice, small_tokenizer  # noqa: E402
from faults_fixtures import faultfs, memory_cgroup, small_tmpfs  # noqa: E402,F401 - fixtures, shared here
from trainer_corpus import real_text_prepared  # noqa: E402


def tree_digest(*roots: Path) -> str:
    """sha256 over the relative path and the bytes of every file below roots: what a shared fixture must keep."""
    h = hashlib.sha256()
    for root in roots:
        for path in sorted(p for p in Path(root).rglob("*") if p.is_file()):
            h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def assert_unchanged(what: str, digest: str, *roots: Path) -> None:
    assert tree_digest(*roots) == digest, f"a test changed the shared {what} ({', '.join(map(str, roots))}): " \
                                          "copy a session fixture before changing it"


# --- corpora and the tokenizer -----------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> tuple[Path, int]:
    """(prepared corpus directory, vocabulary size): 400 real Chinese reviews under a 512-entry byte-level BPE,
    written directly in the prepared format (trainer_corpus.real_text_prepared). Read-only: copy it to damage it."""
    made = real_text_prepared(tmp_path_factory.mktemp("corpus"), n_docs=400, vocab_size=512)
    digest = tree_digest(made[0])
    yield made
    assert_unchanged("corpus", digest, made[0])


@pytest.fixture(scope="session")
def demo_jsonl(tmp_path_factory) -> list[str]:
    """The demo corpus's JSONL source files, 300 documents each (data_helpers.demo_slice): input of `prepare`
    and of tokenizer training. Read-only."""
    root = tmp_path_factory.mktemp("demo")
    paths = demo_slice(root, 300)
    digest = tree_digest(root)
    yield paths
    assert_unchanged("demo JSONL", digest, root)


@pytest.fixture(scope="session")
def tokenizer(demo_jsonl, tmp_path_factory) -> Path:
    """tokenizer.json of a 512-entry byte-level BPE trained on demo_jsonl, MiniMind's special ids 0, 1, 2."""
    path = small_tokenizer(demo_jsonl, tmp_path_factory.mktemp("tokenizer") / "tokenizer.json")
    digest = tree_digest(path.parent)
    yield path
    assert_unchanged("tokenizer", digest, path.parent)


# --- a directory nobody may write into -----------------------------------------------------------------------------
@pytest.fixture
def read_only_dir(tmp_path):
    """A directory nobody may write into: a read-only tmpfs as root (root ignores mode bits), else mode 0500."""
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() != 0:
        ro.chmod(0o500)
        yield ro
        ro.chmod(0o700)
        return
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(ro)]).returncode != 0:
        pytest.skip("needs permission to mount a read-only tmpfs")
    try:
        yield ro
    finally:
        subprocess.run(["umount", str(ro)])

