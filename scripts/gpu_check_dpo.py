"""scripts/gpu-check part "9 dpo": minilmd's DPO beside MiniMind's own trainer/train_dpo.py (issue 42), on the same
weights and the same pairs: the loss at the first step (ln 2 for both whatever the weights: the policy is its own
reference, so it checks each side's reference, not that the weights are equal; one exported file makes them equal),
real tokens per second of each and the ratio, and the time of minilmd's one reference pass.

The pairs: part 8's synthetic conversations (gpu_check_sft.write_chats, part 0's pseudo-words) made into MiniMind
DPO lines as the tests and the demo make theirs (minilmd.corpus.demo_chat.preference_pairs: the real final reply
chosen, another conversation's rejected). minilmd prepares them with `--format dpo` under MiniMind's own tokenizer
and chat template (../shared/minimind/model; part 0's tokenizer with a ChatML template where MiniMind is absent),
a short SFT stage (`minilmd train` of a few steps on the pairs' chosen conversations, `--format chat`) makes the SFT
weights, exported with `minilmd export --format minimind` as `full_sft_<hidden>.pth` (fp16): both DPO runs start
from that file, minilmd's through `[init] from`, beta 0.15 and lr 4e-8 as MiniMind's defaults, the same pairs per
step. MiniMind's init_model reads `../out/full_sft_<hidden>.pth` beside its trainer/ folder, inside the shared
source, which is not ours to write, so its source folders (trainer/, model/, dataset/) are copied unmodified into
WORK and run there.
MiniMind's real tokens per pair are both sides rendered as its template and DPODataset render them (its empty think
block dropped four times in five), cut at max_seq_len; the rest of each row is padding it computes and runs
through its second, reference model. In the dry run everything of minilmd's side runs (tiny model, CPU) and
MiniMind's command is checked against its argparse flags, not run.
"""
from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from types import SimpleNamespace

SEQ_LEN = {"gpu": 1024, "dry": 256}
"""MiniMind's default max_seq_len (it pads both sides of every pair to it); minilmd cuts there and pads no row to it."""
PAIRS = {"gpu": 16, "dry": 4}
"""Pairs per step on both sides (MiniMind's --batch_size counts pairs, as minilmd's micro_batch_size does for DPO)."""
STEPS = {"gpu": (5, 20), "dry": (1, 3)}
"""(warm-up steps, timed steps) of each run."""
SFT_STEPS = {"gpu": 5, "dry": 3}
"""The SFT stage both start from: `minilmd train` on the pairs' chosen conversations, this many steps."""
BETA, LR = 0.15, 4e-8
"""MiniMind's defaults, on both sides (at that rate the loss stays near ln 2: the first steps stay comparable)."""
MINIMIND_MIN_S = 40
"""The fewest seconds of the part's own budget left in which MiniMind is started (its imports and two models load
before its first step)."""
LN2 = 0.693147


