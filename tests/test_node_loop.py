"""The by-hand restart loop of docs/operations.md ("Without Slurm: torchrun's rendezvous by hand"), run as the doc
gives it, in bash, with a fake torchrun in place of `python -m torch.distributed.run ...`. On main a Ctrl-C (SIGINT
to the loop's process group) started training again: torchrun exits 1 after its ranks saved instead of dying of the
signal, so bash took the stop for a failure, and it took up to three Ctrl-Cs to stop it."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "operations.md"
WAIT_S = 120.0

FAKE_TORCHRUN = """
import signal, sys, time
starts, mode = sys.argv[1], sys.argv[2]
with open(starts, "a") as f:
    f.write("start\\n")
n = sum(1 for _ in open(starts))
def stopped(sig, frame):  # torchrun: the ranks saved, then SignalException and exit 1, not death by the signal
    print("fake torchrun: stopped by", signal.Signals(sig).name, flush=True)
    sys.exit(1)
signal.signal(signal.SIGINT, stopped)
signal.signal(signal.SIGTERM, stopped)
if mode == "fail-once" or n > 1:  # a start after the first ends at once: a loop that restarts is seen at once
    sys.exit(1 if n == 1 else 0)
with open(starts + ".ready", "w") as f:
    f.write(str(n))
while True:
    time.sleep(1)
"""


def _doc_loop() -> str:
    """The sh block of the doc that holds the restart loop."""
    blocks = re.findall(r"```sh\n(.*?)```", DOC.read_text(), re.S)
    (loop,) = [b for b in blocks if "for attempt in" in b]
    return loop


def _with_fake(loop: str, fake: Path, starts: Path, mode: str) -> str:
    torchrun = re.compile(r"python -m torch\.distributed\.run .*?-m minilmd\.cli train run\.toml", re.S)
    assert torchrun.search(loop), loop
    return torchrun.sub(f"{sys.executable} {fake} {starts} {mode}", loop).replace("sleep 1", "sleep 0")


def _start(tmp_path: Path, mode: str) -> tuple[subprocess.Popen, Path]:
    fake = tmp_path / "fake_torchrun.py"
    fake.write_text(FAKE_TORCHRUN)
    starts = tmp_path / "starts"
    script = tmp_path / "node.sh"
    script.write_text(_with_fake(_doc_loop(), fake, starts, mode))
    loop = subprocess.Popen(["bash", str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True,  # its own process group, as a terminal's job is
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # not ignored on entry
    return loop, starts


def _wait_for(path: Path, loop: subprocess.Popen) -> None:
    deadline = time.monotonic() + WAIT_S
    while not path.exists():
        assert loop.poll() is None, loop.communicate()[0]
        assert time.monotonic() < deadline, f"{path} never came"
        time.sleep(0.05)


def test_one_ctrl_c_stops_the_docs_restart_loop(tmp_path):
    loop, starts = _start(tmp_path, "train")
    try:
        _wait_for(Path(f"{starts}.ready"), loop)
        os.killpg(loop.pid, signal.SIGINT)  # what Ctrl-C on the terminal sends: the whole foreground group
        out, _ = loop.communicate(timeout=WAIT_S)
    finally:
        if loop.poll() is None:
            os.killpg(loop.pid, signal.SIGKILL)
            loop.wait()
    assert "fake torchrun: stopped by SIGINT" in out, out
    assert "restart" not in out and starts.read_text() == "start\n", out
    assert loop.returncode == 130, out


def test_the_docs_loop_still_starts_torchrun_again_after_a_failure(tmp_path):
    loop, starts = _start(tmp_path, "fail-once")
    out, _ = loop.communicate(timeout=WAIT_S)
    assert "restart 1" in out and starts.read_text() == "start\nstart\n", out
    assert loop.returncode == 0, out
