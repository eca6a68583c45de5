"""What killed prepares left beside DIR, and what is not theirs: the next prepare removes only its own kind's
temporary directories (`.DIR.prepare-HOST-PID-TICKS`, its `.old` aside, an older minilmd's `.DIR.tmp-PID`) whose
process is gone, when they are this user's real directories; an export's copy to the same path, a link, another
user's, another host's and a live process's are left, and all but the export's said on stderr. A name of another
boot (`-boot<tag>`) names no live process, whatever has its pid and start time now; this boot's tag is the control."""
from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from data_helpers import run_prepare
from minilmd.proc_info import boot_tag
from proc_fixtures import dead, sleeper  # noqa: F401 - fixtures
from second_user import second_user, sh_as_user, shared  # noqa: F401 - shared: a fixture


def _half(path: Path) -> Path:
    (path / "train").mkdir(parents=True)
    (path / "train" / "tokens.bin").write_bytes(b"half a corpus\n")
    return path


def _prepare(demo_jsonl, tokenizer, out: Path) -> None:
    run_prepare(demo_jsonl[:1], tokenizer, out, val_fraction=0.1)
    assert (out / "meta.json").is_file()


def test_a_running_exports_copy_to_the_same_path_is_left(tmp_path, demo_jsonl, tokenizer, sleeper, capsys):
    """An export to the same path, still writing (a live process's pid and start time in its
    `.DIR.tmp-HOST-PID-TICKS`): before, prepare read the start ticks as a pid, found no such process and removed
    the running export's copy. Now it is no prepare's name, so prepare neither touches nor judges it."""
    out = tmp_path / "p"
    export = _half(tmp_path / f".p.tmp-{socket.gethostname()}-{sleeper[0]}-{sleeper[1]}")
    _prepare(demo_jsonl, tokenizer, out)
    assert (export / "train" / "tokens.bin").read_bytes() == b"half a corpus\n"
    assert str(export) not in capsys.readouterr().err


@pytest.mark.parametrize("name", ["new", "aside", "older minilmd's", "recycled pid", "another boot"])
def test_this_users_leftover_of_a_dead_prepare_is_removed_and_said(tmp_path, demo_jsonl, tokenizer, name, dead,
                                                                    sleeper, capsys):
    """A SIGKILLed prepare's directory (its own name, its `--force` aside, an older minilmd's `.DIR.tmp-PID`), its
    process gone or its pid running again as another process (another start time), or its pid and start time a
    live process's but its boot another (a prepare cut by a reboot): removed, and said."""
    host = socket.gethostname()
    leftover = tmp_path / {"new": f".p.prepare-{host}-{dead[0]}-{dead[1]}",
                           "aside": f".p.prepare-{host}-{dead[0]}-{dead[1]}.old",
                           "older minilmd's": f".p.tmp-{dead[0]}",
                           "recycled pid": f".p.prepare-{host}-{sleeper[0]}-{sleeper[1] + 1}",
                           "another boot": f".p.prepare-{host}-{sleeper[0]}-{sleeper[1]}-boot00000000"}[name]
    _half(leftover)
    _prepare(demo_jsonl, tokenizer, tmp_path / "p")
    assert not os.path.lexists(leftover)
    assert f"minilmd prepare: removed {leftover}: the temporary directory of a prepare" in capsys.readouterr().err
    assert not list(tmp_path.glob(".p.*"))


@pytest.mark.parametrize("theirs_is", ["a link to a directory", "another host's", "a live prepare's",
                                       "a live prepare's of this boot", "a file"])
def test_a_leftover_not_ours_to_remove_is_left_and_said(tmp_path, demo_jsonl, tokenizer, theirs_is, dead, sleeper,
                                                        capsys):
    """By a prepare's name, but a symbolic link (never followed: what it leads to is not looked at either),
    another host's (its pid says nothing here), a running process's (pid and start time), or a file (prepare makes
    only directories): before, each was left silently or (a link to a directory) looked at through the link. Now
    each is left as it is and said; the prepare succeeds."""
    host = "another-host" if theirs_is == "another host's" else socket.gethostname()
    pid, ticks = sleeper if theirs_is.startswith("a live prepare's") else dead
    boot = f"-boot{boot_tag()}" if theirs_is == "a live prepare's of this boot" else ""
    leftover = tmp_path / f".p.prepare-{host}-{pid}-{ticks}{boot}"
    elsewhere = _half(tmp_path / "elsewhere")
    if theirs_is == "a link to a directory":
        leftover.symlink_to(elsewhere)
    elif theirs_is == "a file":
        leftover.write_bytes(b"not a prepare's\n")
    else:
        _half(leftover)
    said = {"a link to a directory": "a symbolic link by a prepare's temporary name; left as it is",
            "another host's": "left as it is: a prepare's temporary directory on host another-host",
            "a live prepare's": f"its process (pid {pid}) still runs",
            "a live prepare's of this boot": f"its process (pid {pid}) still runs",
            "a file": "but not a directory"}[theirs_is]
    _prepare(demo_jsonl, tokenizer, tmp_path / "p")
    err = capsys.readouterr().err
    assert f"minilmd prepare: {leftover}: " in err and said in err, err
    assert os.path.lexists(leftover)
    assert (elsewhere / "train" / "tokens.bin").read_bytes() == b"half a corpus\n"


def test_another_users_leftover_is_left_and_said(shared, demo_jsonl, tokenizer, dead, capsys):
    """A dead prepare's directory by the name, but made by another user (a real `nobody`, in a shared directory
    both may write): before, left silently. Now left untouched and said with its uid."""
    uid, _gid = second_user()
    name = f".p.prepare-{socket.gethostname()}-{dead[0]}-{dead[1]}"
    sh_as_user(f"mkdir -p {name}/train && echo theirs > {name}/train/tokens.bin", cwd=shared)
    _prepare(demo_jsonl, tokenizer, shared / "p")
    err = capsys.readouterr().err
    assert f"minilmd prepare: {shared / name}: left as it is: the temporary directory of a killed prepare, but " \
           f"another user's (uid {uid})" in err, err
    assert (shared / name / "train" / "tokens.bin").read_text() == "theirs\n"
    assert os.lstat(shared / name).st_uid == uid
