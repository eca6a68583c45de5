"""An export's every way out: its temporary `.NAME.tmp-HOST-PID-TICKS` beside --out is this process's own, made
by it and removed again whether the export fails on a bug, is interrupted (Ctrl-C) or stopped (SIGTERM); an --out
there before is left as it was. What a SIGKILL leaves is removed by the next export to that --out once its maker is
gone, when it is this user's file or directory; a live export's copy refuses the second export; another user's
copy, a link, another host's copy and an older minilmd's `.NAME.tmp` are left and said. A copy named in another
boot (`-boot<tag>`, the boot id's first 8 hex digits) is a dead export's, whatever process of this boot has its pid
and start time now."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from minilmd import leftovers
from minilmd.cli import app
from minilmd.proc_info import boot_tag
from minilmd.tmpnames import host_tag
from proc_fixtures import dead, sleeper  # noqa: F401 - fixtures
from second_user import second_user
from waiting import wait_until
from weights_helpers import export_checkpoint

torch.set_num_threads(1)
PAUSED = Path(__file__).resolve().parent / "export_paused.py"
EARLIER = b"an earlier export, not to be harmed\n"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return export_checkpoint(tmp_path_factory.mktemp("way-out"), seed=3)


def _earlier_out(tmp_path: Path, fmt: str) -> Path:
    """--out as an earlier export left it: a .pth (replaced with --force alone), or the empty directory an hf export
    may fill."""
    out = tmp_path / "out" / ("m.pth" if fmt == "minimind" else "hf")
    out.parent.mkdir()
    if fmt == "minimind":
        out.write_bytes(EARLIER)
    else:
        out.mkdir()
    return out


@pytest.mark.slow  # a `minilmd export` child each
@pytest.mark.parametrize("fmt", ["minimind", "hf"])
@pytest.mark.parametrize("way_out", ["a bug", "SIGINT", "SIGTERM", "SIGHUP"])
def test_an_export_stopped_while_writing_leaves_no_temporary_copy_and_out_as_it_was(checkpoint, tmp_path, fmt,
                                                                                    way_out):
    """A real `minilmd export` child stopped after it wrote its files into `.NAME.tmp`, before the rename: before,
    an exception that was no write error, Ctrl-C ("Aborted!") and SIGTERM (killed) all left the half export beside
    --out. Now it is removed on each (130 for the signals), and the earlier --out is untouched. SIGHUP (an SSH
    session closed under it) as the other commands take it: before, it killed the export, its copy left."""
    out = _earlier_out(tmp_path, fmt)
    ready = tmp_path / "ready"
    mode = "raise" if way_out == "a bug" else "wait"
    with open(tmp_path / "stderr", "wb") as err:
        child = subprocess.Popen([sys.executable, str(PAUSED), mode, str(ready), "export", str(checkpoint),
                                  "--format", fmt, "--out", str(out), "--force"], stdout=subprocess.DEVNULL, stderr=err,
                                 preexec_fn=_hangup_default)
    try:
        if mode == "wait":
            wait_until(lambda: ready.exists() or child.poll() is not None, 300, "the export to write its files")
            assert child.poll() is None, (tmp_path / "stderr").read_text()
            child.send_signal(getattr(signal, way_out))
        code = child.wait(300)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    said = (tmp_path / "stderr").read_text()
    assert [p.name for p in out.parent.iterdir()] == [out.name], (code, said)  # no .NAME.tmp
    if mode == "wait":
        assert code == 130 and "minilmd export: interrupted; nothing half-written is left" in said, (code, said)
    else:
        assert code == 1 and "LookupError: a bug after the files were written" in said, (code, said)
    if fmt == "minimind":
        assert out.read_bytes() == EARLIER
    else:
        assert out.is_dir() and not any(out.iterdir())


def _hangup_default() -> None:
    """SIGHUP's default in the child, as a session's command has it: a suite started under `nohup` passes SIGHUP
    ignored to every child, and the export, which keeps an ignored SIGHUP ignored (nohup's promise), then waited out
    the test's 300 s twice."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def _tmp_of(out: Path, pid: int, ticks: int, host: str | None = None, boot: str = "") -> Path:
    """The name an export (pid, start ticks) on `host` in boot `boot` (a boot tag; "": an older minilmd's, which
    records none) gives its temporary copy beside `out`: tmpnames.export_tmp_name, spelled out as docs/operations.md
    does."""
    name = f".{out.name}.tmp-{host or host_tag()}-{pid}-{ticks}"
    return out.with_name(name + (f"-boot{boot}" if boot else ""))


def _export(checkpoint: Path, fmt: str, out: Path):
    return CliRunner().invoke(app, ["export", str(checkpoint), "--format", fmt, "--out", str(out), "--force"])


def _exported(out: Path, fmt: str) -> bool:
    """--out holds this export's result, not the earlier one."""
    if fmt == "minimind":
        return out.read_bytes() != EARLIER and "lm_head.weight" in torch.load(out, weights_only=True)
    return (out / "config.json").is_file()


@pytest.mark.parametrize("fmt", ["minimind", "hf"])
def test_a_live_exports_temporary_copy_is_refused_and_left_alone(checkpoint, tmp_path, fmt, sleeper):
    """The temporary copy of an export that still runs (its pid alive with the start time its name records; a
    sleeping process stands in for it): two exports to one --out at once. Before, `.NAME.tmp` refused every later
    export, the killed one's too. Now exit 2 naming it, and it and --out stay as they were, no copy of ours left."""
    out = _earlier_out(tmp_path, fmt)
    theirs = _tmp_of(out, *sleeper)
    theirs.write_bytes(b"another export's\n")
    result = _export(checkpoint, fmt, out)
    assert result.exit_code == 2 and not isinstance(result.exception, Exception), (result.output, result.exception)
    assert (f"minilmd export: {theirs}: another export to {out} is writing it now (pid {sleeper[0]}); two exports "
            f"to one --out at once are refused") in result.output, result.output
    assert theirs.read_bytes() == b"another export's\n"
    assert sorted(p.name for p in out.parent.iterdir()) == sorted([out.name, theirs.name])
    if fmt == "minimind":
        assert out.read_bytes() == EARLIER
    else:
        assert not any(out.iterdir())


@pytest.mark.slow  # a `minilmd export` child each
@pytest.mark.parametrize("fmt", ["minimind", "hf"])
def test_an_export_sigkilled_mid_write_refuses_a_second_while_alive_and_is_cleaned_up_after(checkpoint, tmp_path,
                                                                                            fmt):
    """A real `minilmd export` child paused after it wrote its files into its temporary copy: a second export to
    the same --out meanwhile is refused (exit 2) and leaves the first's copy; then the first is SIGKILLed (no
    cleanup runs) and its copy stays. Before, that `.NAME.tmp` made every later export refuse (exit 2) until
    removed by hand. Now the next export removes it, says so, and succeeds: no temporary copy left."""
    out = _earlier_out(tmp_path, fmt)
    ready = tmp_path / "ready"
    with open(tmp_path / "stderr", "wb") as err:
        child = subprocess.Popen([sys.executable, str(PAUSED), "wait", str(ready), "export", str(checkpoint),
                                  "--format", fmt, "--out", str(out), "--force"], stdout=subprocess.DEVNULL, stderr=err)
    try:
        wait_until(lambda: ready.exists() or child.poll() is not None, 300, "the export to write its files")
        assert child.poll() is None, (tmp_path / "stderr").read_text()
        [theirs] = [p for p in out.parent.iterdir() if p.name != out.name]
        assert theirs.name.startswith(f".{out.name}.tmp-{host_tag()}-{child.pid}-"), theirs
        second = _export(checkpoint, fmt, out)
        assert second.exit_code == 2, second.output
        assert f"{theirs}: another export to {out} is writing it now (pid {child.pid})" in second.output
        assert sorted(p.name for p in out.parent.iterdir()) == sorted([out.name, theirs.name])
        child.kill()
        assert child.wait(300) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert theirs.exists()  # what a SIGKILL leaves
    result = _export(checkpoint, fmt, out)
    assert result.exit_code == 0, result.output
    assert (f"minilmd export: removed {theirs}: the temporary copy of an export (pid {child.pid}) killed before it "
            f"finished") in result.output, result.output
    assert [p.name for p in out.parent.iterdir()] == [out.name]  # no temporary copy: neither its nor ours
    assert _exported(out, fmt)


@pytest.mark.parametrize("fmt", ["minimind", "hf"])
@pytest.mark.parametrize("kind", ["a file", "a directory"])
@pytest.mark.parametrize("recycled", [False, True])
def test_this_users_leftover_of_a_dead_export_is_removed(checkpoint, tmp_path, fmt, kind, recycled, dead, sleeper):
    """A leftover whose export is gone: its pid not running, or running again as another process (a sleeper's pid
    with another start time than the name records: a recycled pid). Removed, said, the export done."""
    out = _earlier_out(tmp_path, fmt)
    theirs = _tmp_of(out, sleeper[0], sleeper[1] + 1) if recycled else _tmp_of(out, *dead)
    if kind == "a file":
        theirs.write_bytes(b"half an export\n")
    else:
        (theirs / "sub").mkdir(parents=True)
        (theirs / "sub" / "model.safetensors").write_bytes(b"half an export\n")
    result = _export(checkpoint, fmt, out)
    assert result.exit_code == 0, result.output
    assert f"minilmd export: removed {theirs}: the temporary copy of an export" in result.output, result.output
    assert [p.name for p in out.parent.iterdir()] == [out.name]
    assert _exported(out, fmt)


@pytest.mark.parametrize("boot", ["another", "this"])
def test_a_copy_of_another_boot_is_removed_though_a_live_process_has_its_pid_and_start_time(checkpoint, tmp_path,
                                                                                           sleeper, boot):
    """An export cut by a reboot: its copy's name records the pid and start time of a process that runs now (a
    sleeper's, as a service started at boot gets much the same each boot), and another boot's tag. Removed, said,
    the export done (before: refused, "another export ... is writing it now", until removed by hand). The same name
    with this boot's tag is the control: refused, as a live export's."""
    assert boot_tag(), "this kernel gives no boot id"
    out = _earlier_out(tmp_path, "minimind")
    theirs = _tmp_of(out, *sleeper, boot="00000000" if boot == "another" else boot_tag())
    theirs.write_bytes(b"half an export\n")
    result = _export(checkpoint, "minimind", out)
    if boot == "this":
        assert result.exit_code == 2, result.output
        assert f"{theirs}: another export to {out} is writing it now (pid {sleeper[0]})" in result.output
        assert theirs.read_bytes() == b"half an export\n" and out.read_bytes() == EARLIER
        return
    assert result.exit_code == 0, result.output
    assert f"minilmd export: removed {theirs}: the temporary copy of an export" in result.output, result.output
    assert [p.name for p in out.parent.iterdir()] == [out.name]
    assert _exported(out, "minimind")


@pytest.mark.parametrize("fmt", ["minimind", "hf"])
@pytest.mark.parametrize("theirs_is", ["another user's", "a link to a file", "a link to a directory",
                                       "another host's", "an older minilmd's"])
def test_a_leftover_not_ours_to_remove_is_left_said_and_the_export_goes_on(checkpoint, tmp_path, fmt, theirs_is,
                                                                           dead):
    """A dead export's name on what this export must not delete: another user's copy (a real chown to nobody), a
    symbolic link (never followed: what it leads to is not looked at either), another host's copy (its pid says
    nothing here), an older minilmd's `.NAME.tmp` (whose, it does not say). Each is left as it is and said; the
    export goes on under its own name (the names differ, so nothing of theirs is written) and succeeds."""
    out = _earlier_out(tmp_path, fmt)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "dir").mkdir(parents=True)
    (elsewhere / "file").write_bytes(b"not an export's\n")
    (elsewhere / "dir" / "file").write_bytes(b"not an export's\n")
    theirs = _tmp_of(out, *dead, host="another-host" if theirs_is == "another host's" else None)
    said = {"another user's": "but another user's (uid", "a link to a file": "a symbolic link by an export's "
            "temporary name; left as it is", "another host's": "left as it is: an export's temporary copy on host "
            "another-host", "an older minilmd's": "an older minilmd's temporary copy"}
    if theirs_is == "another user's":
        uid, gid = second_user()
        (theirs / "sub").mkdir(parents=True)
        (theirs / "sub" / "file").write_bytes(b"theirs\n")
        for path in (theirs, theirs / "sub", theirs / "sub" / "file"):
            os.chown(path, uid, gid)
    elif theirs_is.startswith("a link"):
        theirs.symlink_to(elsewhere / ("file" if theirs_is.endswith("file") else "dir"))
        said[theirs_is] = said["a link to a file"]
    else:
        if theirs_is == "an older minilmd's":
            theirs = out.with_name(f".{out.name}.tmp")
        theirs.write_bytes(b"theirs\n")
    result = _export(checkpoint, fmt, out)
    assert result.exit_code == 0, result.output
    assert f"minilmd export: {theirs}: " in result.output and said[theirs_is] in result.output, result.output
    assert sorted(p.name for p in out.parent.iterdir()) == sorted([out.name, theirs.name])  # theirs, no copy of ours
    assert _exported(out, fmt)
    if theirs_is == "another user's":
        assert (theirs / "sub" / "file").read_bytes() == b"theirs\n" and os.lstat(theirs).st_uid == uid
    elif theirs_is.startswith("a link"):
        assert theirs.is_symlink()
    else:
        assert theirs.read_bytes() == b"theirs\n"
    assert (elsewhere / "file").read_bytes() == (elsewhere / "dir" / "file").read_bytes() == b"not an export's\n"


