"""`minilmd bench append`: growing a large prepared corpus by `prepare --append` against a full re-prepare.

One run, side by side on the same data, cores and disk: a base corpus is prepared from OLD (not timed in the
comparison), then
- full: `prepare OLD NEW` into a second directory (what one does without --append: the whole input again);
- append: `prepare --append NEW` onto the base corpus.
For each: wall-clock seconds, CPU seconds of this process and its workers, and the peak disk growth of the
scratch directory (the sum of the allocated blocks of every file under it, sampled every 0.2 s: the temporary
directories count). Then the split files of the two results are compared byte for byte.
Without --old/--new a corpus is generated: OLD of --size-mb from the demo corpus (demo_text.write_repeated_corpus),
NEW of --new-lines lines from another seed (the seed's persona lines are 10,000).
"""
from __future__ import annotations

import os
import resource
import shutil
import tempfile
import threading
import time
from pathlib import Path

from minilmd.names import DOC_LENGTHS, SPLITS, TOKENS, split_file

SPLIT_FILES = tuple(split_file(s, n) for s in SPLITS for n in (TOKENS, DOC_LENGTHS))


def _allocated(root: Path) -> int:
    total = 0
    for dirpath, _, names in os.walk(root):
        for name in names:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except FileNotFoundError:
                pass  # a temporary file renamed or removed while walking
    return total


class DiskPeak:
    """The largest growth of _allocated(root) over its value at start, sampled in a thread."""

    def __init__(self, root: Path, interval: float = 0.2):
        self.root, self.interval = root, interval
        self.start = _allocated(root)
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _allocated(self.root) - self.start)
            self._stop.wait(self.interval)

    def __enter__(self) -> DiskPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _allocated(self.root) - self.start)


def _cpu() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _timed(scratch: Path, fn) -> dict:
    cpu0, t0 = _cpu(), time.monotonic()
    with DiskPeak(scratch) as disk:
        fn()
    return {"seconds": time.monotonic() - t0, "cpu_seconds": _cpu() - cpu0, "peak_disk_bytes": disk.peak}


def generate(scratch: Path, size_mb: float, new_lines: int) -> tuple[Path, Path]:
    """OLD (~size_mb MB) and NEW (new_lines lines), from the demo corpus with variations."""
    import json

    from minilmd.corpus.demo_text import write_demo_corpus, write_repeated_corpus

    demo = write_demo_corpus(scratch / "demo", max_docs_per_file=None)
    old = write_repeated_corpus(demo, scratch / "old.jsonl", size_mb, seed=0)
    pool = write_repeated_corpus(demo, scratch / "pool.jsonl", 8, seed=1)
    new = scratch / "new.jsonl"
    with open(pool, encoding="utf-8") as fin, open(new, "w", encoding="utf-8") as fout:
        for i, line in enumerate(fin):
            if i >= new_lines:
                break
            fout.write(json.dumps({"text": f"[{i}] " + json.loads(line)["text"]}, ensure_ascii=False) + "\n")
    pool.unlink()
    return old, new


def bench_append(tokenizer: str, old: str | None = None, new: str | None = None, size_mb: float = 1024,
                 new_lines: int = 10_000, workers: int | None = None, scratch: str | None = None,
                 log=print, val_fraction: float = 0.005) -> dict:
    from minilmd.corpus.prepare.append import append
    from minilmd.corpus.prepare.pipeline import prepare

    tmp = Path(tempfile.mkdtemp(prefix="minilmd-bench-append-", dir=scratch))
    quiet = lambda msg: None  # noqa: E731 - the bench prints its own table
    try:
        if old is None or new is None:
            t0 = time.monotonic()
            old_p, new_p = generate(tmp, size_mb, new_lines)
            log(f"generated {old_p} ({old_p.stat().st_size / 1e6:,.0f} MB) and {new_p} "
                f"({new_p.stat().st_size / 1e6:,.1f} MB, {new_lines:,} lines) in {time.monotonic() - t0:.0f} s")
        else:
            old_p, new_p = Path(old), Path(new)
        work = tmp / "out"
        work.mkdir()
        base = _timed(work, lambda: prepare([str(old_p)], tokenizer, work / "base", workers=workers,
                                            progress=False, log=quiet, val_fraction=val_fraction))
        log(f"base: prepare OLD in {base['seconds']:.0f} s")
        full = _timed(work, lambda: prepare([str(old_p), str(new_p)], tokenizer, work / "full", workers=workers,
                                            progress=False, log=quiet, val_fraction=val_fraction))
        appended = _timed(work, lambda: append([str(new_p)], work / "base", workers=workers, progress=False,
                                               log=quiet))
        differ = [f for f in SPLIT_FILES if not _same(work / "base" / f, work / "full" / f)]
        result = {"old_bytes": old_p.stat().st_size, "new_bytes": new_p.stat().st_size, "base": base,
                  "full": full, "append": appended, "differing_files": differ,
                  "corpus_bytes": sum((work / "full" / f).stat().st_size for f in SPLIT_FILES)}
        log(format_table(result))
        return result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _same(a: Path, b: Path, chunk: int = 8 << 20) -> bool:
    if a.stat().st_size != b.stat().st_size:
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            x, y = fa.read(chunk), fb.read(chunk)
            if x != y:
                return False
            if not x:
                return True


def format_table(r: dict) -> str:
    f, a = r["full"], r["append"]
    rows = [f"OLD {r['old_bytes'] / 1e6:,.0f} MB + NEW {r['new_bytes'] / 1e6:,.1f} MB; prepared corpus "
            f"{r['corpus_bytes'] / 1e6:,.0f} MB",
            f"{'':<26}{'seconds':>10}{'CPU s':>10}{'peak disk MB':>14}",
            f"{'full prepare OLD+NEW':<26}{f['seconds']:>10.1f}{f['cpu_seconds']:>10.1f}"
            f"{f['peak_disk_bytes'] / 1e6:>14,.1f}",
            f"{'prepare --append NEW':<26}{a['seconds']:>10.1f}{a['cpu_seconds']:>10.1f}"
            f"{a['peak_disk_bytes'] / 1e6:>14,.1f}",
            f"append / full: time {a['seconds'] / f['seconds']:.3f}x, peak disk "
            f"{a['peak_disk_bytes'] / max(f['peak_disk_bytes'], 1):.4f}x",
            "appended result byte-identical to the full prepare" if not r["differing_files"] else
            f"differ: {', '.join(r['differing_files'])}"]
    return "\n".join(rows)
