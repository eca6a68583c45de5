"""Helpers for the tests of deploy/'s tmux launcher (deploy/minilmd-tmux.sh): the launcher driven headless on a
private tmux server with a stand-in `minilmd` that records how it was called (the fixture `launcher`), and the
smallest run config it accepts."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from waiting import wait_until

LAUNCHER = Path(__file__).resolve().parent.parent / "deploy" / "minilmd-tmux.sh"
UNIT = LAUNCHER.with_name("minilmd@.service")
MINILMD = Path(sys.executable).with_name("minilmd")
"""The minilmd command of this environment (beside its python)."""

STAND_IN = """#!{python}
# A stand-in for minilmd: records how it was called, then stays alive like a supervisor would; or, when
# MINILMD_STAND_IN_EXITS="1,-9,65" names an end for this call (the Nth call the Nth), exits with that status (a
# negative one: killed by that signal) at once. MINILMD_STAND_IN_CHECK_EXIT: the status of `run --check`;
# MINILMD_STAND_IN_STATUS: what `status --json` prints.
import json, os, signal, sys, time
if "--check" in sys.argv:  # the launcher's check before it starts the supervisor: accept, or not
    print(sys.argv[2] + ": OK"); sys.exit(int(os.environ.get("MINILMD_STAND_IN_CHECK_EXIT", "0")))
if sys.argv[1] == "status":  # what MINILMD_STAND_IN_STATUS says the run is (the launcher asks when --check refused)
    print(os.environ.get("MINILMD_STAND_IN_STATUS", "{{}}")); sys.exit(0)
with open({record!r}, "a") as f:
    f.write(json.dumps({{"argv": sys.argv[1:], "pid": os.getpid(), "ppid": os.getppid(), "cwd": os.getcwd(),
                        "fault": os.environ.get("MINILMD_FAULT"),
                        "auto_restart": os.environ.get("MINILMD_AUTO_RESTART"),
                        "launcher_vars": sorted(k for k in os.environ if k.startswith("MINILMD_TMUX_"))}}) + "\\n")
with open({record!r}) as f:
    calls = sum(1 for line in f if json.loads(line)["argv"][0] == sys.argv[1])
ends = [e for e in os.environ.get("MINILMD_STAND_IN_EXITS", "").split(",") if e]
if sys.argv[1] == "run" and calls <= len(ends):
    status = int(ends[calls - 1])
    print(f"stand-in minilmd run, call {{calls}}: ending with {{status}}", flush=True)
    if status < 0:
        os.kill(os.getpid(), -status)
    sys.exit(status)
time.sleep(600)
"""


class Launcher:
    """The launcher, a private tmux server, and a stand-in minilmd that appends its argv to a record file."""

    def __init__(self, root: Path):
        self.root = root
        self.record = root / "record.jsonl"
        bin_dir = root / "bin"
        bin_dir.mkdir()
        stand_in = bin_dir / "minilmd"
        stand_in.write_text(STAND_IN.format(python=sys.executable, record=str(self.record)))
        stand_in.chmod(0o755)
        # the launcher reads the config with the python beside minilmd, as in a venv
        (bin_dir / "python").symlink_to(sys.executable)
        self.socket = f"minilmd-test-{os.getpid()}"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("TMUX", "MINILMD"))}
        self.env.update(PATH=f"{bin_dir}:{os.environ['PATH']}", MINILMD_TMUX_SOCKET=self.socket,
                        TMUX_TMPDIR=str(root), HOME=str(root))

    def __call__(self, *args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(LAUNCHER), *args], capture_output=True, text=True, timeout=60,
                              cwd=cwd or self.root, env={**self.env, **env}, stdin=subprocess.DEVNULL)

    def tmux(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=30,
                              env=self.env)

    def windows(self, session: str) -> list[tuple[int, str, int, bool]]:
        """(index, name, pane pid, pane dead) per window."""
        out = self.tmux("list-panes", "-s", "-t", f"={session}", "-F",
                        "#{window_index} #{window_name} #{pane_pid} #{pane_dead}")
        assert out.returncode == 0, out.stderr
        rows = [line.split() for line in out.stdout.splitlines()]
        return [(int(i), name, int(pid), dead == "1") for i, name, pid, dead in rows]

    def records(self, count: int) -> list[dict]:
        """Wait until the stand-ins have recorded `count` calls, then return them all."""
        # whole lines only: a stand-in still appending its record must not count, nor fail json.loads
        lines = lambda: self.record.read_text().split("\n")[:-1] if self.record.exists() else []
        wait_until(lambda: len(lines()) >= count, 120, f"{count} recorded calls of minilmd", interval=0.05)
        return [json.loads(line) for line in lines()]

    def wait_dead(self, session: str, window: str) -> None:
        wait_until(lambda: any(name == window and dead for _, name, _, dead in self.windows(session)), 120,
                   f"pane {window} to end", interval=0.05)

    def last_word(self, session: str, window: str) -> str:
        """The last line the launcher's restart loop wrote in window (it names the supervisor's exit status). Not
        tmux's pane_dead_status: on a loaded machine tmux 3.3a at times left an ended window's shell unreaped,
        its window dead without a status."""
        said = [line for line in self.screen(session, window).splitlines() if line.startswith("minilmd-tmux: ")]
        assert said, self.screen(session, window)
        return said[-1]

    def screen(self, session: str, window: str) -> str:
        """What window shows, its scrollback included."""
        out = self.tmux("capture-pane", "-p", "-J", "-S", "-", "-t", f"={session}:{window}")
        assert out.returncode == 0, out.stderr
        return out.stdout


@pytest.fixture
def launcher():
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    # a short private directory: tmux sockets live under TMUX_TMPDIR and a socket path must stay under 108 bytes
    root = Path(tempfile.mkdtemp(prefix="mtmux-"))
    launch = Launcher(root)
    try:
        yield launch
    finally:
        launch.tmux("kill-server")
        shutil.rmtree(root, ignore_errors=True)


def launcher_config(path: Path, name: str | None, run_dir: str | None) -> Path:
    lines = ["[run]"]
    if name is not None:
        lines.append(f'name = "{name}"')
    if run_dir is not None:
        lines.append(f'dir = "{run_dir}"')
    path.write_text("\n".join(lines) + "\n")
    return path


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """{section: {key: [values in order]}}; systemd allows a key more than once (Environment=)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def systemd_seconds(value: str) -> float:
    """'15min', '30s', '1h', '1min 30s' -> seconds (the forms this unit uses)."""
    units = {"s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600, "hr": 3600}
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value):
        total += float(number) * units[unit or "s"]
    return total
