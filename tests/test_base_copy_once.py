"""A sync's push of the LoRA base says why the remote holds no copy from what the push itself read
(daemon/jobs/basecopy.py push_or_say): the remote's record read once per sync, each base file's size looked at once,
not a second pass over the remote after every push that succeeded (issue 40 review)."""
from __future__ import annotations

from pathlib import Path

from base_copy_helpers import staged_pth
from minilmd.daemon.jobs import basecopy
from minilmd.daemon.jobs.remote_local import LocalRemote


class Counting(LocalRemote):
    """A local remote that counts the reads of `init`'s record and the size looks under `init`."""

    def __init__(self, url: str):
        super().__init__(url)
        self.record_reads = self.size_looks = 0

    def cat(self, path: str, max_bytes: int) -> bytes:
        if path == self.path(basecopy.REMOTE_BASE, basecopy.INIT_RECORD):
            self.record_reads += 1
        return super().cat(path, max_bytes)

    def size(self, *names: str):
        if names[:1] == (basecopy.REMOTE_BASE,):
            self.size_looks += 1
        return super().size(*names)

    def counted(self) -> tuple[int, int]:
        seen = (self.record_reads, self.size_looks)
        self.record_reads = self.size_looks = 0
        return seen


def push(remote: Counting, staged: Path) -> tuple[int, str | None]:
    return basecopy.push_or_say(remote, staged, "h", 1, taken=lambda found, fresh: None)[:2]  # the error aside


def test_a_push_reads_the_remote_once_and_says_what_it_found(tmp_path):
    ours, theirs = staged_pth(tmp_path, "ours"), staged_pth(tmp_path, "theirs")
    files = len([p for p in ours.rglob("*") if p.is_file()])
    remote = Counting(str(tmp_path / "remote"))
    nbytes, missing = push(remote, ours)
    assert nbytes > 0 and missing is None
    assert remote.counted() == (1, 0)  # the copy read back and hashed: no second look at what it wrote
    assert push(remote, ours) == (0, None)
    assert remote.counted() == (1, files)  # there already: its record and each file's size, once

    other = Counting(str(tmp_path / "other"))
    push(other, theirs)
    other.counted()
    nbytes, missing = push(other, ours)
    assert nbytes == 0 and missing == f"{other.show(basecopy.REMOTE_BASE)} holds the copy of another LoRA base, " \
                                      f"never replaced"
    assert other.counted() == (1, 0)
