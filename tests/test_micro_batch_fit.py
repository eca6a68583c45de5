"""A micro-batch that cannot fit in the device's memory (minilmd/plan/footprint.py): refused with the figures
(needed against offered) and the way out (a smaller micro_batch_size, grad_accum keeping the global batch) by `run
--check`, by the launch before it stages anything, and by `minilmd train` on its own at its start, exit 2 each (a
config error: the supervisor never restarts it). Before, train.micro_batch_size = 1e8 passed `--check`, and the
trainer ran for minutes without a step or died in a NumPy allocation traceback. Near the limit the rule is a note
only: the estimate is first order, and the supervisor's OOM retry halves a micro-batch that does not fit."""
from __future__ import annotations

import pytest

from in_process import train_in_process
from minilmd.config import ConfigError, RunConfig, load_config
from minilmd.plan import footprint
from minilmd.plan.footprint import GIB, Offer, fit, judge, micro_batch_need, val_rows
from minilmd.protocol import EXIT_CONFIG, SUPERVISOR_CONFIG
from supervisor_helpers import cli
from trainer_corpus import write_config

HUGE = 10 ** 8


def _said(proc) -> str:
    return " ".join((proc.stdout + proc.stderr).split())


@pytest.mark.slow  # two processes, run --check and run, and train in-process
def test_a_micro_batch_that_cannot_fit_is_refused_by_check_launch_and_train(tmp_path, corpus):
    config = write_config(tmp_path, corpus, name="huge", train={"micro_batch_size": HUGE, "grad_accum": 1})
    said = f"train.micro_batch_size = {HUGE:,} at train.seq_len = 64 needs about "

    check = cli("run", "--check", str(config))
    out = _said(check)
    assert check.returncode == SUPERVISOR_CONFIG and said in out, out
    assert "over 2 x the " in out and "of the host's memory (the CPU is the device): it cannot fit" in out, out
    assert "Set train.micro_batch_size = " in out and f"the same global batch ({HUGE:,} rows a rank per step)" in out

    launch = cli("run", str(config))
    assert launch.returncode == SUPERVISOR_CONFIG and said in _said(launch), _said(launch)
    assert not (load_config(config).scratch_dir / "corpus").exists()  # refused before staging

    alone = train_in_process(config)
    assert alone.returncode == EXIT_CONFIG and said in _said(alone), alone.stderr[-3000:]
    assert "Traceback" not in alone.stderr, alone.stderr[-3000:]


def _tiny() -> RunConfig:
    cfg = RunConfig()
    cfg.override("model.hidden_size", 64)
    cfg.override("model.num_hidden_layers", 2)
    cfg.override("model.num_attention_heads", 4)
    cfg.override("model.num_key_value_heads", 2)
    cfg.override("model.vocab_size", 512)
    cfg.override("train.seq_len", 128)
    return cfg


