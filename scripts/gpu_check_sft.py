"""scripts/gpu-check part "8 sft": SFT beside MiniMind's own trainer/train_full_sft.py, on the same chat corpus at
T=768 (the reference notes, section 2: dynamic padding with length bucketing made their SFT epoch 3.2x faster).

A synthetic chat corpus (part 0's pseudo-words, conversations of widely spread lengths, MiniMind's
{"conversations": [{"role", "content"}, ...]} format) is prepared with `--format chat` under part 0's tokenizer and a
ChatML template, then `minilmd bench sft` times static padding, length bucketing, packing and padding-free packing
(real tokens/s each, the ratios). MiniMind's train_full_sft.py runs from ../shared/minimind/trainer on the same
JSONL, from no weights (`--from_weight none`), same model, seq_len and micro-batch, eager bf16, stopped before its
epoch ends (it would save into the shared folder); its real tokens per row are the ChatML rendering of each
conversation under its own tokenizer, cut at seq_len (its padding computed, not learnt from). In the dry run the
corpus, the bench and the command (against the script's argparse flags) are checked; MiniMind is not run.
"""
from __future__ import annotations

import json
import random
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

SEQ_LEN = {"gpu": 768, "dry": 64}
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def part_sft(work: Path, p: dict, dry: bool, h: SimpleNamespace, side) -> tuple[str, str]:
    """`h`: gpu-check's helpers; `side`: scripts/gpu_check_sidebyside.py (MiniMind found, run, timed)."""
    if not (work / "tokenizer.json").exists() or not (work / "text.jsonl").exists():
        return "fail", "no tokenizer or text (part 0 failed)"
    seq_len = SEQ_LEN["dry" if dry else "gpu"]
    chats = write_chats(work, 200 if dry else 6000)
    prepared = prepare_chat(work, chats, seq_len, h)
    if prepared is None:
        return "fail", "minilmd prepare --format chat failed"
    q = {**p, "seq_len": seq_len}
    config = h.write_config(work, "sft-bench", q, compile=False, max_steps=10, prepared=str(prepared))
    done = h.minilmd("bench", "sft", "--prepared", str(prepared), "--config", str(config),
                     "--steps", str(p["sft_steps"]))
    h.took("bench sft")
    lines = [" ".join(ln.split()) for ln in done.stdout.splitlines()
             if ln.startswith(("static", "bucketed", "packed", "padfree"))]
    if done.returncode != 0 or not lines:
        return "fail", f"minilmd bench sft: exit {done.returncode}"
    ours = " | ".join(lines)
    h.provisional("ok", f"T={seq_len}, {p['sft_steps']} timed steps a mode: minilmd {ours}; MiniMind: not yet")
    status, theirs = minimind_sft(work, q, chats, dry, h, side, {name: real_tok_s(lines, name)
                                                                   for name in ("bucketed", "padfree")})
    return status, f"T={seq_len}, {p['sft_steps']} timed steps a mode: minilmd {ours}; {theirs}"[:1200]


def write_chats(work: Path, n: int, name: str = "chat.jsonl") -> Path:
    """Conversations of 1-3 turns, replies from a few words to past seq_len: a spread that padding pays for."""
    rng = random.Random(1)
    words = " ".join(json.loads(line)["text"] for line in
                     (work / "text.jsonl").read_text(encoding="utf-8").splitlines()[:200]).split()
    out = work / name
    with out.open("w", encoding="utf-8") as f:
        for _ in range(n):
            turns = []
            for _ in range(rng.randint(1, 3)):
                turns.append({"role": "user", "content": " ".join(rng.choices(words, k=rng.randint(3, 40)))})
                size = int(rng.lognormvariate(3.5, 1.0)) + 2  # median about 35 words, a long tail
                turns.append({"role": "assistant", "content": " ".join(rng.choices(words, k=min(size, 900)))})
            f.write(json.dumps({"conversations": turns}, ensure_ascii=False) + "\n")
    return out


def chatml_tokenizer_dir(work: Path) -> Path:
    """Part 0's tokenizer with a ChatML template, as a tokenizer directory (`prepare --format chat/dpo`)."""
    from minilmd.names import TOKENIZER_CONFIG, TOKENIZER_FILE

    tok_dir = work / "sft-tokenizer"
    shutil.rmtree(tok_dir, ignore_errors=True)
    tok_dir.mkdir()
    (tok_dir / TOKENIZER_FILE).write_bytes((work / "tokenizer.json").read_bytes())
    (tok_dir / TOKENIZER_CONFIG).write_text(json.dumps(
        {"chat_template": CHATML, "bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
         "pad_token": "<|endoftext|>"}), encoding="utf-8")
    return tok_dir