def part_dpo(work: Path, p: dict, dry: bool, h: SimpleNamespace, side, sft) -> tuple[str, str]:
    """`h`: gpu-check's helpers; `side`: gpu_check_sidebyside (MiniMind found, run, timed); `sft`: gpu_check_sft."""
    deadline = time.monotonic() + h.time_left()  # the part's own end (gpu_check_plan.PartClock)
    if not (work / "tokenizer.json").exists() or not (work / "text.jsonl").exists():
        return "fail", "no tokenizer or text (part 0 failed)"
    kind = "dry" if dry else "gpu"
    src = side.find_minimind()
    tokenizer = src / "model" if src is not None else sft.chatml_tokenizer_dir(work)
    pairs = write_pairs(work, sft, 600 if dry else 1200, tokenizer / "tokenizer.json", SEQ_LEN[kind])
    prepared = work / "dpo-prepared"
    shutil.rmtree(prepared, ignore_errors=True)
    done = h.minilmd("prepare", str(pairs), "--tokenizer", str(tokenizer), "--format", "dpo", "--out", str(prepared),
                     "--seq-len", str(SEQ_LEN[kind]), "--val-fraction", "0.05", "--workers", "0")
    if done.returncode != 0:
        return "fail", f"minilmd prepare --format dpo: exit {done.returncode}"
    q = dpo_shape(p, kind)
    sft_checkpoints = minilmd_sft(work, q, tokenizer, pairs, SFT_STEPS[kind], h)
    if isinstance(sft_checkpoints, str):
        return "fail", sft_checkpoints
    weights = work / "minimind-dpo" / "out" / f"full_sft_{q['model']['hidden_size']}.pth"
    exported = h.minilmd("export", str(sft_checkpoints), "--format", "minimind", "--out", str(weights))
    if exported.returncode != 0:
        return "fail", f"minilmd export --format minimind of the SFT stage: exit {exported.returncode}"
    h.took("sft exported")
    ours = minilmd_dpo(work, q, prepared, weights, h)
    if isinstance(ours, str):
        return "fail", ours
    figures = (f"T={q['seq_len']}, {q['micro_batch_size']} pairs a step, from {SFT_STEPS[kind]} SFT steps' "
               f"weights: {ours['text']}")
    h.provisional("ok", f"{figures}; MiniMind: not yet")
    if src is None:
        h.took("minimind absent")
        return "ok", f"{figures}; MiniMind: no source (../shared/minimind absent, or MINILMD_MINIMIND): not compared"
    status, theirs = minimind_dpo(work, src, q, pairs, dry, h, side, ours, deadline)
    return status, f"{figures}; {theirs}"[:1200]


def dpo_shape(p: dict, kind: str) -> dict:
    """The check's model with MiniMind's fixed 8 query / 4 KV heads (its export refuses others), DPO's shapes."""
    warm, timed = STEPS[kind]
    return {**p, "model": {**p["model"], "num_attention_heads": 8, "num_key_value_heads": 4},
            "seq_len": SEQ_LEN[kind], "micro_batch_size": PAIRS[kind], "warm_steps": warm, "timed_steps": timed}


def write_pairs(work: Path, sft, n: int, tokenizer_json: Path, seq_len: int) -> Path:
    """The pairs both trainers read, those whose two sides fit in seq_len (with MiniMind's think block): MiniMind
    trains on every line cut at max_seq_len, minilmd drops a pair whose reply falls past the cut; so neither cuts
    nor drops one and both see the same pairs."""
    from tokenizers import Tokenizer

    from minilmd.corpus.demo_chat import preference_pairs

    chats = sft.write_chats(work, n, name="dpo-chat.jsonl")
    conversations = [json.loads(line)["conversations"] for line in chats.read_text(encoding="utf-8").splitlines()]
    tok = Tokenizer.from_file(str(tokenizer_json))
    out = work / "dpo-pairs.jsonl"
    with out.open("w", encoding="utf-8") as f:
        for pair in preference_pairs(conversations):
            if max(rendered_length(tok, side, True) for side in (pair["chosen"], pair["rejected"])) < seq_len:
                f.write(json.dumps(pair, ensure_ascii=False) + "\n")
    return out


THINK = "<think>\n\n</think>\n\n"


def rendered_length(tok, messages: list[dict], with_think: bool) -> int:
    """Tokens of one side as MiniMind's template renders it (ChatML, no system message unless given, each reply
    after an empty think block, which its DPODataset drops with probability 0.8)."""
    text = "".join(f"<|im_start|>{m['role']}\n{THINK if with_think and m['role'] == 'assistant' else ''}"
                   f"{m['content']}<|im_end|>\n" for m in messages)
    return len(tok.encode(text, add_special_tokens=False).ids)


