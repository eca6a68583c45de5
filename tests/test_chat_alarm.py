"""The render budget's alarm (minilmd/corpus/chat_budget.py `limited`) against an Exceeded that Python loses: a
signal handler runs in whatever Python code is running, and when that is a gc callback (hypothesis installs one),
a __del__ or a weakref callback, the exception it raises is only reported (sys.unraisablehook) and the code goes
on. A template loop that calls nothing (`{% for i in L %}{% for j in L %}{% endfor %}{% endfor %}`) reaches no
check_time: before, the alarm raised once and never again, and such a rendering ran for ever. Here the first alarm
lands in a gc callback (it burns CPU until the alarm arrives), and a plain loop stands for the template's."""
from __future__ import annotations

import gc
import sys
import time

import pytest

from minilmd.corpus.chat_budget import Budget, Exceeded, TemplateLimits, limited

FOR_EVER_S = 20.0
"""CPU seconds the loop that calls nothing runs at most (for ever, but that the test ends): 400x the bound."""


def test_an_alarm_lost_in_a_gc_callback_comes_again_and_ends_a_loop_that_calls_nothing(monkeypatch):
    budget = Budget(TemplateLimits(seconds=0.05, seconds_per_message=0))
    lost, reported = [], []

    def callback(phase, info):
        if phase != "start" or lost or not budget.active:
            return
        try:
            while True:  # until the alarm lands here
                pass
        except Exceeded:
            lost.append(True)
            raise  # out of a gc callback: reported, never seen by the code gc ran in

    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: reported.append(unraisable.exc_type))
    gc.callbacks.append(callback)
    try:
        with pytest.raises(Exceeded, match="rendering took more than"):
            with limited(budget):
                gc.collect()  # the first alarm's Exceeded is lost in it (and later ones that land in gc)
                end = time.thread_time() + FOR_EVER_S
                while time.thread_time() < end:  # the template's loop that calls nothing
                    pass
    finally:
        gc.callbacks.remove(callback)
    assert lost and reported and set(reported) == {Exceeded}, reported  # lost, not raised, in gc
    assert not budget.active