@pytest.mark.parametrize("fmt", ["minimind", "hf"])
def test_an_out_name_too_long_for_the_temporary_name_is_refused(checkpoint, tmp_path, fmt):
    """An --out name the file system takes, but not the temporary name beside it (some 30 characters longer since
    it names host, pid and start time; 5 as `.NAME.tmp`, for names of 251 to 255 characters): an OSError traceback
    (ENAMETOOLONG, exit 1). Now exit 2 saying so, nothing written."""
    out = tmp_path / "out" / ("m" * 240 + (".pth" if fmt == "minimind" else ""))
    out.parent.mkdir()
    result = _export(checkpoint, fmt, out)
    assert result.exit_code == 2 and not isinstance(result.exception, Exception), (result.output, result.exception)
    assert f"minilmd export: {out}: its name is too long for the temporary copy" in result.output, result.output
    assert not any(out.parent.iterdir())


def test_the_leftover_sweep_acts_in_the_directory_opened_not_in_one_put_at_its_name(checkpoint, tmp_path, dead,
                                                                                    monkeypatch):
    """The directory of --out renamed away, and another put at its name, once the export opened it and made its
    copy there (as the export's own user could, from another shell): before, the sweep listed and removed by the
    path, in the directory now at the name (whose dead export's copy it removed, that of the directory written
    in staying). Now it acts in the directory opened, through its descriptor: there it removes the dead export's
    copy; the other directory's is left whole."""
    out = _earlier_out(tmp_path, "minimind")
    mine = _tmp_of(out, *dead)
    (mine / "sub").mkdir(parents=True)
    (mine / "sub" / "model.safetensors").write_bytes(b"half an export\n")
    moved = tmp_path / "moved"
    sweep = leftovers.sweep

    def moved_then_swept(*args, **kwargs):
        out.parent.rename(moved)
        (mine / "sub").mkdir(parents=True)  # another directory at the name, with a leftover by the same name
        (mine / "sub" / "other.bin").write_bytes(EARLIER)
        return sweep(*args, **kwargs)

    monkeypatch.setattr(leftovers, "sweep", moved_then_swept)
    result = _export(checkpoint, "minimind", out)
    assert result.exit_code == 0, result.output
    assert f"removed {mine}: the temporary copy of an export (pid {dead[0]})" in result.output, result.output
    assert (mine / "sub" / "other.bin").read_bytes() == EARLIER  # the directory now at the name: untouched
    assert sorted(p.name for p in moved.iterdir()) == [out.name]  # the one written in: swept, published


def test_a_leftover_replaced_after_it_was_looked_at_is_left(checkpoint, tmp_path, dead, monkeypatch):
    """A dead export's copy, found this user's own directory, then replaced by another directory by its name
    before it is removed: before, rmtree removed whatever stood at the name by then. Now it is removed only while
    it is the directory looked at (its identity): the one put there is left whole, and said."""
    out = _earlier_out(tmp_path, "minimind")
    mine = _tmp_of(out, *dead)
    mine.mkdir()
    real_own = leftovers.own

    def own_then_replaced(path, st, words, say):
        ours = real_own(path, st, words, say)
        if path == mine:
            mine.rename(tmp_path / "looked-at")
            mine.mkdir()
            (mine / "kept.bin").write_bytes(EARLIER)
        return ours

    monkeypatch.setattr(leftovers, "own", own_then_replaced)
    result = _export(checkpoint, "minimind", out)
    assert result.exit_code == 0, result.output
    assert (mine / "kept.bin").read_bytes() == EARLIER
    assert (f"{mine}: the temporary copy of a killed export (pid {dead[0]}) was replaced by something else while "
            f"it was looked at") in result.output, result.output
