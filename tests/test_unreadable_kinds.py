"""untrusted.Unreadable's `kind`: what each refusal is, for code to decide by, and init staging deciding by it.

Before, Unreadable carried only its words (and `missing`, `os_error`), and daemon/jobs/initstage.py `_unusable`
told a file that is not a regular file (final) from one being written (waited for) by whether the words began
with "a ". Each refusal below is made by the real reader on a real file; its kind is asserted, then what staging
makes of it.
"""
from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from minilmd import untrusted
from minilmd.daemon.jobs import initstage
from minilmd.daemon.jobs.staging import SourceInvalid, SourceUnreachable
from minilmd.untrusted import Unreadable

KIB = 1024


def refusal(call) -> Unreadable:
    with pytest.raises(Unreadable) as caught:
        call()
    return caught.value


class GrowsItsSource:
    """copy_regular's `out`: appends to the file being copied when given the first block (another writer)."""

    def __init__(self, source: Path):
        self.source = source

    def write(self, block: bytes) -> None:
        with open(self.source, "ab") as f:
            f.write(b"more")


def made(tmp_path: Path) -> dict[str, Unreadable]:
    """One real refusal of each kind the readers of minilmd/untrusted.py raise, by kind."""
    plain = tmp_path / "plain.json"
    plain.write_bytes(b'{"a": 1}')
    (tmp_path / "link").symlink_to(plain)
    (tmp_path / "dir").mkdir()
    os.mkfifo(tmp_path / "fifo")
    growing = tmp_path / "growing"
    growing.write_bytes(b"12345678")
    read = untrusted.read_bytes
    return {
        "missing": refusal(lambda: read(tmp_path / "absent", max_bytes=KIB)),
        "io": refusal(lambda: read(plain / "below", max_bytes=KIB)),  # ENOTDIR: there is no such path to read
        "link": refusal(lambda: read(tmp_path / "link", max_bytes=KIB)),
        "not_regular": refusal(lambda: read(tmp_path / "fifo", max_bytes=KIB)),
        "owner": refusal(lambda: read(plain, max_bytes=KIB, owner=os.geteuid() + 1)),
        "too_big": refusal(lambda: read(plain, max_bytes=4)),
        "wrong_size": refusal(lambda: untrusted.copy_regular(plain, GrowsItsSource(plain), size=3)),
        "changed": refusal(lambda: untrusted.copy_regular(growing, GrowsItsSource(growing), size=8, chunk=4)),
        "not_utf8": refusal(lambda: untrusted.loads(b"\xff")),
        "too_deep": refusal(lambda: untrusted.loads("[" * 10, max_depth=3)),
        "not_json": refusal(lambda: untrusted.loads("{")),
        "wrong_type": refusal(lambda: untrusted.loads("[1]")),
    }


def test_each_refusal_says_its_kind_and_keeps_its_words(tmp_path):
    found = made(tmp_path)
    assert {kind: e.kind for kind, e in found.items()} == {kind: kind for kind in found}
    words = {kind: e.why for kind, e in found.items()}
    assert words == {
        "missing": "missing", "io": f"cannot be read: {os.strerror(errno.ENOTDIR)}", "link": "a symbolic link",
        "not_regular": "a FIFO", "owner": f"owned by uid {os.geteuid()}", "too_big": "over 4 bytes",
        "wrong_size": "8 bytes, listed as 3", "changed": "changed while being read", "not_utf8": "not UTF-8",
        "too_deep": "nested deeper than 3", "not_json": "not JSON", "wrong_type": "a list, not an object"}
    assert found["missing"].missing and not any(e.missing for k, e in found.items() if k != "missing")
    assert isinstance(found["io"].os_error, NotADirectoryError)


def test_a_refusal_raised_elsewhere_without_a_kind_is_invalid():
    assert Unreadable("its name is not a run name").kind == "invalid"
    assert Unreadable("missing", missing=True).kind == "missing"


@pytest.mark.parametrize("kind, staged_as, says", [
    ("missing", SourceUnreachable, "cannot be read (missing)"),
    ("io", SourceUnreachable, "cannot be read (cannot be read: "),
    ("link", SourceInvalid, "a symbolic link, not a regular file"),
    ("not_regular", SourceInvalid, "a FIFO, not a regular file"),
    ("wrong_size", SourceUnreachable, "8 bytes, listed as 3 (written to now?)"),
    ("changed", SourceUnreachable, "changed while being read (written to now?)"),
    ("too_big", SourceUnreachable, "over 4 bytes (written to now?)"),
])
def test_staging_decides_by_the_kind(tmp_path, kind, staged_as, says):
    """What is not a regular file is final; what is missing, failing or being written is waited for."""
    staged = initstage._unusable(made(tmp_path)[kind], tmp_path / "src")
    assert type(staged) is staged_as and f"{tmp_path / 'src'}: {says}" in str(staged)


def test_staging_decides_by_the_kind_not_by_the_words(tmp_path):
    """Words that read like a file's kind do not make a file that is being written final, nor the reverse."""
    src = tmp_path / "src"
    assert type(initstage._unusable(Unreadable("a file being written", kind="changed"), src)) is SourceUnreachable
    assert type(initstage._unusable(Unreadable("odd entry", kind="not_regular"), src)) is SourceInvalid
