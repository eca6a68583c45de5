"""scripts/gpu-check part 6: MiniMind's own trainer/train_pretrain.py beside minilmd's trainer.

MiniMind's source (jingyaogong/minimind, Apache-2.0) lives in ../shared/minimind, never in this project: it is run
there, unmodified, from its trainer/ folder, as its ABOUT.md says. Same GPU, same model (hidden_size x layers from
the check's config; MiniMind's defaults give the same 8 query / 4 KV heads, checked in its source), same text
(WORK/text.jsonl, each trainer with its own tokenizer), same seq_len and micro-batch, bf16, eager on both sides
(part 4 eager is minilmd's figure); then, where part 4 compiled ran, MiniMind with `--use_compile 1` beside it.
MiniMind prints no throughput: its log lines ("(step/iters), loss ...") are timed as they arrive (unbuffered), and
its real tokens per step are the micro-batch times the mean real tokens per row of the corpus under its tokenizer
(BOS + text + EOS, cut at seq_len; the rest of each row is padding it computes but does not learn from). The run is
stopped before its epoch ends: at the epoch's end it would save into ../checkpoints of the shared folder, which is
not ours to write.
In the dry run the command is checked against the trainer's own argparse flags and model defaults, not run.
"""
from __future__ import annotations

import functools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from gpu_check_part import median, provisional  # beside this script
from gpu_check_plan import OPTIONAL_S, PartClock

from minilmd import procs, pychild

ROOT = Path(__file__).resolve().parents[1]
LOG_LINE = re.compile(r"\((\d+)/(\d+)\), loss")
LOG_INTERVAL = 10
NEEDS = "datasets, transformers"
"""What MiniMind's trainer imports beside torch (its requirements.txt): without them the part skips, saying so."""


def find_minimind() -> Path | None:
    """MiniMind's source: $MINILMD_MINIMIND, ../shared/minimind beside this checkout (or beside the main checkout
    of a git worktree), or shared/minimind inside it (a device machine's copy)."""
    candidates = [Path(os.environ["MINILMD_MINIMIND"])] if os.environ.get("MINILMD_MINIMIND") else []
    candidates += [ROOT.parent / "shared" / "minimind", ROOT / "shared" / "minimind"]
    try:
        common = procs.run_bounded(["git", "-C", str(ROOT), "rev-parse", "--path-format=absolute",
                                    "--git-common-dir"], 10, text=True).stdout.strip()
        if common:
            candidates.append(Path(common).parent.parent / "shared" / "minimind")
    except (OSError, subprocess.SubprocessError):
        pass
    return next((c for c in candidates if (c / "trainer" / "train_pretrain.py").is_file()), None)


def copy_minimind(src: Path, copy: Path) -> None:
    """MiniMind's trainer/, model/ and dataset/ copied unmodified into `copy` (an earlier copy replaced), for a
    trainer that reads and writes `../out` beside its trainer/ folder (init_model's from_weight): run in the copy,
    it never writes into the shared source, which is not ours."""
    import shutil

    for folder in ("trainer", "model", "dataset"):
        shutil.rmtree(copy / folder, ignore_errors=True)
        shutil.copytree(src / folder, copy / folder)


def minimind_command(work: Path, p: dict, compiled: bool = False) -> list[str]:
    m = p["model"]
    return [sys.executable, "train_pretrain.py", "--data_path", str(work / "text.jsonl"),
            "--save_dir", str(work / "minimind-out"), "--hidden_size", str(m["hidden_size"]),
            "--num_hidden_layers", str(m["num_hidden_layers"]), "--max_seq_len", str(p["seq_len"]),
            "--batch_size", str(p["micro_batch_size"]), "--accumulation_steps", "1", "--epochs", "1",
            "--dtype", "bfloat16", "--num_workers", "4", "--log_interval", str(LOG_INTERVAL),
            "--save_interval", "1000000000", "--use_compile", "1" if compiled else "0", "--from_resume", "0",
            "--device", "cuda:0"]


