"""What `prepare --append` checks of the corpus it grows, under the lock, before it reads a new line or writes a byte:
every file of it (meta.json and each file meta.json lists) a regular file of this user's that no other user can
write (minilmd/perms.py `who_else_writes`: not group-writable but for a group of this user's alone, not
world-writable), and each listed file's first `size` bytes (an interrupted append's tail aside, as staging copies
them) hashing to the sha256 meta.json lists.

An append records new hashes over the old files: before, it recorded whatever they held. A teammate who could write
the files (0664 under umask 002 in a setgid team directory) overwrote documents inside tokens.bin, and the next
append published a meta.json whose sha256 was the tampered file's, so every staging "verified" his text (hostile
audit 6 F2). Once the files are checked to be the user's alone (the corpus and split directories are checked so by
append.py) and to match meta.json, no one but she (and root) can change them while the append runs.
Each file is read by descriptor (no link followed, never a blocking open), in bounded chunks, at most its listed
size; a long check says so on the log before it starts, and once done.
"""
from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from minilmd.corpus_meta import CorpusError
from minilmd.dirfd import Dir
from minilmd.names import CORPUS_META
from minilmd.openflags import OPEN_FLAGS as OPEN_OLD
from minilmd.perms import owned_by_me, who_else_writes
from minilmd.untrusted import file_kind, printable

CHUNK = 8 << 20
SAY_FROM_BYTES = 1 << 30
"""A check of at least this many bytes is said on the log as it starts (it reads them all: a minute per few GB)."""


def check_old_files(corpus_dir: Dir, root: Path, files: dict[str, dict], log) -> None:
    """ValueError (exit 2) for a file of the corpus another user can write or owns, or that is not a regular file;
    CorpusError (exit 65) for a listed file whose first `size` bytes do not hash to its listed sha256. `files`:
    meta.json's file table; `root`: the corpus as the user named it (for the messages)."""
    opened = {rel: _open_old(corpus_dir, root, rel) for rel in [CORPUS_META, *sorted(files)]}
    try:
        total = sum(int(files[rel]["size"]) for rel in files)
        if total >= SAY_FROM_BYTES:
            log(f"append: checking the corpus's {total / 1e9:,.1f} GB against its meta.json first")
        for rel, entry in sorted(files.items()):
            _check_hash(opened[rel], root / rel, int(entry["size"]), str(entry["sha256"]))
        if total >= SAY_FROM_BYTES:
            log("append: the corpus's files match its meta.json")
    finally:
        for fd in opened.values():
            os.close(fd)


def _open_old(corpus_dir: Dir, root: Path, rel: str) -> int:
    """The file `rel` of the corpus, opened through the corpus's descriptor one directory at a time (no link
    followed), judged: a regular file of this user's that no one else can write."""
    *dirs, name = rel.split("/")
    walked: list[Dir] = []
    here = corpus_dir
    try:
        for part in dirs:
            here = Dir.at(here, part)
            walked.append(here)
        fd = os.open(name, OPEN_OLD, dir_fd=here.fd)
    except OSError as e:
        raise ValueError(f"{printable(root / rel)}: cannot be opened as a file of the corpus ({e.strerror}; a "
                         "link is not followed); nothing was appended") from None
    finally:
        for opened in walked:
            opened.close()
    st = os.fstat(fd)
    problem = (f"{file_kind(st.st_mode)}, not a regular file" if not stat.S_ISREG(st.st_mode)
               else who_else_writes(st, fd) or (None if owned_by_me(st) else "not yours"))
    if problem:
        os.close(fd)
        raise ValueError(f"{printable(root / rel)} is {problem}: another user could have changed it (and meta.json's "
                         "hashes with it, where he can write meta.json too); `prepare --append` grows only a corpus "
                         f"no one else can write, and nothing was appended. If you know it is as you made it, "
                         f"`chmod -R go-w {printable(root)}` (a file of another user's: have him, or root, give it "
                         "to you), then run this again: every file is checked against meta.json first; else "
                         "prepare the corpus again from its sources")
    return fd


def _check_hash(fd: int, path: Path, size: int, listed: str) -> None:
    digest, got = hashlib.sha256(), 0
    while got < size:
        chunk = os.pread(fd, min(CHUNK, size - got), got)
        if not chunk:
            break
        digest.update(chunk)
        got += len(chunk)
    if got == size and digest.hexdigest() == listed:
        return
    st = os.fstat(fd)
    what = (f"holds {st.st_size:,} bytes, meta.json lists {size:,}" if got < size else
            f"its first {size:,} bytes do not hash to the sha256 meta.json lists ({digest.hexdigest()[:16]}..., "
            f"listed {printable(listed[:16])}...)")
    raise CorpusError(f"{printable(path)}: {what}: it changed since the corpus was prepared or last appended to "
                      f"(it is yours, mode {stat.S_IMODE(st.st_mode):o}: whoever could write it then, or you, or "
                      "root, changed it); nothing was appended, and a run would refuse it too (staging checks the "
                      "same hashes). Prepare the corpus again from its sources, or restore it from a copy")