def minilmd_sft(work: Path, q: dict, tokenizer: Path, pairs: Path, steps: int, h: SimpleNamespace) -> Path | str:
    """The SFT weights both DPO runs start from: `minilmd train` of a few steps on the pairs' chosen conversations
    (`--format chat` under the same tokenizer); its checkpoint root (LATEST), or why not."""
    chats = work / "dpo-sft-chat.jsonl"
    with chats.open("w", encoding="utf-8") as f:
        for line in pairs.read_text(encoding="utf-8").splitlines():
            f.write(json.dumps({"conversations": json.loads(line)["chosen"]}, ensure_ascii=False) + "\n")
    prepared = work / "dpo-sft-prepared"
    shutil.rmtree(prepared, ignore_errors=True)
    done = h.minilmd("prepare", str(chats), "--tokenizer", str(tokenizer), "--format", "chat", "--out",
                     str(prepared), "--seq-len", str(q["seq_len"]), "--val-fraction", "0.05", "--workers", "0")
    if done.returncode != 0:
        return f"minilmd prepare --format chat (the SFT stage): exit {done.returncode}"
    config = h.write_config(work, "dpo-sft", q, prepared=str(prepared), compile=False, max_steps=steps, lr=1e-4,
                            checkpoint_every=10 * steps)
    h.took("minilmd sft")
    done = h.minilmd("train", str(config))
    root = work / "dpo-sft" / "scratch" / "checkpoints"
    if done.returncode != 0 or not (root / "LATEST").is_file():
        return f"minilmd train (the SFT stage): exit {done.returncode}"
    return root


