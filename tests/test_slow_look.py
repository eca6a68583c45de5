"""A look at shared storage that is slow is said at once (bounded_probe's `on_slow`), and an init.from the launch found
stalled is not looked at again by the room check, which would wait on the same share in silence
(minilmd/init_stall.py; the launch as a whole: tests/test_init_from_first_launch.py)."""
from __future__ import annotations

import threading
import time

from minilmd import init_stall
from minilmd.bounded import SLOW_PROBE_S, Stalled, bounded_probe
from minilmd.config import load_config
from minilmd.daemon.jobs import scratch_room
from supervisor_helpers import write_config


def test_a_look_slow_past_slow_probe_s_is_said_once_with_what_it_may_still_take():
    gate = threading.Event()
    said: list[float] = []
    try:
        answered, _, why = bounded_probe(gate.wait, 60, timeout_s=SLOW_PROBE_S + 0.5, on_slow=said.append)
    finally:
        gate.set()  # the look's thread ends
    assert not answered and isinstance(why, Stalled) and said == [0.5], (why, said)
    assert bounded_probe(lambda: 1, on_slow=said.append) == (True, 1, "") and said == [0.5]  # it answered: no word


def test_the_room_check_passes_by_an_init_from_the_launch_found_stalled(tmp_path, corpus, monkeypatch):
    config = write_config(tmp_path, corpus, remote=False, init={"from": str(tmp_path / "share" / "base.pth")})
    cfg = load_config(config)
    looked: list = []
    monkeypatch.setattr(scratch_room, "run_space_need", looked.append)  # the look itself, counted
    assert scratch_room.run_space_problem(cfg) == [] and looked == [cfg]
    said: list[str] = []
    init_stall.slow_look(cfg.init.from_, "the launch's check", said.append)(4.0)  # what a slow look does
    try:
        assert said and said[0].startswith(f"init.from {cfg.init.from_} not answering since "), said
        looked.clear()
        assert scratch_room.run_space_problem(cfg) == [] and looked == []
    finally:
        init_stall.answered(cfg.init.from_)
    assert not init_stall.stalled(cfg.init.from_)
    assert scratch_room.run_space_problem(cfg) == [] and looked == [cfg]  # answered: looked at again


def test_words_about_a_slow_look_that_cannot_be_said_never_fail_the_look():
    """A launch whose stdout is a closed pipe (nohup into a reader gone): the word raises EPIPE. Before, that escaped
    bounded_probe and the config check with it (review2 F3)."""
    gate = threading.Event()

    def closed_stdout(left_s: float) -> None:
        raise BrokenPipeError(32, "Broken pipe")

    try:
        answered, _, why = bounded_probe(gate.wait, 60, timeout_s=SLOW_PROBE_S + 0.2, on_slow=closed_stdout)
    finally:
        gate.set()
    assert not answered and isinstance(why, Stalled), why


def test_the_starts_look_that_answers_forgets_a_stall_the_launch_said(tmp_path, corpus):
    """daemon/phases/initwait.py at_start, as the launch's look does (review2 F3: it never forgot it)."""
    from minilmd.daemon.phases import initwait

    config = write_config(tmp_path, corpus, remote=False, init={"from": str(tmp_path / "share" / "base.pth")})
    cfg = load_config(config)
    init_stall.slow_look(cfg.init.from_, "the launch's check", lambda line: None)(4.0)
    assert init_stall.stalled(cfg.init.from_)
    initwait.at_start(cfg, emit=lambda kind, line: None)
    assert not init_stall.stalled(cfg.init.from_)


def test_a_keyed_look_starts_no_other_while_the_last_has_not_answered():
    """Staging looks at run.remote at each retry of its wait for the corpus share (stagingfetch.look_at_remote): on a
    mount stalled for days, every try left one more thread behind, stuck. Under a key, a look whose predecessor has
    not answered yet is not started: stalled at once; once it answers, the next look runs."""
    gate, calls = threading.Event(), []

    def look():
        calls.append(1)
        gate.wait(60)
        return "answered"

    def started(n: int) -> bool:  # a look's thread may run its first line well after the probe gave up on it
        deadline = time.monotonic() + 60
        while len(calls) < n:
            assert time.monotonic() < deadline, calls
            time.sleep(0.01)
        return True

    key = ("test", "a stalled share")
    try:
        assert bounded_probe(look, timeout_s=0.2, key=key)[0] is False and started(1)
        answered, _, why = bounded_probe(look, timeout_s=0.2, key=key)
        assert not answered and isinstance(why, Stalled) and "earlier look" in why and len(calls) == 1, (why, calls)
        assert bounded_probe(look, timeout_s=0.2)[0] is False and started(2)  # unkeyed: started as before
    finally:
        gate.set()
    deadline = time.monotonic() + 60
    while bounded_probe(look, timeout_s=30, key=key)[0] is False:  # the stuck one answers: the next runs again
        assert time.monotonic() < deadline
    assert len(calls) == 3
