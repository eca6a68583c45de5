"""Session fixtures built once for every pytest worker and every run until the code that makes them changes.

`make test` runs several pytest-xdist workers and each used to build the same tokenizers and prepared corpora (about
15 s of CPU each). Now the first worker to ask builds a fixture under a lock, in a cache directory of this user's
below the system's temporary directory, and every other worker, and every later run of the same code, reads it.
The cache key hashes every source that shapes what is built (the core package and these test helpers) and the
versions of the libraries that encode the text; a cached tree whose bytes no longer match the digest recorded
when it was built (a test that changed a shared fixture in an earlier run) is built anew.

The cache directory lies in a place other users can write (/tmp), so it gets the project's own rule: made 0700,
used only when it is a real directory of this user's that nobody else can write.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
KEY_SOURCES = ("minilmd", "tests/fixture_cache.py", "tests/trainer_corpus.py", "tests/data_helpers.py",
               "tests/chat_helpers.py")
"""What a fixture's bytes depend on: the corpus tooling lives in the core package; the rest are the builders."""


def tree_digest(*roots: Path) -> str:
    """sha256 over the relative path and the bytes of every file below roots: what a shared fixture must keep."""
    h = hashlib.sha256()
    for root in roots:
        for path in sorted(p for p in Path(root).rglob("*") if p.is_file()):
            h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def _source_key() -> str:
    h = hashlib.sha256(sys.version.encode())
    for package in ("tokenizers", "numpy", "jinja2"):
        h.update(f"{package}={version(package)}".encode())
    for name in KEY_SOURCES:
        top = REPO / name
        for path in sorted(top.rglob("*.py")) if top.is_dir() else [top]:
            h.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def cache_root() -> Path:
    """This user's cache directory, refused unless it is a real directory of this user's that only it can write."""
    root = Path(tempfile.gettempdir()) / f"minilmd-test-fixtures-{os.geteuid()}"
    try:
        root.mkdir(mode=0o700)
    except FileExistsError:
        pass
    st = os.lstat(root)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise RuntimeError(f"{root} is not a private directory of this user's: remove it, or set TMPDIR")
    return root


_KEY: list[str] = []
OLD_S = 7 * 86400
"""A cached fixture of another key unused this long is removed: other keys may be another checkout's, in use."""


def _forget_old(root: Path, name: str) -> None:
    for old in root.glob(f"{name}-*"):
        if os.lstat(old).st_mtime < time.time() - OLD_S:
            shutil.rmtree(old, ignore_errors=True)


def built_once(name: str, build: Callable[[Path], object]) -> Path:
    """The directory `build(directory)` fills, built by the first worker that asks and read by all the others."""
    if not _KEY:
        _KEY.append(_source_key())
    root = cache_root()
    final = root / f"{name}-{_KEY[0]}"
    with open(root / f"{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        digest_file = final / "digest"
        if digest_file.is_file() and digest_file.read_text() == tree_digest(final / "data"):
            os.utime(final)
            return final / "data"
        if final.exists():  # damaged: ours, in our own directory (other keys may be another checkout's, in use)
            shutil.rmtree(final)
        _forget_old(root, name)
        work = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
        build(work / "data")
        (work / "digest").write_text(tree_digest(work / "data"))
        os.rename(work, final)
        return final / "data"


def in_order(root: Path, paths: list) -> None:
    """Keeps the order a builder returned its files in (tokenizer training and prepare read them in that order)."""
    (root / "order.txt").write_text("\n".join(Path(p).name for p in paths), encoding="utf-8")


def as_ordered(root: Path) -> list[Path]:
    return [root / name for name in (root / "order.txt").read_text(encoding="utf-8").splitlines()]


def vocab_of(corpus: Path) -> int:
    return int(json.loads((corpus / "meta.json").read_text(encoding="utf-8"))["vocab_size"])