def prepare_chat(work: Path, chats: Path, seq_len: int, h: SimpleNamespace) -> Path | None:
    tok_dir, out = chatml_tokenizer_dir(work), work / "sft-prepared"
    shutil.rmtree(out, ignore_errors=True)
    done = h.minilmd("prepare", str(chats), "--tokenizer", str(tok_dir), "--format", "chat", "--out", str(out),
                     "--seq-len", str(seq_len), "--val-fraction", "0.02", "--workers", "0")
    return out if done.returncode == 0 else None


def real_tok_s(lines: list[str], mode: str) -> float | None:
    """A mode's real tokens/s from bench sft's table ("bucketed", "padfree")."""
    for line in lines:
        if line.startswith(f"{mode} ") and len(line.split()) > 1:
            return float(line.split()[1].replace(",", ""))
    return None


def minimind_command(work: Path, p: dict, chats: Path) -> list[str]:
    m = p["model"]
    return [sys.executable, "train_full_sft.py", "--data_path", str(chats), "--save_dir", str(work / "minimind-sft"),
            "--from_weight", "none", "--hidden_size", str(m["hidden_size"]),
            "--num_hidden_layers", str(m["num_hidden_layers"]), "--max_seq_len", str(p["seq_len"]),
            "--batch_size", str(p["micro_batch_size"]), "--accumulation_steps", "1", "--epochs", "1",
            "--dtype", "bfloat16", "--num_workers", "4", "--log_interval", str(10),
            "--save_interval", "1000000000", "--use_compile", "0", "--from_resume", "0", "--device", "cuda:0"]


def minimind_sft(work: Path, p: dict, chats: Path, dry: bool, h: SimpleNamespace, side,
                 ours: dict[str, float | None]) -> tuple[str, str]:
    """MiniMind's train_full_sft.py on the same chats; `ours`: minilmd's real tok/s of each mode named
    ("bucketed", "padfree": padding-free packed), each's ratio to MiniMind's."""
    import re

    src = side.find_minimind()
    if src is None:
        h.took("minimind absent")
        return "ok", "MiniMind: no source (../shared/minimind absent, or set MINILMD_MINIMIND): not compared"
    script = src / "trainer" / "train_full_sft.py"
    cmd = minimind_command(work, p, chats)
    accepted = set(re.findall(r"add_argument\(\s*[\"'](--[\w-]+)", script.read_text(encoding="utf-8")))
    missing = [flag for flag in cmd if flag.startswith("--") and flag not in accepted]
    if missing:
        return "fail", f"train_full_sft.py has no {', '.join(missing)}"
    h.took("sft command checked")
    if dry:
        return "ok", f"MiniMind (--dry-run: not run; its command checked: cd {src}/trainer && python " \
                     f"{' '.join(cmd[1:])})"
    h.took("minimind sft run")
    seen, iters, tail = side.run_minimind(src, cmd, 10 + p["minimind_timed"], timeout=200)
    timed = [(s, t) for s, t in seen if s >= 10]
    if len(timed) < 2:
        return "fail", f"MiniMind SFT logged {[s for s, _ in seen]} of {iters} steps: {tail}"
    (s0, t0), (s1, t1) = timed[0], timed[-1]
    real = mean_real_chat_tokens(src, chats, p["seq_len"]) * p["micro_batch_size"] * (s1 - s0) / (t1 - t0)
    ratio = "".join(f"; minilmd {mode} / MiniMind {tok_s / real:.2f}x" for mode, tok_s in ours.items() if tok_s)
    return "ok", f"MiniMind train_full_sft.py {real:,.0f} real tok/s (steps {s0}-{s1} of {iters}, eager bf16){ratio}"


def mean_real_chat_tokens(src: Path, chats: Path, seq_len: int) -> float:
    """MiniMind's real tokens per row: each conversation in ChatML under its tokenizer, cut at seq_len."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(src / "model" / "tokenizer.json"))
    texts = ["".join(f"<|im_start|>{t['role']}\n{t['content']}<|im_end|>\n" for t in json.loads(line)["conversations"])
             for line in chats.read_text(encoding="utf-8").splitlines()]
    lengths = [min(len(e.ids), seq_len) for e in tok.encode_batch(texts, add_special_tokens=False)]  # one batch
    return sum(lengths) / max(len(lengths), 1)
