"""`minilmd bench prepare`: is prepare as fast as the tokenizer itself, and does its memory stay small?

Two measurements on the same data and the same cores, printed side by side:
- raw: the tokenizer's own `encode_batch` and `encode_batch_fast` (Rust thread pool over all cores) on blocks of
  texts already in memory; only the encode calls are timed (no reading, no JSON, no writing);
- prepare: the real `minilmd prepare` as a subprocess, wall clock from launch to exit (reading, parsing,
  splitting, encoding, writing, hashing, leak check, statistics), with its peak RSS summed over the process and
  its workers (sampled every 50 ms; shared pages count once per process, so the sum errs high).
Both also report CPU seconds (all threads and processes): on a machine shared with other work, tokens per CPU
second compare the two fairly even when wall-clock throughput is disturbed.
Goal: prepare >= 0.9x the faster raw tokens/s, peak RSS < 1 GiB.
"""
from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from minilmd import pychild
from minilmd.corpus.sources.bad_tally import BadLineTally
from minilmd.names import CORPUS_META

GOAL_RATIO = 0.9
GOAL_RSS = 1 << 30


def raw_encode(sources: list[str], tokenizer: str, block_bytes: int = 1 << 20, bad=None) -> dict:
    """Throughput of encode_batch and encode_batch_fast on the corpus texts, only encode time counted. The lines
    not encoded (bad, or longer than jsonl.MAX_LINE_BYTES: read through, never held) go to `bad`, a BadLineTally
    (a fresh one when None)."""
    from minilmd.corpus.sources.jsonl import parse_block
    from minilmd.corpus.tokenizer import load_tokenizer

    bad = BadLineTally() if bad is None else bad

    tok = load_tokenizer(tokenizer)
    methods = {"encode_batch": tok.encode_batch}
    if hasattr(tok, "encode_batch_fast"):
        methods["encode_batch_fast"] = tok.encode_batch_fast
    seconds = dict.fromkeys(methods, 0.0)
    cpu = dict.fromkeys(methods, 0.0)
    text_bytes = tokens = 0
    for _, parsed in _parsed_blocks(sources, block_bytes, bad, parse_block):
        texts = parsed.texts
        text_bytes += sum(len(t.encode("utf-8")) for t in texts)
        for name, encode in methods.items():
            t0, c0 = time.perf_counter(), time.process_time()
            encs = encode(texts, add_special_tokens=False)
            seconds[name] += time.perf_counter() - t0
            cpu[name] += time.process_time() - c0
        tokens += sum(len(e) for e in encs) + 2 * len(texts)  # count BOS/EOS as prepare does
    return {name: {"seconds": s, "cpu_seconds": cpu[name], "text_bytes": text_bytes, "tokens": tokens}
            for name, s in seconds.items()}


FLOORS = {"threads": ("encode_batch", True, "floor: render once + encode_batch"),
          "one thread": ("encode_batch", False, "  the same, one thread"),
          "fast, one thread": ("encode_batch_fast", False, "  encode_batch_fast, one thread")}
"""The chat floors: the encode method, whether the tokenizer's own thread pool runs it, and the bench's label for
it. "threads" is the floor
the goal is set against; "one thread" is the same work without the pool's overhead (prepare's workers encode on one
thread each); "fast, one thread" is the least the tokenizer can do (no offsets), what prepare's workers run for a
byte-level BPE (chat_masks.ByteStarts)."""


def chat_floor(sources: list[str], tokenizer: str, block_bytes: int = 1 << 20, bad=None) -> dict:
    """The floors of `prepare --format chat`: each conversation rendered once by the tokenizer's chat template, in
    the same bounded sandbox (chat.ChatTemplate.render), and the renderings encoded by each way of FLOORS; only the
    renders and the encodes are timed (no reading, no JSON, no masks, no writing). CPU seconds of each floor: the
    renders' plus its encodes'. The lines not rendered go to `bad`, as in raw_encode."""
    import os

    from minilmd.corpus.chat import parse_chat_block
    from minilmd.corpus.chat_files import load_template
    from minilmd.corpus.tokenizer import load_tokenizer

    bad = BadLineTally() if bad is None else bad

    tok = load_tokenizer(tokenizer)
    template = load_template(tokenizer)
    floors = {name: how for name, how in FLOORS.items() if hasattr(tok, how[0])}
    seconds, cpu = dict.fromkeys(floors, 0.0), dict.fromkeys(floors, 0.0)
    input_bytes = tokens = conversations = 0
    was = os.environ.get("TOKENIZERS_PARALLELISM")
    try:
        for block, parsed in _parsed_blocks(sources, block_bytes, bad, parse_chat_block):
            input_bytes += len(block)
            convs = parsed.conversations
            t0, c0 = time.perf_counter(), time.process_time()
            texts = [template.render(m) for m in convs]
            render_s, render_cpu = time.perf_counter() - t0, time.process_time() - c0
            for name, (method, threads, _) in floors.items():
                os.environ["TOKENIZERS_PARALLELISM"] = "true" if threads else "false"  # read at each call
                t0, c0 = time.perf_counter(), time.process_time()
                encs = getattr(tok, method)(texts, add_special_tokens=False)
                seconds[name] += render_s + time.perf_counter() - t0
                cpu[name] += render_cpu + time.process_time() - c0
            tokens += sum(len(e) for e in encs)
            conversations += len(convs)
    finally:
        if was is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = was
    return {name: {"seconds": seconds[name], "cpu_seconds": cpu[name], "input_bytes": input_bytes, "tokens": tokens,
                   "conversations": conversations} for name in floors}


