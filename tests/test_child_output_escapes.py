"""What reaches a trainer's attempt log other than through `minilmd train`'s own printing holds no terminal escape
either: torchrun's failure summary, a py-spy dump, a faulthandler dump (docs/failure-modes.md, the escapes row).

`minilmd logs` escapes what it shows of a log; `tail -f logs/attempt-0001.log` does not. Each writer is run for
real here: the torchrun agent the supervisor launches (gpu.count > 1, gloo on CPU), py-spy (a fake on PATH) as the
hang handling runs it, and the faulthandler dump a hung trainer's SIGUSR1 gives.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from minilmd.daemon.child import stackdump
from minilmd.daemon.child.process import build_command, launch, wait_bounded

CLIP = "\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\x07\x1b[2J"
"""OSC 52 (a command put on the clipboard to paste) and a clear screen: what a foreign name may carry."""
CLIP_SHOWN = "\\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\\x07\\x1b[2J"
RAW = (b"\x1b", b"\x07", b"\xc2\x9b")

RANK = textwrap.dedent(f"""
    # A rank as `minilmd train` is one: its own output through minilmd/terminal.py, and (as a rank that uses
    # torch's @record does) its exception written to torchrun's error file, which the agent's summary quotes.
    from minilmd import terminal

    terminal.escape_std_streams()
    from torch.distributed.elastic.multiprocessing.errors import record


    @record
    def main():
        raise RuntimeError("a name from someone else's checkpoint: " + {CLIP!r})


    main()
""")


def assert_escaped(log: bytes) -> None:
    assert not any(raw in log for raw in RAW), log.decode(errors="replace")[-3000:]
    assert CLIP_SHOWN.encode() in log, log.decode(errors="replace")[-3000:]


@pytest.mark.slow
def test_torchruns_failure_summary_reaches_the_attempt_log_escaped(tmp_path):
    rank = tmp_path / "rank.py"
    rank.write_text(RANK)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    command = build_command(tmp_path / "run.toml", {}, nproc=2)
    agent = command[:command.index("minilmd.cli") - 1]  # the agent as the supervisor starts it, up to its ranks'
    child = launch([*agent, str(rank)], run_dir, 1, devices="")
    rc = wait_bounded(child.popen, 300)
    if rc is None:
        child.kill()
        wait_bounded(child.popen, 30)
    log = child.log_path.read_bytes()
    assert rc == 1, log.decode(errors="replace")[-3000:]
    assert b"ChildFailedError" in log and b"a name from someone else's checkpoint" in log
    assert_escaped(log)


def test_a_py_spy_dump_reaches_the_attempt_log_escaped(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "py-spy"
    # py-spy names each frame's function and file: a file someone else named, bytes that are not UTF-8 too
    fake.write_bytes(b"#!/bin/sh\nprintf 'Thread 1 (idle)\\n    load (/team/ckpt/" + CLIP.encode()
                     + b"/x.py:3)\\n    \\377\\376 (y.py:1)\\n'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        log_path = tmp_path / "attempt-0001.log"
        log_path.write_bytes(b"")
        said = stackdump.dump_stack(sleeper.pid, log_path)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert said == "py-spy dumped the stacks into the attempt log"
    log = log_path.read_bytes()
    assert_escaped(log)
    assert "\ufffd\ufffd (y.py:1)".encode() in log  # not UTF-8: replaced, not a crash of the hang handling


def test_a_faulthandler_dump_escapes_the_names_it_writes_past_the_wrapper(tmp_path):
    """faulthandler writes to the descriptor itself, past minilmd/terminal.py: nothing of minilmd escapes its dump.
    CPython's does (every character but printable ASCII and the newline written as \\xNN, \\uNNNN): pinned here,
    with the trainer's registration (trainer/loop/train.py) and a frame of a file someone else named."""
    hung = textwrap.dedent(f"""
        import faulthandler, os, signal, sys
        from minilmd import terminal

        terminal.escape_std_streams()
        faulthandler.register(signal.SIGUSR1, all_threads=True)
        code = compile("def load():\\n    os.kill(os.getpid(), signal.SIGUSR1)\\n", "/team/ckpt/" + {CLIP!r} + "/x.py",
                       "exec")
        scope = {{"os": os, "signal": signal}}
        exec(code, scope)
        scope["load"]()
    """)
    log_path = tmp_path / "attempt-0001.log"
    with open(log_path, "wb") as log:
        done = subprocess.run([sys.executable, "-c", hung], stdout=log, stderr=log, timeout=120)
    dump = log_path.read_bytes()
    assert done.returncode == 0, dump
    assert b"(most recent call first)" in dump and b", line 2 in load" in dump, dump
    assert_escaped(dump)
    assert all(32 <= byte < 127 or byte == 10 for byte in dump), dump


@pytest.mark.slow
def test_torchs_log_handlers_made_before_the_streams_were_wrapped_write_escaped():
    """The Slurm job's torchrun (`python -m minilmd.trainer.loop.rendezvous`) imports torch, which gives its loggers
    handlers on the stderr it finds, before its `__main__` wraps the streams: those handlers write through the
    wrapper from then on, as the agent's report of a failed rank does."""
    agent = textwrap.dedent(f"""
        import logging
        import minilmd.trainer.loop.rendezvous
        from minilmd import terminal

        terminal.escape_std_streams()
        logging.getLogger("torch.distributed.elastic.agent.server.api").error("rank 0 said: " + {CLIP!r})
    """)
    done = subprocess.run([sys.executable, "-c", agent], capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert b"rank 0 said: " in done.stderr, done.stderr
    assert_escaped(done.stderr)
