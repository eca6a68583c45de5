"""A victim and an attacker for the stop tests with real users (tests/test_stop_proof.py, tests/test_run_arg_users.py).

The victim is `nobody` (tests/second_user.py) running a real `minilmd run` (its trainer a sleeper that saves nothing
and exits 75 on SIGTERM, as a trainer does) and an unrelated `sleep`; the attacker is a second uid with no name
(setpriv needs no passwd entry), whose commands run as him through `as_attacker`.
"""
from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from minilmd import names
from minilmd.daemon.base.runstate import process_alive, process_start_ticks, read_state
from minilmd.daemon.host.lock import lock_holder
from second_user import second_user, user_python
from supervisor_helpers import write_config
from waiting import wait_until

CLI = "import sys; sys.argv[0] = 'minilmd'; from minilmd.cli import main; main()"
ATTACKER = 64123
"""The attacker's uid: a real second user for the kernel, with no passwd entry (so none to create)."""
SLEEPER = ("import signal, sys, time\n"
           "signal.signal(signal.SIGTERM, lambda *_: sys.exit(75))  # 'stopped', as the trainer exits\n"
           "while True:\n    time.sleep(1)\n")


def python_argv(code: str) -> list[str]:
    """[python, "-c", code] as the second user can run it (user_python's interpreter and bootstrap)."""
    argv = user_python(code)
    return argv[argv.index("--") + 1:]


def as_attacker(argv: list[str]) -> list[str]:
    return ["setpriv", f"--reuid={ATTACKER}", f"--regid={ATTACKER}", "--clear-groups", "--", *argv]


class Victim:
    """nobody's processes: a real supervisor of a run in the shared directory, and an unrelated `sleep`."""

    def __init__(self, shared: Path, corpus, name: str):
        second_user()
        if not (shared / "corpus").exists():
            subprocess.run(["cp", "-r", str(corpus[0]), str(shared / "corpus")], check=True)
        subprocess.run(["chmod", "-R", "a+rX", str(shared / "corpus")], check=True)
        config = write_config(shared, (shared / "corpus", corpus[1]), name, remote=False,
                              restart={"hang_timeout": "1h"}, train={"max_steps": 100000})
        config.chmod(0o644)
        self.run_dir = shared / name / "run"
        home = shared / f"home-{name}"
        self.env = {**{k: v for k, v in os.environ.items() if not k.startswith("MINILMD_")},
                    "HOME": str(home), "XDG_STATE_HOME": str(home / "state"), "OMP_NUM_THREADS": "1",
                    names.SYSTEM_REGISTRY_ENV: str(shared / "no-system-registry"),
                    names.TRAINER_CMD_ENV: shlex.join(python_argv(SLEEPER))}
        self.log = open(shared / f"{name}.out", "ab")
        self.supervisor = subprocess.Popen(user_python(CLI, "run", str(config)), stdout=self.log,
                                           stderr=subprocess.STDOUT, env=self.env, cwd="/")
        self.sleep = subprocess.Popen(user_python("import time; time.sleep(600)"), start_new_session=True, cwd="/")
        wait_until(self._trainer_runs, 120, "her supervisor to launch its trainer")
        self.sup_ticks = process_start_ticks(self.supervisor.pid)
        self.sleep_ticks = process_start_ticks(self.sleep.pid)

    def _trainer_runs(self) -> bool:
        holder = lock_holder(self.run_dir) if self.run_dir.exists() else None
        st = read_state(self.run_dir) if holder else None
        return bool(st and (st.get("child") or {}).get("pid")) and holder.pid == self.supervisor.pid

    def assert_alive(self) -> None:
        assert process_alive(self.sleep.pid, self.sleep_ticks), "her sleep was signalled"
        assert process_alive(self.supervisor.pid, self.sup_ticks), "her supervisor was signalled"
        assert lock_holder(self.run_dir).pid == self.supervisor.pid
        st = read_state(self.run_dir)
        assert st["phase"] not in ("stopping", "done"), st["phase"]

    def end(self) -> None:
        if self.supervisor.poll() is None:  # a failed test: her supervisor stops its trainer before it goes
            self.supervisor.terminate()
            try:
                self.supervisor.wait(60)
            except subprocess.TimeoutExpired:
                pass
        for proc in (self.supervisor, self.sleep):
            if proc.poll() is None:
                proc.kill()
            proc.wait(30)
        self.log.close()



@pytest.fixture
def victim(shared, corpus):
    made = []

    def make(name: str) -> Victim:
        made.append(Victim(shared, corpus, name))
        return made[-1]

    yield make
    for v in made:
        v.end()


def stop_as(argv_prefix: list[str] | None, run_dir: Path, env: dict) -> subprocess.CompletedProcess:
    """`minilmd stop run_dir`: as her, nobody (argv_prefix None), or through argv_prefix (root's minilmd)."""
    argv = user_python(CLI, "stop", str(run_dir)) if argv_prefix is None else \
        [*argv_prefix, "stop", str(run_dir)]
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd="/", timeout=120)
