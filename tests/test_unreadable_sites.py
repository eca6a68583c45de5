"""untrusted.Unreadable raised outside minilmd/untrusted.py carries the kind of its refusal (untrusted.Kind).

Before, these raises gave no kind, so each was "invalid" whatever it said: a tokenizer file that is not UTF-8, a
safetensors file of another size than its manifest lists or one that changed while read, a run directory or a log
that cannot be read (EIO: "io", with its OSError), a system registry entry of another uid than its name says. A
caller deciding by kind (daemon/jobs/initstage.py `_unusable`) took them all for what none of them is. One
assertion per site, each refusal made by the real code on a real file where one can be made.
"""
from __future__ import annotations

import errno
import io
import os

import pytest

from minilmd import init_source, logread, safetensors_scan, untrusted
from minilmd.corpus import chat_files
from minilmd.daemon.host import registry
from minilmd.init_pth import InitSourceTooBig, copy_pth
from minilmd.init_source import InitSource, InitSourceError, Predecessor
from minilmd.untrusted import Unreadable


def refusal(call) -> Unreadable:
    with pytest.raises(Unreadable) as caught:
        call()
    return caught.value


def test_a_tokenizer_file_not_utf8_is_not_utf8(tmp_path):
    (tmp_path / "tokenizer_config.json").write_bytes(b"\xff{}")
    assert refusal(lambda: chat_files._read_text(tmp_path / "tokenizer_config.json", (os.getuid(),),
                                                 tmp_path / "tokenizer.json")).kind == "not_utf8"


def test_a_predecessor_whose_run_directory_cannot_be_looked_at_is_io(tmp_path):
    (tmp_path / "file").write_text("")
    pred = Predecessor("first", tmp_path / "file" / "run", tmp_path / "remote")  # ENOTDIR, not ENOENT
    e = refusal(lambda: init_source.predecessor_state(pred))
    assert (e.kind, type(e.os_error)) == ("io", NotADirectoryError)


def test_a_safetensors_file_of_another_size_than_listed_is_wrong_size(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 16)
    assert refusal(lambda: safetensors_scan.scan_safetensors(tmp_path / "model.safetensors", size=8)).kind == \
        "wrong_size"


def test_a_safetensors_file_shorter_when_read_than_when_opened_is_changed(tmp_path):
    shrunk = io.BytesIO(b"\0" * 8)  # the file as read: 8 bytes of the 16 its fstat said
    assert refusal(lambda: safetensors_scan._read_whole(shrunk, 16, tmp_path / "m.safetensors")).kind == "changed"


@pytest.mark.parametrize("read", [lambda p: logread.tail_lines(p, 5), lambda p: logread.new_lines(p, 0)],
                         ids=["tail_lines", "new_lines"])
def test_a_log_that_fails_while_read_is_io(tmp_path, monkeypatch, read):
    (tmp_path / "attempt-0001.log").write_text("a line\n")

    def failing_disk(fd, n, offset):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(logread, "_pread_all", failing_disk)
    e = refusal(lambda: read(tmp_path / "attempt-0001.log"))
    assert (e.kind, e.os_error and e.os_error.errno) == ("io", errno.EIO)


def test_a_system_registry_entry_named_for_another_uid_is_owner(tmp_path):
    uid = os.lstat(tmp_path).st_uid
    entry = tmp_path / f"{uid + 1}-run-0123456789ab.json"
    entry.write_text("{}")
    assert refusal(lambda: registry._read_entry(entry, os.lstat(entry), shared=True)).kind == "owner"


# --- a caller that decided by the words now decides by the kind ------------------------------------------------------

@pytest.mark.parametrize("refused, raised", [
    (Unreadable("3 GiB, larger than allowed", kind="too_big"), InitSourceTooBig),
    (Unreadable("over the limit of a FIFO", kind="not_regular"), InitSourceError),
])
def test_an_init_pth_too_big_is_told_by_kind_not_words(tmp_path, monkeypatch, refused, raised):
    """init_source._read_pth (now init_pth.read_pth_into) took a refusal whose words began "over " for a .pth too
    big: a kind decides now."""

    def refusing(*args, **kwargs):
        raise refused

    monkeypatch.setattr(untrusted, "copy_regular", refusing)  # _read_pth imports it when called
    with pytest.raises(InitSourceError) as caught:
        copy_pth(InitSource("minimind", tmp_path / "base.pth"), None, io.BytesIO())
    assert type(caught.value) is raised


def test_a_base_copys_directory_that_is_a_link_or_cannot_be_looked_at_says_so_by_kind(tmp_path):
    import contextlib

    from minilmd.trainer.model import basecopy_read

    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    (tmp_path / "file").write_text("")
    with contextlib.ExitStack() as held:
        walk = basecopy_read._walk
        assert refusal(lambda: walk(held, tmp_path / "link", ("manifest.json",))).kind == "link"
        assert refusal(lambda: walk(held, tmp_path / "file", ("manifest.json",))).kind == "invalid"  # not a dir
        assert walk(held, tmp_path / "gone", ("manifest.json",)) is None  # missing: the copy is not there (yet)