def test_only_a_clear_impossibility_is_refused_and_near_the_limit_is_a_note():
    cfg = _tiny()
    cfg.override("train.micro_batch_size", 64)
    cfg.override("train.grad_accum", 3)
    need = micro_batch_need(cfg, "text", on_gpu=True)
    assert judge(cfg, need, Offer(need.total * 2, "a card")) == (None, None)
    refused, near = judge(cfg, need, Offer(int(need.total / 1.5), "a card"))
    assert refused is None and near is not None and "more than the" in near, near  # 1.5 x the offer
    offer = Offer(need.total // 4, "a card")
    refused, near = judge(cfg, need, offer)
    assert near is None and refused is not None and "over 2 x the" in refused and "of a card: it cannot fit" in refused
    way = refused.split("Set train.micro_batch_size = ")[1]
    micro, accum = int(way.split(" ")[0]), int(way.split("train.grad_accum = ")[1].split(":")[0])
    assert micro * accum == 64 * 3 and micro < 64, refused  # the global batch kept
    cfg.override("train.micro_batch_size", micro)
    assert micro_batch_need(cfg, "text", on_gpu=True).total <= offer.bytes  # what it suggests fits


def test_the_note_says_over_or_close_and_on_the_cpu_no_cuda_oom_retry_but_the_way_out():
    """user5 #9: 30.2 GiB against a host's 23.5 GiB read "close to", and a CPU run was promised a CUDA OOM retry."""
    cfg = _tiny()
    cfg.override("train.micro_batch_size", 64)
    for on_gpu in (True, False):
        need = micro_batch_need(cfg, "text", on_gpu=on_gpu)
        over = judge(cfg, need, Offer(int(need.total / 1.2), "a device"))[1]
        close = judge(cfg, need, Offer(int(need.total * 1.1), "a device"))[1]
        assert over is not None and "more than the" in over and "close to" not in over, over
        assert close is not None and "close to the" in close and "more than" not in close, close
        for note in (over, close):
            assert ("after a CUDA OOM halves the micro-batch" in note) == on_gpu, note
            assert ("Set train.micro_batch_size = " in note) == (not on_gpu), note  # a CPU run's way out, at once
    assert "the kernel's OOM killer ends the run" in judge(cfg, need, Offer(int(need.total / 1.2), "host"))[1]


def test_a_dpo_micro_batch_counts_two_rows_a_pair_and_the_cpu_counts_its_validation_set():
    cfg = _tiny()
    cfg.override("train.micro_batch_size", 8)
    text, dpo = micro_batch_need(cfg, "text", on_gpu=True), micro_batch_need(cfg, "dpo", on_gpu=True)
    assert "(16 rows x 128 tokens)" in dpo.describe() and "(8 rows x 128 tokens)" in text.describe()
    meta = {"data_format": "text", "splits": {"val": {"tokens": 128 * 10, "documents": 40}}}
    assert val_rows(cfg, meta) == 10  # data.val_windows (64) at most what the val split holds
    on_cpu = micro_batch_need(cfg, "text", on_gpu=False, val_rows=10)
    assert "for the validation rows (10)" in on_cpu.describe()
    chat = {"data_format": "chat", "splits": {"val": {"tokens": 128 * 10, "documents": 40}}}
    assert val_rows(cfg, chat) == 40 and val_rows(cfg, chat, probe=True) == 40  # documents: bucketed, padded
    nothing_fits = judge(cfg, text, Offer(GIB // 1024 ** 2, "a tiny card"))[0]
    assert nothing_fits is not None and "Not even a micro-batch of 1 fits" in nothing_fits


def test_a_validation_set_that_cannot_fit_in_host_memory_is_refused_as_data_val_windows():
    """The val rows are built whole in host memory before the first step, on a GPU run too: data.val_windows is
    bounded by the val split, and by the same rule; no smaller micro-batch would help, so the way out names it."""
    cfg = _tiny()
    cfg.override("data.val_windows", 10 ** 9)
    meta = {"data_format": "text", "splits": {"val": {"tokens": 128 * 10 ** 8, "documents": 10 ** 7}}}
    card, host = Offer(80 * GIB, "a card"), Offer(16 * GIB, "host memory")
    refused, near = fit(cfg, meta, card, on_gpu=True, host=host)
    assert near is None and len(refused) == 1, refused
    assert refused[0].startswith("data.val_windows = 1,000,000,000 builds 100,000,000 validation rows (the val "
                                 "split's) of 128 tokens before the first step: about ") and \
        refused[0].endswith("over 2 x the 16.0 GiB of host memory: it cannot fit. Lower data.val_windows"), refused
    cfg.override("data.val_windows", 64)
    assert fit(cfg, meta, card, on_gpu=True, host=host) == ([], None)


class FakeMemory:
    """psutil.virtual_memory()'s two figures the rule reads: a big host whose memory another user holds now."""

    def __init__(self, total: int, available: int):
        self.total, self.available = total, available


@pytest.mark.slow  # imports the trainer
def test_memory_taken_for_a_while_by_others_is_a_note_at_a_start_never_a_refusal(tmp_path, corpus, monkeypatch,
                                                                                  capsys):
    """A restart while another user briefly holds most of the host's memory: the trainer says so and goes on; the
    refusal (exit 2, final) is judged against the host's total memory, which no other user changes between starts.
    Before, the trainer judged the available memory and ended the run with a config error."""
    import psutil
    import torch

    from minilmd.trainer.loop.entry import refuse_what_cannot_fit
    from minilmd.trainer.loop.train import Dist

    cfg = load_config(write_config(tmp_path, corpus))
    monkeypatch.setattr(psutil, "virtual_memory", lambda: FakeMemory(total=64 * GIB, available=1024 ** 2))
    refuse_what_cannot_fit(cfg, Dist(0, 1, 0, torch.device("cpu")))  # no ConfigError
    said = " ".join(capsys.readouterr().out.split())
    assert "minilmd: note: the run holds about " in said and "more than the 1.0 MiB of host memory available now" \
        in said, said
    monkeypatch.setattr(psutil, "virtual_memory", lambda: FakeMemory(total=1024 ** 2, available=1024 ** 2))
    with pytest.raises(ConfigError, match="of the host's memory .the CPU is the device.: it cannot fit"):
        refuse_what_cannot_fit(cfg, Dist(0, 1, 0, torch.device("cpu")))  # a host this small never fits it


def test_the_rule_judges_the_total_and_notes_the_available():
    cfg = _tiny()
    need = micro_batch_need(cfg, "text", on_gpu=False)
    total, available = Offer(need.total * 4, "the host's memory"), Offer(need.total // 4, "host memory available now")
    refused, note = fit(cfg, None, total, on_gpu=False, available=available)
    assert refused == [] and note is not None and "more than the " in note, note
    assert fit(cfg, None, total, on_gpu=False, available=Offer(need.total * 2, "now")) == ([], None)
    assert footprint.host_offer() is not None and footprint.host_available() is not None


def test_on_a_card_too_small_the_trainer_ends_as_a_cuda_oom_the_supervisor_retries(tmp_path):
    """--check and the launch judge the largest card here and the supervisor leases whichever is free: a smaller card
    at a restart is no fault of the config's. The trainer's refusal there is a CUDA out-of-memory (exit 76,
    fault.json: the OOM retry halves the micro-batch), never a config error ending the run for good (a review saw
    76.9 GiB noted against an 80 GiB card at --check and refused, exit 2, on a 24 GiB one). On the CPU, whose total
    memory a restart does not change, it stays a config error."""
    from minilmd.protocol import EXIT_CUDA_OOM
    from minilmd.trainer.loop import exits
    from minilmd.trainer.loop.entry import too_big

    cfg = RunConfig()
    cfg.run.dir = str(tmp_path)
    said = "micro-batch of 64 rows needs about 76.9 GiB, the card has 24 GiB"
    on_card = too_big([said], cfg, on_gpu=True)
    assert exits.status_of(cfg, on_card, None, 0) == EXIT_CUDA_OOM
    fault = (tmp_path / "fault.json").read_text()
    assert "cuda_oom" in fault and said in fault, fault
    assert isinstance(too_big([said], cfg, on_gpu=False), ConfigError)


def test_at_a_micro_batch_of_1_the_note_says_nothing_halves_it_and_never_that_it_cannot_fit():
    """review 7 #1: at 1, a CPU estimate at 90 % of the host read "Not even a micro-batch of 1 fits" (way_out tried
    only smaller sizes), and a card's estimate over its memory was promised the OOM retry's halving, which has
    nothing to halve at 1 (daemon/child/policy.py)."""
    cfg = _tiny()
    cfg.override("train.micro_batch_size", 1)
    for on_gpu in (True, False):
        need = micro_batch_need(cfg, "text", on_gpu=on_gpu)
        for offer in (Offer(int(need.total / 0.9), "a device"), Offer(int(need.total / 1.5), "a device")):
            refused, note = judge(cfg, need, offer)
            assert refused is None and note is not None, (refused, note)
            assert "nothing halves a micro-batch of 1" in note, note
            assert "halves the micro-batch" not in note and "Not even a micro-batch" not in note, note
            assert "a smaller model, a shorter train.seq_len, or a device with more memory" in note, note