def minilmd_dpo(work: Path, q: dict, prepared: Path, weights: Path, h: SimpleNamespace) -> dict | str:
    """`minilmd train` of DPO from the SFT weights as MiniMind reads them (`[init] from` the exported .pth): its
    step-1 loss, median real tok/s past the warm-up, the reference pass; or why not."""
    steps = q["warm_steps"] + q["timed_steps"]
    config = h.write_config(work, "dpo", q, prepared=str(prepared), compile=False, max_steps=steps, lr=LR,
                            warmup_steps=0, checkpoint_every=10 * steps)
    with config.open("a", encoding="utf-8") as f:
        f.write(f"[dpo]\nbeta = {BETA}\n\n[init]\nfrom = {json.dumps(str(weights))}\n")
    h.took("minilmd dpo")
    done = h.minilmd("train", str(config))
    if done.returncode != 0:
        return f"minilmd train (DPO): exit {done.returncode}"
    run_dir = work / "dpo" / "run"
    lines = h.read_metrics(run_dir, "train")
    reference = h.read_metrics(run_dir, "dpo_reference")
    timed = sorted(m["tok_s"] for m in lines if m["step"] > q["warm_steps"])
    if not lines or not timed or not reference:
        return f"minilmd DPO: {len(lines)} train lines, reference lines {reference}"
    first, tok_s = lines[0], timed[len(timed) // 2]
    ref = reference[0]
    text = (f"minilmd step 1 loss {first['loss']:.6f} (ln 2 {LN2}), {tok_s:,.0f} real tok/s (median of steps "
            f"{q['warm_steps'] + 1}-{lines[-1]['step']}, eager {q['dtype']}), reference once: {ref['pairs']} pairs "
            f"in {ref['seconds']:.2f}s ({ref['source']})")
    if abs(first["loss"] - LN2) > 1e-4:
        return text + ": the first step's loss is not ln 2"
    return {"loss": first["loss"], "tok_s": tok_s, "text": text}


def minimind_command(work: Path, q: dict, pairs: Path) -> list[str]:
    m = q["model"]
    return [sys.executable, "train_dpo.py", "--data_path", str(pairs), "--save_dir", str(work / "minimind-dpo" / "out"),
            "--save_weight", "dpo_check", "--from_weight", "full_sft", "--hidden_size", str(m["hidden_size"]),
            "--num_hidden_layers", str(m["num_hidden_layers"]), "--max_seq_len", str(q["seq_len"]),
            "--batch_size", str(q["micro_batch_size"]), "--learning_rate", str(LR), "--beta", str(BETA),
            "--accumulation_steps", "1", "--epochs", "1", "--dtype", "bfloat16", "--num_workers", "4",
            "--log_interval", "1", "--save_interval", "1000000000", "--use_compile", "0", "--from_resume", "0",
            "--device", "cuda:0"]


def minimind_dpo(work: Path, src: Path, q: dict, pairs: Path, dry: bool, h: SimpleNamespace, side, ours: dict,
                 deadline: float) -> tuple[str, str]:
    import re

    cmd = minimind_command(work, q, pairs)
    script = src / "trainer" / "train_dpo.py"
    accepted = set(re.findall(r"add_argument\(\s*[\"'](--[\w-]+)", script.read_text(encoding="utf-8")))
    missing = [flag for flag in cmd if flag.startswith("--") and flag not in accepted]
    if missing:
        return "fail", f"train_dpo.py has no {', '.join(missing)}"
    h.took("dpo command checked")
    copy = work / "minimind-dpo"
    shown = f"cd {copy}/trainer && python {' '.join(cmd[1:])}"
    if dry:
        return "ok", f"MiniMind (--dry-run: not run; its command checked: {shown})"
    left = deadline - time.monotonic() - 10
    if left < MINIMIND_MIN_S:
        return "skip", f"MiniMind train_dpo.py not run: {left:.0f}s of the part's budget left (under {MINIMIND_MIN_S}s)"
    deps = subprocess_check(f"import {side.NEEDS}")
    if deps:
        return "skip", f"MiniMind's trainer needs {side.NEEDS}: {deps}"
    side.copy_minimind(src, copy)
    h.took("minimind dpo run")
    lines: list[str] = []
    seen, iters, tail = side.run_minimind(copy, cmd, q["warm_steps"] + q["timed_steps"], timeout=min(left, 200),
                                          lines=lines)
    timed = [(s, t) for s, t in seen if s >= q["warm_steps"]]
    first = next((float(m.group(1)) for m in map(re.compile(r"\(1/\d+\), loss: ([\d.]+)").search, lines) if m), None)
    if len(timed) < 2 or first is None:
        return "fail", f"MiniMind DPO logged {[s for s, _ in seen]} of {iters} steps: {tail}"
    (s0, t0), (s1, t1) = timed[0], timed[-1]
    real = mean_real_pair_tokens(src, pairs, q["seq_len"]) * q["micro_batch_size"] * (s1 - s0) / (t1 - t0)
    padded = 2 * q["micro_batch_size"] * (q["seq_len"] - 1) * (s1 - s0) / (t1 - t0)
    same = abs(first - LN2) < 1e-4
    return ("ok" if same else "fail"), (
        f"MiniMind train_dpo.py step 1 loss {first:.4f}{'' if same else ' (NOT ln 2)'}, {real:,.0f} real tok/s "
        f"({padded:,.0f} with its padding, its reference model run every step; steps {s0}-{s1} of {iters}, eager "
        f"bf16): minilmd/MiniMind {ours['tok_s'] / real:.2f}x real tok/s")


def subprocess_check(code: str) -> str:
    """'' when `code` runs in this python, else the last line of its error."""
    from minilmd import pychild

    done = pychild.run(pychild.python_argv("-c", code), keep_cwd=True, capture_output=True, text=True)
    return "" if done.returncode == 0 else (done.stderr.strip().splitlines() or ["?"])[-1]


def mean_real_pair_tokens(src: Path, pairs: Path, seq_len: int) -> float:
    """MiniMind's real tokens per pair: each side rendered as its DPODataset does (rendered_length, the think block
    in one case of five) under its tokenizer, cut at max_seq_len, less the one its shift to next-token labels drops."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(src / "model" / "tokenizer.json"))
    total, n = 0.0, 0
    for line in pairs.read_text(encoding="utf-8").splitlines():
        pair = json.loads(line)
        for side in (pair["chosen"], pair["rejected"]):
            total += sum(w * (min(rendered_length(tok, side, think), seq_len) - 1)
                         for w, think in ((0.2, True), (0.8, False)))
        n += 1
    return total / max(n, 1)