def check_command(src: Path, cmd: list[str], p: dict) -> list[str]:
    """What is wrong with the command against MiniMind's source: flags its argparse lacks, other head counts."""
    accepted = set(re.findall(r"add_argument\(\s*[\"'](--[\w-]+)", (src / "trainer" / "train_pretrain.py").read_text()))
    problems = [f"train_pretrain.py has no {flag}" for flag in cmd if flag.startswith("--") and flag not in accepted]
    model = (src / "model" / "model_minimind.py").read_text()
    for key in ("num_attention_heads", "num_key_value_heads"):
        found = re.search(rf"{key}\s*=\s*kwargs\.get\(\"{key}\",\s*(\d+)\)", model)
        if not found or int(found.group(1)) != p["model"][key]:
            problems.append(f"MiniMind's default {key} {found.group(1) if found else '?'} != {p['model'][key]}")
    return problems


@functools.cache
def mean_real_tokens(src: Path, jsonl: Path, seq_len: int) -> float:
    """MiniMind's real tokens per row of this corpus: BOS + the text's tokens + EOS, cut at seq_len. Counted once a
    part (its compiled and eager runs read the same corpus), in one batch over the CPU's cores: one encode a line
    took 8 s for part 0's 6,000 documents on 2 cores."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(src / "model" / "tokenizer.json"))
    texts = [str(json.loads(line)["text"]) for line in jsonl.read_text(encoding="utf-8").splitlines() if line.strip()]
    lengths = [min(len(e.ids), seq_len - 2) + 2 for e in tok.encode_batch(texts, add_special_tokens=False)]
    return sum(lengths) / max(len(lengths), 1)


def run_minimind(src: Path, cmd: list[str], stop_at: int, timeout: float,
                 lines: list[str] | None = None) -> tuple[list[tuple[int, float]], int, str]:
    """Run it from its trainer/ folder until its log shows step `stop_at` (or it ends, or `timeout` seconds pass,
    never past the part's own time: gpu_check_part.time_left): ((step, arrival time) of each log line, steps per
    epoch, the output's tail); its log lines are appended to `lines` when given. A watchdog kills its process group
    at the limit even when it prints nothing (the loop over its output waits on the next line): its session of its
    own would otherwise outlive the part, and the part's kill."""
    from gpu_check_part import time_left

    limit = max(1.0, min(timeout, time_left()))
    proc = subprocess.Popen(cmd, cwd=src / "trainer", stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
    fired = threading.Event()

    def bark() -> None:
        fired.set()
        procs.signal_child_group(proc.pid, signal.SIGKILL)  # its pipe closes: the loop below ends

    watchdog = threading.Timer(limit, bark)
    watchdog.start()
    seen: list[tuple[int, float]] = []
    iters, tail = 0, []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            now = time.monotonic()
            print(line, end="", flush=True)
            tail = (tail + [line.rstrip()])[-5:]
            found = LOG_LINE.search(line)
            if found:
                seen.append((int(found.group(1)), now))
                if lines is not None:
                    lines.append(line)
                iters = int(found.group(2))
                if seen[-1][0] >= stop_at or seen[-1][0] >= iters - LOG_INTERVAL:
                    break  # before the epoch's end and its save into the shared folder
    finally:
        watchdog.cancel()
        watchdog.join()  # no signal of its own after the reaping below
        procs.signal_child_group(proc.pid, signal.SIGKILL)  # with its DataLoader workers, unless reaped
        proc.wait()
    if fired.is_set():
        tail.append(f"[killed by the watchdog after {limit:.0f}s]")
    return seen, iters, " | ".join(tail)[-300:]


def side_by_side(work: Path, p: dict, dry: bool, took, read_metrics) -> tuple[str, str]:
    src = find_minimind()
    if src is None:
        took("minimind absent")
        return "skip", "no MiniMind source (../shared/minimind absent, or set MINILMD_MINIMIND): nothing to compare"
    cmd = minimind_command(work, p)
    shown = f"(cd {src}/trainer && python {' '.join(cmd[1:])})"
    problems = check_command(src, cmd, p) + check_command(src, minimind_command(work, p, compiled=True), p)
    if problems:
        return "fail", f"{shown}: " + "; ".join(problems)
    took("command checked")
    if dry:
        return "skip", f"--dry-run: not run; the command, its flags and model defaults checked: {shown}"
    deps = pychild.run(pychild.python_argv("-c", f"import {NEEDS}"), keep_cwd=True, capture_output=True, text=True)
    if deps.returncode != 0:
        return "skip", f"MiniMind's trainer needs {NEEDS}: {deps.stderr.strip().splitlines()[-1]}"
    clock = PartClock()
    figures, status = [], "ok"
    # compiled first (issue 41: MiniMind's --use_compile 1 beside part 4 compiled), then eager, measured beside part
    # 4 eager on issue 41's lease (1.40x), when the part's share has room for it
    for mode in ("compiled", "eager"):
        ours = minilmd_tok_s(work / mode / "run", p, read_metrics)
        if ours is None:
            figures.append(f"{mode}: no minilmd figure (part 4 {mode} did not run), MiniMind {mode} not run")
            continue
        if mode == "eager" and not clock.fits("MiniMind eager", OPTIONAL_S["minimind eager"]):
            continue
        took("minimind run" if mode == "eager" else "minimind compiled run")
        result, text = timed_minimind(work, src, minimind_command(work, p, compiled=mode == "compiled"), p, ours,
                                      mode)
        figures.append(f"{mode}: {text}")
        status = "fail" if result == "fail" else status
        provisional(status, " | ".join(figures))  # kept should the part be killed during the next
    if not any(f.startswith(("compiled: MiniMind", "eager: MiniMind")) for f in figures) and status == "ok":
        status = "fail"
    return status, " | ".join(figures) + clock.note()


def minilmd_tok_s(run_dir: Path, p: dict, read_metrics) -> float | None:
    """The median real tok/s of part 4's run in `run_dir` past its warm-up steps; None when it did not run."""
    if not (run_dir / "metrics.jsonl").exists():
        return None
    # part 4's own timed steps (part 5 run carries the compiled run on past them)
    timed = [m["tok_s"] for m in read_metrics(run_dir, "train")
             if p["warm_steps"] < m["step"] <= p["warm_steps"] + p["timed_steps"]]
    return median(timed) if timed else None


def timed_minimind(work: Path, src: Path, cmd: list[str], p: dict, ours: float, mode: str) -> tuple[str, str]:
    # timed from its log line at step 10 on: its compile (--use_compile 1) happens in its first step, before it
    warm = LOG_INTERVAL * max(1, p["warm_steps"] // LOG_INTERVAL)
    seen, iters, tail = run_minimind(src, cmd, warm + p.get("minimind_timed", p["timed_steps"]), timeout=200)
    timed = [(s, t) for s, t in seen if s >= warm]
    if len(timed) < 2:
        return "fail", f"MiniMind ({mode}) logged {[s for s, _ in seen]} of {iters} steps: {tail}"
    (s0, t0), (s1, t1) = timed[0], timed[-1]
    real = mean_real_tokens(src, work / "text.jsonl", p["seq_len"]) * p["micro_batch_size"]
    theirs = real * (s1 - s0) / (t1 - t0)
    padded = p["micro_batch_size"] * p["seq_len"] * (s1 - s0) / (t1 - t0)
    return "ok", (f"MiniMind {theirs:,.0f} real tok/s ({padded:,.0f} with its padding; steps {s0}-{s1} of {iters}, "
                  f"{mode} bf16), minilmd {ours:,.0f} real tok/s (part 4 {mode}): minilmd/MiniMind "
                  f"{ours / theirs:.2f}x")
