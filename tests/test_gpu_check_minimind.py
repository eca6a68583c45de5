"""The MiniMind side of scripts/gpu-check (scripts/gpu_check_sidebyside.py, gpu_check_dpo's and gpu_check_sft's
MiniMind runs), each over a stand-in for MiniMind's trainer: the command checked against its flags, the run timed and
stopped before its epoch-end save, its losses read, the watchdog that kills a MiniMind that prints nothing. Apart from
tests/test_gpu_check.py, which runs the script's own harness (its parts, the table, the budget, the dry run): these
call the side-by-side functions in this process and need no dry run."""
from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"

# --- part 6 over a stand-in for MiniMind's trainer ---------------------------------------------------------------
STAND_IN = """
import pathlib, sys, time
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
assert pathlib.Path.cwd().name == "trainer" and args["--max_seq_len"] == "64" and args["--accumulation_steps"] == "1"
for step in range(10, 101, 10):
    print(f"Epoch:[1/1]({step}/100), loss: 5.0000, logits_loss: 5.0000, aux_loss: 0.0000, lr: 0.0005", flush=True)
    time.sleep(0.05)
time.sleep(120)  # the epoch-end save comes long after the last step: a loaded harness still stops it before
pathlib.Path("../reached-the-epoch-end").write_text("it would save into ../checkpoints now")
"""


def test_the_side_by_side_times_minimind_and_stops_it_before_its_epoch_end(tmp_path, monkeypatch):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    src, work = tmp_path / "minimind", tmp_path / "work"
    (src / "trainer").mkdir(parents=True)
    (src / "model").mkdir()
    flags = ["data_path", "save_dir", "hidden_size", "num_hidden_layers", "max_seq_len", "batch_size",
             "accumulation_steps", "epochs", "dtype", "num_workers", "log_interval", "save_interval", "use_compile",
             "from_resume", "device"]
    (src / "trainer" / "train_pretrain.py").write_text(
        "".join(f"# parser.add_argument('--{f}')\n" for f in flags) + STAND_IN)
    (src / "model" / "model_minimind.py").write_text(
        'self.num_attention_heads = kwargs.get("num_attention_heads", 8)\n'
        'self.num_key_value_heads = kwargs.get("num_key_value_heads", 4)\n')
    tok = Tokenizer(WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    tok.save(str(src / "model" / "tokenizer.json"))
    (work / "eager" / "run").mkdir(parents=True)
    (work / "text.jsonl").write_text(json.dumps({"text": "a " * 10}) + "\n" + json.dumps({"text": "a " * 200}) + "\n")
    (work / "eager" / "run" / "metrics.jsonl").write_text(
        "".join(json.dumps({"kind": "train", "step": s, "tok_s": 1000.0 * s}) + "\n" for s in range(1, 8)))
    monkeypatch.setenv("MINILMD_MINIMIND", str(src))
    sys.path.insert(0, str(SCRIPTS))
    try:
        import gpu_check_sidebyside as side
    finally:
        sys.path.remove(str(SCRIPTS))
    monkeypatch.setattr(side, "NEEDS", "json")
    p = {"model": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4},
         "seq_len": 64, "micro_batch_size": 4, "warm_steps": 2, "timed_steps": 40}
    took: list[str] = []

    def read_metrics(run_dir, kind):
        return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]

    status, figures = side.side_by_side(work, p, False, took.append, read_metrics)
    assert status == "ok", figures
    assert took == ["command checked", "minimind run"]
    # real tokens per row: 12 (BOS + 10 + EOS) and 64 (cut at seq_len): 38 a row, 152 a step of 4 rows
    assert side.mean_real_tokens(src, work / "text.jsonl", 64) == 38
    assert "minilmd 5,000 real tok/s (part 4 eager)" in figures and "steps 10-50 of 100" in figures
    assert "minilmd/MiniMind " in figures and "with its padding" in figures
    assert not (src / "reached-the-epoch-end").exists()  # stopped at step 50, long before step 100