def _parsed_blocks(sources: list[str], block_bytes: int, bad, parse) -> Iterator[tuple[bytes, Any]]:
    """(the block's bytes, parse(block, its first line)) of each block of whole lines of the sources (jsonl.Source
    .blocks: a line longer than jsonl.MAX_LINE_BYTES read through, never held); each line not parsed, and each too
    long, put in `bad` (a BadLineTally)."""
    from minilmd.corpus.sources.jsonl import OverLong, Source

    for path in sources:
        src = Source(path)
        try:
            for item in src.blocks(block_bytes):
                if isinstance(item, OverLong):
                    bad.add(path, *item.bad)
                    continue
                parsed = parse(item[1], item[0])
                for line, reason, detail in parsed.bad:
                    bad.add(path, line, reason, detail)
                yield item[1], parsed
        finally:
            src.close()


def _tree_rss(proc) -> int:
    import psutil

    total = 0
    try:
        procs = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def _end_child(child: subprocess.Popen) -> None:
    """Our prepare child, still running when the bench is interrupted (a Ctrl-C reaches it too; a `kill` of the
    bench alone does not): SIGTERM, which prepare handles as Ctrl-C, and waited for."""
    import signal

    from minilmd.procs import signal_child

    if child.poll() is None:
        signal_child(child.pid, signal.SIGTERM)
        child.wait()


