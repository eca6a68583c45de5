"""How long work of the corpus tools shows that it moves (`prepare`, `prepare --append`, `tokenizer train`): one
home, so that every such command says it the same way, on a terminal or in a log.

On a terminal, a bar drawn in place with bytes/s and ETA; anywhere else (nohup, tmux's log, a unit's journal, a
pipe) a plain line on stderr every `interval` seconds and one at the end, so that a log shows the work goes on. A
phase whose progress cannot be measured (the BPE training inside the tokenizers library) says what it does when it
starts and how long it has run every `interval` seconds after (`phase`), from a thread of its own: the library
holds no GIL while it trains.
"""
from __future__ import annotations

import sys
import threading
import time

INTERVAL_S = 10.0
"""Seconds between two plain lines off a terminal."""


class Progress:
    """A bar with bytes/s and ETA on a terminal; a plain line every `interval` seconds otherwise (stderr), each
    starting with `name`. `tokens` is None where the work does not count them (tokenizer train's reading)."""

    def __init__(self, total_bytes: int, stream=None, tty: bool | None = None, interval: float = INTERVAL_S,
                 name: str = "prepare"):
        self.total = total_bytes  # a reader that opens its sources later sets it then (train_texts.iter_texts)
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.plain_interval = interval
        self.interval = 0.2 if self.tty else interval
        self.name = name
        self.start = self.last = time.monotonic()
        self._phase_done: threading.Event | None = None
        self._phase_thread: threading.Thread | None = None

    def update(self, done_bytes: int, tokens: int | None, docs: int, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last < self.interval:
            return
        self.last = now
        elapsed = max(now - self.start, 1e-9)
        rate = done_bytes / elapsed
        frac = done_bytes / self.total if self.total else 0.0
        eta = (self.total - done_bytes) / rate if rate > 0 and self.total else float("nan")
        eta_s = time.strftime("%H:%M:%S", time.gmtime(eta)) if eta == eta else "?"
        text = (f"{frac:6.1%} {done_bytes / 1e6:,.1f}/{self.total / 1e6:,.1f} MB {rate / 1e6:.2f} MB/s "
                f"ETA {eta_s}  {docs:,} docs")
        if tokens is not None:
            text += f" {tokens:,} tokens ({tokens / elapsed:,.0f} tok/s)"
        if self.tty:
            width = 24
            filled = int(width * min(frac, 1.0))
            self.stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {text}\x1b[K")
        else:
            self.stream.write(f"{self.name}: {text}\n")
        self.stream.flush()

    def phase(self, what: str) -> None:
        """A phase that cannot be measured begins: `what` said now (a line of its own, after the bar's), then
        `what: N s so far` every plain interval until the next phase or close()."""
        self._end_phase()
        self._end_bar()
        self._line(what)
        began, done = time.monotonic(), threading.Event()

        def tick() -> None:
            while not done.wait(self.plain_interval):
                self._line(f"{what}: {time.monotonic() - began:,.0f} s so far")

        self._phase_done, self._phase_thread = done, threading.Thread(target=tick, daemon=True,
                                                                      name=f"{self.name} progress")
        self._phase_thread.start()

    def close(self) -> None:
        self._end_phase()
        self._end_bar()

    def _line(self, text: str) -> None:
        self.stream.write(f"{self.name}: {text}\n")
        self.stream.flush()

    def _end_bar(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
            self.tty, self.interval = False, self.plain_interval  # once: plain lines after the bar's

    def _end_phase(self) -> None:
        if self._phase_thread is not None and self._phase_done is not None:
            self._phase_done.set()
            self._phase_thread.join()
            self._phase_thread = self._phase_done = None
