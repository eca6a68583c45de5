"""Staging a prepared corpus: verified copies, reuse only after verification, partial re-staging of a damaged copy,
retries on a flaky source, refusals with numbers when it does not fit, fsspec sources."""
from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

import fsspec
import numpy as np
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from minilmd.daemon.jobs.scratch_room import GIB, MIB, SPACE_MARGIN, SpaceNeed, ever_fits, fit_problem, memory_headroom
from minilmd.daemon.jobs.staging import SourceInvalid, StagingError, stage, verify_staged
from minilmd.daemon.jobs.staging_errors import ScratchFull, ScratchTooSmall, SourceUnreachable

FILES = ("train/tokens.bin", "train/doc_lengths.npy", "val/tokens.bin", "val/doc_lengths.npy", "tokenizer.json")


@pytest.fixture(scope="module")
def tokenizer_json(tokenizer) -> tuple[bytes, int]:
    """A real small tokenizer (verify_prepared loads it): its tokenizer.json bytes and vocabulary size."""
    from minilmd.corpus.tokenizer_train import load_tokenizer

    return tokenizer.read_bytes(), load_tokenizer(tokenizer).get_vocab_size(with_added_tokens=True)


def _split(rng: np.random.Generator, n_docs: int, vocab: int) -> tuple[bytes, bytes, dict]:
    docs = [np.concatenate([[1], rng.integers(3, vocab, rng.integers(5, 40)), [2]]) for _ in range(n_docs)]
    tokens = np.concatenate(docs).astype("<u2")
    lengths = np.array([len(d) for d in docs], dtype=np.int32)  # as prepare writes it
    buf = io.BytesIO()
    np.save(buf, lengths)
    return tokens.tobytes(), buf.getvalue(), {"documents": n_docs, "tokens": int(lengths.sum())}