# --- part 9 over a stand-in for MiniMind's train_dpo.py --------------------------------------------------------------
DPO_STAND_IN = """
import pathlib, sys, time
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
here = pathlib.Path.cwd()
assert here.name == "trainer" and (here.parent / "out" / "full_sft_64.pth").is_file(), here  # its ../out, in WORK
assert args["--beta"] == "0.15" and args["--batch_size"] == "2" and args["--log_interval"] == "1"
for step in range(1, 101):
    print(f"Epoch:[1/1]({step}/100), loss: 0.6931, dpo_loss: 0.6931, aux_loss: 0.0000, learning_rate: 0.00000004, "
          "epoch_time: 0.000min", flush=True)
    time.sleep(0.01)
time.sleep(120)  # the epoch-end save comes long after the last step: a loaded harness still stops it before
pathlib.Path("../reached-the-epoch-end").write_text("it would save into ../checkpoints now")
"""


def test_the_dpo_side_by_side_runs_minimind_in_a_copy_and_reads_its_first_loss(tmp_path, monkeypatch):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    src, work = tmp_path / "minimind", tmp_path / "work"
    for folder in ("trainer", "model", "dataset"):
        (src / folder).mkdir(parents=True)
    flags = ["data_path", "save_dir", "save_weight", "from_weight", "hidden_size", "num_hidden_layers", "max_seq_len",
             "batch_size", "learning_rate", "beta", "accumulation_steps", "epochs", "dtype", "num_workers",
             "log_interval", "save_interval", "use_compile", "from_resume", "device"]
    (src / "trainer" / "train_dpo.py").write_text("".join(f"# parser.add_argument('--{f}')\n" for f in flags)
                                                  + DPO_STAND_IN)
    tok = Tokenizer(WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    tok.save(str(src / "model" / "tokenizer.json"))
    (work / "minimind-dpo" / "out").mkdir(parents=True)
    (work / "minimind-dpo" / "out" / "full_sft_64.pth").write_bytes(b"weights")
    pair = {"chosen": [{"role": "user", "content": "a a"}, {"role": "assistant", "content": "a a a"}],
            "rejected": [{"role": "user", "content": "a a"}, {"role": "assistant", "content": "a"}]}
    pairs = work / "pairs.jsonl"
    pairs.write_text(json.dumps(pair) + "\n")
    sys.path.insert(0, str(SCRIPTS))
    try:
        import gpu_check_dpo as dpo
        import gpu_check_sidebyside as side
    finally:
        sys.path.remove(str(SCRIPTS))
    monkeypatch.setattr(side, "NEEDS", "json")
    q = {"model": {"hidden_size": 64, "num_hidden_layers": 2}, "seq_len": 64, "micro_batch_size": 2,
         "warm_steps": 10, "timed_steps": 30}
    took: list[str] = []
    h = SimpleNamespace(took=took.append)
    status, figures = dpo.minimind_dpo(work, src, q, pairs, False, h, side, {"tok_s": 1000.0}, time.monotonic() + 300)
    assert status == "ok", figures
    assert took == ["dpo command checked", "minimind dpo run"]
    assert "MiniMind train_dpo.py step 1 loss 0.6931, " in figures and "steps 10-40 of 100" in figures
    assert "minilmd/MiniMind " in figures and "with its padding" in figures
    # each side's tokens ("<|im_start|>" etc. are unknown words here): real tokens per pair as it renders them
    assert dpo.mean_real_pair_tokens(src, pairs, 64) > 0
    assert not (work / "minimind-dpo" / "reached-the-epoch-end").exists()  # stopped at step 40 of 100
    assert sorted(p.name for p in src.iterdir()) == ["dataset", "model", "trainer"]  # the source: nothing written
    assert (work / "minimind-dpo" / "trainer" / "train_dpo.py").read_text() == \
        (src / "trainer" / "train_dpo.py").read_text()  # run unmodified
    # too little of the part's time left: MiniMind is not started, and the row says so
    status, figures = dpo.minimind_dpo(work, src, q, pairs, False, h, side, {"tok_s": 1000.0}, time.monotonic() + 30)
    assert status == "skip" and figures.startswith("MiniMind train_dpo.py not run: ") and "under 40s" in figures


# --- MiniMind that never prints: the watchdog ---------------------------------------------------------------
SILENT = """
import os, pathlib, subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])  # a DataLoader worker: its group
pathlib.Path("../pids").write_text(f"{os.getpid()} {worker.pid}")
time.sleep(300)  # never prints a line
"""


@pytest.mark.slow
def test_minimind_that_never_prints_is_killed_with_its_group_at_the_parts_time(tmp_path):
    import threading

    from minilmd import procs
    from waiting import wait_until

    sys.path.insert(0, str(SCRIPTS))
    try:
        import gpu_check_sidebyside as side
    finally:
        sys.path.remove(str(SCRIPTS))
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "silent.py").write_text(SILENT)
    got: list = []
    runner = threading.Thread(target=lambda: got.append(side.run_minimind(
        tmp_path, [sys.executable, "silent.py"], stop_at=10, timeout=5)), daemon=True)
    runner.start()
    runner.join(240)  # a bound for a hang only: the watchdog fires at 5 s
    assert not runner.is_alive(), "run_minimind still waits on a MiniMind that prints nothing"
    seen, iters, tail = got[0]
    assert seen == [] and iters == 0 and tail.endswith("[killed by the watchdog after 5s]"), tail
    pids = list(map(int, (tmp_path / "pids").read_text().split()))
    # its worker too, the whole group: killed, and gone once init has reaped it (not at once on a busy machine)
    wait_until(lambda: all(procs.process_start_ticks(pid) is None for pid in pids), 60, "MiniMind's group gone")