def run_prepare(sources: list[str], tokenizer: str, out: Path, workers: int | None = None,
                extra: tuple[str, ...] = ()) -> dict:
    """Run `minilmd prepare` (with `extra` options) as a subprocess; wall time, peak tree RSS, and its meta.json."""
    import json

    import psutil

    # The caller's working directory is kept: the sources may be relative to it (minilmd/pychild.py).
    cmd = pychild.module_argv("minilmd.cli", "prepare", *sources, "--tokenizer", str(tokenizer),
                              "--out", str(out), "--force", *extra)
    if workers is not None:
        cmd += ["--workers", str(workers)]
    import resource

    log = out.parent / "prepare.log"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with open(log, "wb") as logf:
        child = pychild.popen(cmd, keep_cwd=True, stdout=logf, stderr=subprocess.STDOUT)
        try:
            proc = psutil.Process(child.pid)
            peak = 0
            while child.poll() is None:
                peak = max(peak, _tree_rss(proc))
                time.sleep(0.05)
        finally:
            _end_child(child)  # interrupted: the prepare ends (its own cleanup) before its scratch is removed
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # prepare and its workers, all reaped by now
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if child.returncode != 0:
        raise RuntimeError(f"prepare exited with {child.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
    meta = json.loads((out / CORPUS_META).read_text())
    tokens = meta["splits"]["train"]["tokens"] + meta["splits"]["val"]["tokens"]
    removed = meta["leak_check"]["removed_from_val"]  # their tokens were encoded too; negligible, not added back
    return {"seconds": wall, "cpu_seconds": cpu, "peak_rss": peak, "tokens": tokens,
            "text_bytes": meta["stats"]["input_text_bytes"],
            "input_bytes": sum(s["bytes"] for s in meta["sources"]), "leaked_removed": removed}


def bench_prepare(sources: list[str], tokenizer: str, workers: int | None = None, scratch: str | None = None,
                  log=print, data_format: str = "text", seq_len: int = 512) -> dict:
    from minilmd.corpus.workers import default_workers

    cores = default_workers()
    if data_format == "chat":
        return bench_chat_prepare(sources, tokenizer, workers, scratch, log, seq_len, cores)
    log(f"bench prepare: {', '.join(sources)} on {cores} cores; raw encode first (also warms the page cache)")
    not_encoded = BadLineTally()
    raw = raw_encode(sources, tokenizer, bad=not_encoded)
    not_encoded.log_skipped(log)  # bad lines, and lines too long to hold: named, not encoded
    tmp = Path(tempfile.mkdtemp(prefix="minilmd-bench-prepare-", dir=scratch))
    try:
        prep = run_prepare(sources, tokenizer, tmp / "prepared", workers)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    rows = []
    for name, r in raw.items():
        rows.append((f"raw {name} ({cores} threads)", r["text_bytes"] / r["seconds"], None,
                     r["tokens"] / r["seconds"], r["tokens"] / max(r["cpu_seconds"], 1e-9)))
    rows.append((f"prepare ({workers or cores} workers, wall)", prep["text_bytes"] / prep["seconds"],
                 prep["input_bytes"] / prep["seconds"], prep["tokens"] / prep["seconds"],
                 prep["tokens"] / max(prep["cpu_seconds"], 1e-9)))
    best_raw = max(r["tokens"] / r["seconds"] for r in raw.values())
    ratio = prep["tokens"] / prep["seconds"] / best_raw
    cpu_ratio = rows[-1][4] / max(row[4] for row in rows[:-1])
    log(f"{'':34} {'text MB/s':>10} {'JSONL MB/s':>11} {'tokens/s':>12} {'tokens/CPU-s':>13}")
    for name, text_mbs, jsonl_mbs, tok_s, tok_cpu in rows:
        jsonl = f"{jsonl_mbs / 1e6:11.2f}" if jsonl_mbs else f"{'-':>11}"
        log(f"{name:34} {text_mbs / 1e6:10.2f} {jsonl} {tok_s:12,.0f} {tok_cpu:13,.0f}")
    log(f"prepare / fastest raw encode: {ratio:.2f}x wall, {cpu_ratio:.2f}x per CPU second (goal >= {GOAL_RATIO}x)   "
        f"peak RSS of prepare and its workers: {prep['peak_rss'] / 2**20:,.0f} MiB (goal < {GOAL_RSS / 2**20:,.0f} MiB)"
        f"   corpus {prep['input_bytes'] / 1e6:,.1f} MB, {prep['tokens']:,} tokens")
    return {"raw": raw, "prepare": prep, "ratio": ratio, "cpu_ratio": cpu_ratio, "cores": cores,
            "meets_goal": ratio >= GOAL_RATIO and prep["peak_rss"] < GOAL_RSS}



def bench_chat_prepare(sources: list[str], tokenizer: str, workers: int | None, scratch: str | None, log,
                       seq_len: int, cores: int) -> dict:
    """`prepare --format chat` beside its floors (chat_floor), in JSONL MB and tokens per CPU second: a floor is
    one process, prepare its workers, so only CPU seconds compare them. The goal is against the "threads" floor;
    the ratio to each floor is printed."""
    log(f"bench prepare --format chat: {', '.join(sources)} on {cores} cores; the floors first (also warm the page "
        "cache)")
    not_rendered = BadLineTally()
    floors = chat_floor(sources, tokenizer, bad=not_rendered)
    not_rendered.log_skipped(log)
    tmp = Path(tempfile.mkdtemp(prefix="minilmd-bench-prepare-", dir=scratch))
    try:
        prep = run_prepare(sources, tokenizer, tmp / "prepared", workers,
                           ("--format", "chat", "--seq-len", str(seq_len)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    def per_cpu(r: dict) -> float:
        return r["input_bytes"] / max(r["cpu_seconds"], 1e-9)

    ratios = {name: per_cpu(prep) / per_cpu(r) for name, r in floors.items()}
    rows = [(FLOORS[name][2], r, f"{ratios[name]:12.2f}x") for name, r in floors.items()]
    rows.append((f"prepare --format chat ({workers or cores} workers)", prep, f"{'':13}"))
    log(f"{'':40} {'JSONL MB/CPU-s':>15} {'tokens/CPU-s':>13} {'CPU s':>8} {'wall s':>8} {'prepare/this':>13}")
    for name, r, versus in rows:
        cpu = max(r["cpu_seconds"], 1e-9)
        log(f"{name:40} {r['input_bytes'] / 1e6 / cpu:15.2f} {r['tokens'] / cpu:13,.0f} {r['cpu_seconds']:8.1f} "
            f"{r['seconds']:8.1f} {versus}")
    ratio = ratios["threads"]
    log(f"chat prepare / its floor: {ratio:.2f}x per CPU second (goal >= {GOAL_RATIO}x)   peak RSS of prepare and its "
        f"workers: {prep['peak_rss'] / 2**20:,.0f} MiB   corpus {prep['input_bytes'] / 1e6:,.1f} MB, "
        f"{floors['threads']['conversations']:,} conversations, {prep['tokens']:,} tokens after the cut at {seq_len}")
    return {"floor": floors["threads"], "floors": floors, "prepare": prep, "cpu_ratio": ratio, "ratios": ratios,
            "cores": cores, "meets_goal": ratio >= GOAL_RATIO}