def corpus_files(tokenizer: tuple[bytes, int], n_docs: int = 200, seed: int = 0) -> dict[str, bytes]:
    """The files of a small prepared corpus in the documented layout, meta.json included."""
    rng = np.random.default_rng(seed)
    tok_bytes, vocab = tokenizer
    files, splits = {}, {}
    files["train/tokens.bin"], files["train/doc_lengths.npy"], splits["train"] = _split(rng, n_docs, vocab)
    files["val/tokens.bin"], files["val/doc_lengths.npy"], splits["val"] = _split(rng, max(n_docs // 10, 2), vocab)
    files["tokenizer.json"] = tok_bytes
    listed = {rel: {"size": len(b), "sha256": hashlib.sha256(b).hexdigest()} for rel, b in files.items()}
    meta = {"format": "minilmd-prepared", "version": 1, "vocab_size": vocab,
            "special_ids": {"pad": 0, "bos": 1, "eos": 2},
            "tokenizer_sha256": listed["tokenizer.json"]["sha256"], "splits": splits, "files": listed}
    files["meta.json"] = json.dumps(meta, indent=2).encode()
    return files


def write_corpus(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


@pytest.fixture
def source(tmp_path, tokenizer_json) -> Path:
    return write_corpus(tmp_path / "nfs" / "prepared", corpus_files(tokenizer_json))


def test_stage_copies_verifies_and_reports_progress(source, tmp_path):
    seen = []
    staged = stage(str(source), tmp_path / "shm", progress=seen.append)
    assert staged == tmp_path / "shm" / "corpus"
    assert verify_staged(staged) == []
    for rel in FILES + ("meta.json",):
        assert (staged / rel).read_bytes() == (source / rel).read_bytes()
    total = sum((source / rel).stat().st_size for rel in FILES)
    assert seen[-1].done_bytes == seen[-1].total_bytes == total
    assert seen[-1].rate_bytes_s > 0 and "100%" in seen[-1].describe()
    assert sorted(p.name for p in (tmp_path / "shm").iterdir()) == ["corpus", "corpus.source"]  # no temp names left


def test_verified_copy_is_reused_without_copying(source, tmp_path):
    staged = stage(str(source), tmp_path / "shm")
    inode = (staged / "train/tokens.bin").stat().st_ino
    seen, logs = [], []
    assert stage(str(source), tmp_path / "shm", progress=seen.append, log=logs.append) == staged
    assert seen == [] and any("reusing" in m for m in logs)
    assert (staged / "train/tokens.bin").stat().st_ino == inode


def test_damaged_copy_is_detected_and_only_the_damaged_file_copied_again(source, tmp_path):
    staged = stage(str(source), tmp_path / "shm")
    tokens = staged / "train/tokens.bin"
    good_size = tokens.stat().st_size
    os.truncate(tokens, good_size // 2)  # what the SIGBUS story does to a mapped file
    problems = verify_staged(staged)
    assert len(problems) == 1 and "train/tokens.bin" in problems[0] and str(good_size) in problems[0]
    seen = []
    stage(str(source), tmp_path / "shm", progress=seen.append)
    assert verify_staged(staged) == []
    assert {p.file for p in seen} == {"train/tokens.bin"}
    assert seen[-1].total_bytes == good_size


def test_same_size_corruption_is_caught_by_the_hash(source, tmp_path):
    staged = stage(str(source), tmp_path / "shm")
    with open(staged / "val/tokens.bin", "r+b") as f:
        f.seek(4)
        f.write(b"\xff\xff")
    problems = verify_staged(staged)
    assert len(problems) == 1 and "sha256" in problems[0]
    assert verify_staged(staged, full_hash=False) == []
    stage(str(source), tmp_path / "shm")
    assert verify_staged(staged) == []


def test_changed_source_is_staged_again(source, tmp_path, tokenizer_json):
    stage(str(source), tmp_path / "shm")
    write_corpus(source, corpus_files(tokenizer_json, seed=1))
    staged = stage(str(source), tmp_path / "shm")
    assert (staged / "meta.json").read_bytes() == (source / "meta.json").read_bytes()
    assert verify_staged(staged) == []


def test_source_that_does_not_match_its_meta_is_never_staged(source, tmp_path):
    (source / "train/tokens.bin").write_bytes(b"\x01\x00" * 10)
    logs = []
    with pytest.raises(StagingError, match=r"train/tokens.bin failed after 3 attempts: copied: size 20 bytes"):
        stage(str(source), tmp_path / "shm", retries=2, backoff_s=0.01, log=logs.append)
    assert sum("retrying train/tokens.bin" in m for m in logs) == 2
    assert list((tmp_path / "shm").iterdir()) == []


class FlakyFS(MemoryFileSystem):
    """memory:// with scripted faults per file: "eio" raises on read, "short" returns half of the file."""

    protocol = "flakymem"
    faults: dict[str, list[str]] = {}

    @classmethod
    def _strip_protocol(cls, path):
        if path.startswith("flakymem://"):
            path = "memory://" + path[len("flakymem://"):]
        return super()._strip_protocol(path)

    def _open(self, path, mode="rb", **kwargs):
        f = super()._open(path, mode, **kwargs)
        name = self._strip_protocol(path)
        pending = FlakyFS.faults.get(name)
        if "r" in mode and pending:
            kind = pending.pop(0)
            if kind == "eio":
                raise OSError(5, "Input/output error", name)
            if kind == "short":
                data = f.read()
                return io.BytesIO(data[: len(data) // 2])
        return f


@pytest.fixture
def flaky_source(tokenizer_json):
    fsspec.register_implementation("flakymem", FlakyFS, clobber=True)
    fs = fsspec.filesystem("memory")
    for rel, data in corpus_files(tokenizer_json, seed=3).items():
        fs.pipe_file(f"/flaky-corpus/{rel}", data)
    yield "flakymem://flaky-corpus"
    fs.rm("/flaky-corpus", recursive=True)
    FlakyFS.faults.clear()


def test_failing_and_short_reads_are_retried(flaky_source, tmp_path):
    FlakyFS.faults["/flaky-corpus/train/tokens.bin"] = ["eio", "short"]
    logs = []
    staged = stage(flaky_source, tmp_path / "shm", retries=3, backoff_s=0.01, log=logs.append)
    assert verify_staged(staged) == []
    retries = [m for m in logs if "retrying" in m]
    assert len(retries) == 2 and "Input/output error" in retries[0] and "truncated or changed" in retries[1]


def test_source_failing_every_time_leaves_nothing_staged_and_is_unreachable(flaky_source, tmp_path):
    """An EIO on every read: the source cannot be read now (waited for by the supervisor, never counted)."""
    FlakyFS.faults["/flaky-corpus/val/doc_lengths.npy"] = ["eio"] * 5
    with pytest.raises(SourceUnreachable, match="val/doc_lengths.npy failed after 2 attempts: OSError"):
        stage(flaky_source, tmp_path / "shm", retries=1, backoff_s=0.01)
    assert list((tmp_path / "shm").iterdir()) == []


def test_a_source_gone_is_unreachable_and_a_verified_staged_copy_is_trained_from(source, tmp_path):
    """The share gone (its directory too, as an NFS automount that is down looks): on main this was "no meta.json",
    a final data error (65), though scratch held a verified copy."""
    staged = stage(str(source), tmp_path / "shm")
    os.rename(source, source.with_name("gone"))
    logs: list[str] = []
    assert stage(str(source), tmp_path / "shm", log=logs.append) == staged
    assert any("cannot be read" in m and "training from its verified copy" in m for m in logs), logs
    (staged / "val" / "tokens.bin").write_bytes(b"")  # a damaged copy is not trained from: waited for instead
    with pytest.raises(SourceUnreachable, match="not there"):
        stage(str(source), tmp_path / "shm")
    with pytest.raises(SourceUnreachable, match="not there"):
        stage(str(source), tmp_path / "empty-shm")  # nothing staged yet: waited for
    assert not (tmp_path / "empty-shm" / "corpus").exists()


def test_a_source_file_that_is_a_link_is_refused_not_followed(source, tmp_path):
    """The share is another user's or another run's: on main a corpus file replaced by a link was followed (stat,
    then open by path), so whatever it pointed at was staged, and one swapped for a FIFO after that stat blocked
    the copy. Each file is opened as untrusted now (no link followed, never a FIFO opened): final, said."""
    tokens = source / "train" / "tokens.bin"
    elsewhere = tmp_path / "elsewhere.bin"
    elsewhere.write_bytes(tokens.read_bytes())  # the same bytes: only the link itself is wrong
    tokens.unlink()
    tokens.symlink_to(elsewhere)
    with pytest.raises(SourceInvalid, match="train/tokens.bin: a symbolic link, not a regular file"):
        stage(str(source), tmp_path / "shm")


def test_an_empty_source_directory_is_an_unmounted_share_and_one_with_other_files_is_no_corpus(source, tmp_path):
    """A corpus directory that is a mount point reads as an empty directory while its share is not mounted: on main
    that was "no meta.json", a final data error (65), though scratch held a verified copy. A directory holding
    other files and no meta.json stays what it is, not a prepared corpus (final)."""
    staged = stage(str(source), tmp_path / "shm")
    os.rename(source, source.with_name("mounted-elsewhere"))
    source.mkdir()  # the mount point's stub
    logs: list[str] = []
    assert stage(str(source), tmp_path / "shm", log=logs.append) == staged
    assert any("empty directory" in m and "training from its verified copy" in m for m in logs), logs
    with pytest.raises(SourceUnreachable, match="empty directory"):
        stage(str(source), tmp_path / "empty-shm")  # nothing staged yet: waited for
    (source / "notes.txt").write_text("not a corpus")
    with pytest.raises(SourceInvalid, match="no meta.json"):
        stage(str(source), tmp_path / "empty-shm")


def test_memory_url_source(tmp_path, tokenizer_json):
    fs = fsspec.filesystem("memory")
    for rel, data in corpus_files(tokenizer_json, seed=4).items():
        fs.pipe_file(f"/mem-corpus/{rel}", data)
    try:
        staged = stage("memory://mem-corpus", tmp_path / "shm")
        assert verify_staged(staged) == []
    finally:
        fs.rm("/mem-corpus", recursive=True)


def test_a_url_sources_oversized_meta_json_is_refused_naming_the_limit_never_read_whole(tmp_path, tokenizer_json):
    """A URL corpus's meta.json is bounded as a local one is (names.CORPUS_META_MAX_BYTES). On main it was read
    whole (fs.cat_file), whatever a hostile or broken server sent: this one, a valid meta.json padded past the
    bound, was parsed and the corpus staged."""
    from minilmd.names import CORPUS_META_MAX_BYTES

    fs = fsspec.filesystem("memory")
    files = corpus_files(tokenizer_json, seed=5)
    files["meta.json"] += b" " * (CORPUS_META_MAX_BYTES + 1 - len(files["meta.json"]))
    for rel, data in files.items():
        fs.pipe_file(f"/big-meta-corpus/{rel}", data)
    try:
        with pytest.raises(SourceInvalid, match=r"memory://big-meta-corpus/meta.json: over 4 MiB, the most a "
                                                r"corpus's meta.json may be"):
            stage("memory://big-meta-corpus", tmp_path / "shm")
        assert not (tmp_path / "shm" / "corpus").exists()
    finally:
        fs.rm("/big-meta-corpus", recursive=True)


def test_corpus_that_does_not_fit_is_refused_before_copying(source, tmp_path):
    meta = json.loads((source / "meta.json").read_text())
    meta["files"]["train/tokens.bin"]["size"] = 10 ** 15  # a petabyte
    (source / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(StagingError) as err:
        stage(str(source), tmp_path / "shm")
    msg = str(err.value)
    assert "needs 1,000,000,000.0 MB" in msg and "MB free" in msg and "run.scratch" in msg
    assert list((tmp_path / "shm").iterdir()) == []


def test_a_shortage_is_a_wait_when_scratch_could_hold_it_else_final():
    mb = 1_000_000
    corpus = SpaceNeed([(665 * mb, "for the corpus")])  # 732.1 MB with the margin
    assert ever_fits(corpus, "ext4", 800 * mb, 4 * GIB, 2 * GIB)  # others hold the space: wait
    assert not ever_fits(corpus, "ext4", 700 * mb, 64 * GIB, 2 * GIB)  # the filesystem is too small: final
    assert ever_fits(corpus, "tmpfs", 10 * GIB, 64 * GIB, 12 * GIB)
    assert not ever_fits(corpus, "tmpfs", 10 * GIB, 12 * GIB + 600 * mb, 12 * GIB)  # RAM less headroom too small
    assert ever_fits(corpus, "ext4", 10 * GIB, 12 * GIB + 600 * mb, 12 * GIB)  # memory counts on a RAM disk only


def test_a_scratch_others_filled_is_full_and_one_too_small_is_too_small(source, tmp_path, small_tmpfs):
    need = sum((source / rel).stat().st_size for rel in FILES)
    roomy = small_tmpfs(need + SPACE_MARGIN + 16 * MIB)
    with open(roomy / "another-jobs-file", "wb") as f:  # another job's file fills it
        f.write(b"\0" * (24 * MIB))
    with pytest.raises(ScratchFull, match="has .* MB free"):
        stage(str(source), roomy / "s")
    (roomy / "another-jobs-file").unlink()  # its job ended
    assert verify_staged(stage(str(source), roomy / "s")) == []
    tiny = small_tmpfs(need + SPACE_MARGIN // 2)
    with pytest.raises(ScratchTooSmall, match="needs"):
        stage(str(source), tiny / "s")


def test_fit_arithmetic_for_a_ram_disk():
    mb = 1_000_000
    corpus = SpaceNeed([(665 * mb, "for the corpus")])
    assert fit_problem(corpus, "/dev/shm/minilmd-0/r", "/dev/shm", "tmpfs", 10 * GIB, 20 * GIB, 4 * GIB) is None
    msg = fit_problem(corpus, "/dev/shm/minilmd-0/r", "/dev/shm", "tmpfs", 120 * mb, 20 * GIB, 4 * GIB,
                      alternative="/var/tmp/minilmd-0/r (50,000.0 MB free)")
    # the whole sum, the margin included
    assert msg.startswith("run.scratch /dev/shm/minilmd-0/r needs 665.0 MB for the corpus + a 64 MiB margin "
                          "(67.1 MB) = 732.1 MB, but /dev/shm (tmpfs) has 120.0 MB free")
    assert msg.endswith("e.g. /var/tmp/minilmd-0/r (50,000.0 MB free)")
    tight = fit_problem(corpus, "/dev/shm/x", "/dev/shm", "tmpfs", 10 * GIB, 4 * GIB, 4 * GIB)
    assert "RAM disk" in tight and "take 665.0 MB more of it, and 4,295.0 MB must stay free" in tight
    # the same memory numbers do not matter on a local disk
    assert fit_problem(corpus, "/var/tmp/x", "/", "ext4", 10 * GIB, 4 * GIB, 4 * GIB) is None
    assert memory_headroom(8 * GIB) == 2 * GIB and memory_headroom(100 * GIB) == 20 * GIB
    # what this run's scratch already holds counts as room (a restart), and says so
    held = SpaceNeed([(665 * mb, "for the corpus")], held=600 * mb)
    assert fit_problem(held, "/s", "/", "ext4", 200 * mb) is None
    assert "has 100.0 MB free besides the 600.0 MB this run's scratch already holds" in \
        fit_problem(held, "/s", "/", "ext4", 100 * mb)


def test_sources_that_are_not_prepared_corpora_are_refused(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("not a corpus")  # (an empty directory is a share not mounted: waited for)
    with pytest.raises(SourceInvalid, match="no meta.json"):
        stage(str(empty), tmp_path / "shm")
    (empty / "meta.json").write_text(json.dumps({"format": "something-else", "files": {}}))
    with pytest.raises(SourceInvalid, match="format 'something-else'"):
        stage(str(empty), tmp_path / "shm")
    (empty / "meta.json").write_text(json.dumps({"format": "minilmd-prepared",
                                                 "files": {"../../etc/passwd": {"size": 1, "sha256": "x"}}}))
    with pytest.raises(SourceInvalid, match="unsafe file name"):
        stage(str(empty), tmp_path / "shm")
    (empty / "meta.json").write_text("{not json")
    with pytest.raises(SourceInvalid, match="not valid JSON"):
        stage(str(empty), tmp_path / "shm")
    assert not (tmp_path / "shm" / "corpus").exists()


def test_verify_staged_on_a_missing_directory(tmp_path):
    problems = verify_staged(tmp_path / "nothing")
    assert len(problems) == 1 and "meta.json: missing" in problems[0]


def test_source_with_broken_invariants_is_refused_as_invalid(source, tmp_path):
    meta = json.loads((source / "meta.json").read_text())
    meta["splits"]["train"]["documents"] += 1  # hashes all match; the counts do not
    (source / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(SourceInvalid, match="fails its checks: .*fewer than the 201 documents its meta.json counts"):
        stage(str(source), tmp_path / "shm")
    assert list((tmp_path / "shm").iterdir()) == []


# --- against a real misbehaving filesystem (tests/faultfs.py over FUSE; skipped where FUSE is unavailable) -------

@pytest.mark.fuse
def test_source_failing_mid_copy_on_fuse_is_retried(faultfs, tokenizer_json, tmp_path):
    source = write_corpus(faultfs.root / "nfs" / "prepared", corpus_files(tokenizer_json, n_docs=3000))
    size = (source / "train/tokens.bin").stat().st_size
    faultfs.fail_reads("*train/tokens.bin", from_offset=size // 2)
    logs = []

    def log(msg):  # the NFS server comes back once the first attempt has failed
        logs.append(msg)
        if "retrying" in msg:
            faultfs.clear()

    staged = stage(str(source), tmp_path / "shm", retries=3, backoff_s=0.01, log=log)
    assert faultfs.hits("error", "read")
    assert sum("retrying train/tokens.bin" in m for m in logs) == 1 and "Errno 5" in logs[1]
    assert verify_staged(staged) == []


@pytest.mark.fuse
def test_source_reporting_a_short_file_on_fuse_is_never_staged(faultfs, tokenizer_json, tmp_path):
    source = write_corpus(faultfs.root / "nfs" / "prepared", corpus_files(tokenizer_json))
    faultfs.shrink("*val/tokens.bin", 10)  # an attribute refresh after an NFS hiccup saw a truncated file
    with pytest.raises(StagingError, match="val/tokens.bin failed after 2 attempts: copied: size 10 bytes"):
        stage(str(source), tmp_path / "shm", retries=1, backoff_s=0.01)
    assert faultfs.hits("shrink")
    assert list((tmp_path / "shm").iterdir()) == []
    faultfs.clear()
    assert verify_staged(stage(str(source), tmp_path / "shm")) == []