# --- part 8's MiniMind over a stand-in for train_full_sft.py: both of minilmd's SFT modes against it -------------
SFT_STAND_IN = """
import sys, time
for step in range(10, 101, 10):
    print(f"Epoch:[1/1]({step}/100), loss: 5.0000, logits_loss: 5.0000, aux_loss: 0.0000, lr: 0.0005", flush=True)
    time.sleep(0.05)
time.sleep(120)
"""


def test_the_sft_side_by_side_gives_bucketed_and_padding_free_packed_over_minimind(tmp_path, monkeypatch):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    src = tmp_path / "minimind"
    (src / "trainer").mkdir(parents=True)
    (src / "model").mkdir()
    sys.path.insert(0, str(SCRIPTS))
    try:
        import gpu_check_sft as sft
        import gpu_check_sidebyside as side
    finally:
        sys.path.remove(str(SCRIPTS))
    p = {"model": {"hidden_size": 64, "num_hidden_layers": 2}, "seq_len": 64, "micro_batch_size": 4,
         "minimind_timed": 20}
    flags = sorted({f for f in sft.minimind_command(tmp_path, p, tmp_path / "chat.jsonl") if f.startswith("--")})
    (src / "trainer" / "train_pretrain.py").write_text("")  # how find_minimind knows a MiniMind
    (src / "trainer" / "train_full_sft.py").write_text(
        "".join(f"# parser.add_argument('{f}')\n" for f in flags) + SFT_STAND_IN)
    tok = Tokenizer(WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    tok.save(str(src / "model" / "tokenizer.json"))
    chats = tmp_path / "chat.jsonl"
    chats.write_text(json.dumps({"conversations": [{"role": "user", "content": "a a"},
                                                   {"role": "assistant", "content": "a a a"}]}) + "\n")
    monkeypatch.setenv("MINILMD_MINIMIND", str(src))
    took: list[str] = []
    status, figures = sft.minimind_sft(tmp_path, p, chats, False, SimpleNamespace(took=took.append), side,
                                       {"bucketed": 100000.0, "padfree": 200000.0})
    assert status == "ok", figures
    assert took == ["sft command checked", "minimind sft run"]
    ratios = re.findall(r"minilmd (bucketed|padfree) / MiniMind ([\d.]+)x", figures)
    assert [mode for mode, _ in ratios] == ["bucketed", "padfree"], figures
    assert float(ratios[1][1]) == pytest.approx(2 * float(ratios[0][1]), rel=0.02)
