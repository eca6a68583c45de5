"""The update share `run --check` prints, against hand counts (issue 24): a chat run's rows are conversations
(bucketed by the SFT default, which the trainer applies; the last partial bucket left out), a packed run's are
windows; the base's are the rows its checkpoint records; a LoRA run is not told to use LoRA. Torch-free: a corpus is
only its meta.json here, a checkpoint only its manifest.json and trainer_state.json."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from minilmd.config import load_config
from minilmd.corpus_meta import data_fingerprint
from minilmd.plan.budget import planned
from minilmd.plan.update_share import share_lines
from trainer_corpus import write_config

# The seed's style SFT (section 3): 87,940 conversations x 5 epochs on top of a base SFT of 1,809,958 updates.
STYLE_CONVERSATIONS, STYLE_TOKENS, BASE_ROWS = 87_940, 10_552_800, 1_809_958


def fake_corpus(root: Path, data_format: str, documents: int, tokens: int) -> Path:
    root.mkdir(parents=True)
    meta = {"format": "minilmd-prepared", "version": 2 if data_format == "chat" else 1, "data_format": data_format,
            "vocab_size": 512, "splits": {"train": {"documents": documents, "tokens": tokens},
                                          "val": {"documents": 10, "tokens": 1000}}}
    (root / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    return root


def fake_checkpoint(root: Path, state: dict) -> Path:
    root.mkdir(parents=True)
    (root / "manifest.json").write_text(json.dumps({"step": state.get("step", 1), "files": {}}), encoding="utf-8")
    (root / "trainer_state.json").write_text(json.dumps(state), encoding="utf-8")
    return root


def style_config(tmp_path: Path, data_format: str, base: Path | None = None, **sections):
    corpus = fake_corpus(tmp_path / f"corpus-{data_format}", data_format, STYLE_CONVERSATIONS, STYLE_TOKENS)
    train = {"seq_len": 768, "micro_batch_size": 16, "grad_accum": 1, "max_steps": 0, "max_epochs": 5}
    train.update(sections.pop("train", {}))
    init = {"init": {"from": str(base)}} if base else {}
    return load_config(write_config(tmp_path, (corpus, 512), name=f"style-{data_format}", train=train,
                                    model={"max_position_embeddings": 768}, **init, **sections))


def test_a_chat_run_counts_conversations_in_buckets_as_the_trainer_will(tmp_path):
    # bucketed (the SFT default, not written in the config): 87,940 - 87,940 % 16 = 87,936 rows an epoch;
    # 5 epochs = 439,680 rows = 27,480 steps of 16
    assert planned(style_config(tmp_path, "chat")).rows == 439_680


def test_a_chat_run_in_padded_or_packed_mode_counts_as_that_mode(tmp_path):
    padded = style_config(tmp_path / "p", "chat", data={"mode": "padded"})
    # every conversation: 5 x 87,940 = 439,700 rows, ceil(439,700 / 16) = 27,482 steps of 16
    assert planned(padded).rows == 27_482 * 16
    packed = style_config(tmp_path / "k", "chat", data={"mode": "packed"})
    # windows: (10,552,800 - 767) // 768 = 13,739 an epoch; ceil(5 x 13,739 / 16) = 4,294 steps of 16
    assert planned(packed).rows == 4_294 * 16


def test_a_text_run_stays_packed(tmp_path):
    assert planned(style_config(tmp_path, "text")).rows == 4_294 * 16


def test_the_seeds_style_sft_is_the_24_percent_warning(tmp_path):
    base = fake_checkpoint(tmp_path / "base" / "step-00113122", {"step": 113_122, "rows_seen": BASE_ROWS})
    lines = share_lines(style_config(tmp_path, "chat", base=base))
    assert len(lines) == 1 and lines[0].startswith(
        "WARNING: update share: this run trains 439,680 sample updates (conversations: 439,680 rows, each one "
        f"conversation, in buckets of like length), 24.3 % of the 1,809,958 rows its base {base} trained"), lines
    assert "use [lora]" in lines[0]


def _base_of(tmp_path: Path, data_format: str, documents: int, epochs: int, init_from: str = "") -> tuple[Path, dict]:
    """A base checkpoint (an epoch budget, run to its end) whose recorded config names a corpus whose staged copy is
    gone, as a trainer under a supervisor records it; (its path, the corpus summary it records)."""
    gone = fake_corpus(tmp_path / f"gone-{data_format}", data_format, documents, documents * 120)
    cfg = load_config(write_config(tmp_path, (gone, 512), name=f"base-{data_format}", init={"from": init_from},
                                   train={"seq_len": 768, "micro_batch_size": 16, "grad_accum": 1, "max_steps": 0,
                                          "max_epochs": epochs}, model={"max_position_embeddings": 768}))
    rows = planned(cfg).rows
    summary = json.loads((gone / "meta.json").read_text(encoding="utf-8"))
    (gone / "meta.json").unlink()
    state = {"step": rows // 16, "rows_seen": rows, "config": cfg.to_dict(), "corpus": summary}
    return fake_checkpoint(tmp_path / f"base-{data_format}" / "step-00000001", state), summary


def test_a_first_sft_of_a_base_trained_from_scratch_is_the_recipe_not_a_warning(tmp_path):
    """The seed's own MiniMind recipe: its SFT took 1,809,958 of the 3,803,325 documents its pretraining trained
    (48 %). The 24 % warning is of a style SFT on top of an SFT; a first SFT of a pretrained base says its share
    without one, counted in the documents the base's checkpoint records though its staged corpus is gone."""
    base, _ = _base_of(tmp_path, "text", 1_267_775, 3)
    lines = share_lines(style_config(tmp_path, "chat", base=base))
    assert len(lines) == 1 and lines[0].startswith("update share: this run trains 439,680 sample updates"), lines
    assert "of its base" in lines[0] and "rows its base" not in lines[0], lines  # documents, not rows
    assert "its base was trained from scratch" in lines[0] and "WARNING" not in lines[0], lines


def test_a_fine_tune_of_a_fine_tune_is_warned_on_its_own_corpus_in_those_words(tmp_path):
    base, summary = _base_of(tmp_path, "chat", 20_000, 1, init_from="/runs/pretrain")
    cfg = style_config(tmp_path, "chat", base=base)
    fingerprint = data_fingerprint(json.loads((Path(cfg.data.prepared) / "meta.json").read_text(encoding="utf-8")))
    lines = share_lines(cfg)
    assert len(lines) == 1 and lines[0].startswith("WARNING: update share:") and "on other data" in lines[0], lines
    state = json.loads((base / "trainer_state.json").read_text(encoding="utf-8"))
    (base / "trainer_state.json").write_text(json.dumps({**state, "fingerprints": {"data": fingerprint}}))
    lines = share_lines(cfg)
    assert "on its base's own corpus" in lines[0] and "other data" not in lines[0], lines


def test_a_lora_run_is_not_told_to_use_lora(tmp_path):
    base = fake_checkpoint(tmp_path / "base" / "step-00113122", {"step": 113_122, "rows_seen": BASE_ROWS})
    lines = share_lines(style_config(tmp_path, "chat", base=base, lora={"rank": 8}))
    assert len(lines) == 1 and "24.3 % of the 1,809,958 rows" in lines[0], lines
    assert "[lora]" not in lines[0] and "lora.rank" in lines[0]


def test_a_base_without_rows_seen_counts_its_steps_times_its_global_batch(tmp_path):
    base = fake_checkpoint(tmp_path / "base" / "step-00000100", {"step": 100, "global_batch": 32})
    lines = share_lines(style_config(tmp_path, "chat", base=base, train={"max_epochs": 0, "max_steps": 10}))
    assert lines == ["update share: this run trains 160 sample updates (conversations: 160 rows, each one "
                     "conversation, "
                     f"in buckets of like length), 5.0 % of the 3,200 rows its base {base} trained"]


# --- `corpus report --config`: the epochs a budget means, rows counted as the trainer will (issue 24) -------------
def report_budget(tmp_path: Path, data_format: str, **train):
    from minilmd.corpus.analysis.report import format_report
    from minilmd.plan.model_budget import model_budget

    # the test chat corpus's shape (tests/conftest.py chat_corpus): 735 train conversations of 37,485 tokens
    corpus = fake_corpus(tmp_path / f"corpus-{data_format}", data_format, 735, 37_485)
    meta = json.loads((corpus / "meta.json").read_text(encoding="utf-8"))
    config = write_config(tmp_path, (corpus, 512), name=f"r-{data_format}",
                          train={"seq_len": 128, "micro_batch_size": 8, "grad_accum": 1, **train})
    m = model_budget(37_485, params=None, config=str(config), budget_tokens=None, meta=meta)
    text = format_report({"corpus": str(corpus), "kind": "prepared", "documents": 767, "length_unit": "tokens",
                          "tokens": 39_000, "bad_lines": 0, "blank_lines": 0, "lengths": {},
                          "scripts": {"dominant": {}, "contains": {}},
                          "duplicates": {"copies": 0, "distinct_repeated": 0, "largest_group": 0},
                          "train_tokens": 37_485, "model": m})
    return m, text


def test_a_chat_budget_in_steps_counts_conversations_not_windows(tmp_path):
    m, text = report_budget(tmp_path, "chat", max_steps=30)
    # 30 steps x 8 = 240 conversations of the 735 - 735 % 8 = 728 an epoch: 0.33 epochs (not 30 x 8 x 128 tokens
    # = 30,720 = 0.82 epochs of 37,485)
    assert m["rows"] == 240 and m["rows_per_epoch"] == 728 and m["epochs"] == pytest.approx(240 / 728)
    assert ("budget 12.4k tokens (240 rows of 728 an epoch, each one conversation, in buckets of like length: 240 "
            "conversations) = 0.33 epochs of train") in text, text


def test_an_epoch_budget_shows_its_epochs(tmp_path):
    m, text = report_budget(tmp_path, "chat", max_steps=0, max_epochs=2)
    assert m["rows"] == 2 * 728 and m["epochs"] == pytest.approx(2.0), m  # ceil(2 x 728 / 8) = 182 steps of 8
    assert "= 2 epochs of train" in text, text


def test_a_text_budget_stays_in_windows(tmp_path):
    m, _ = report_budget(tmp_path, "text", max_steps=30)
    assert m["budget_tokens"] == 30 * 8 * 128 and m["epochs"] == pytest.approx(30 * 8 * 128 / 37_485)


# --- padding-free SFT: the conversations trained, whatever a row holds (issue 43) ---------------------------------
def conversation_corpus(root: Path, lengths: list[int]) -> Path:
    """A chat corpus's meta.json, train's doc_lengths.npy and a tokens.bin of the size meta.json gives: what the count
    of padding-free SFT reads."""
    import numpy as np

    fake_corpus(root, "chat", len(lengths), sum(lengths))
    (root / "train").mkdir()
    np.save(root / "train" / "doc_lengths.npy", np.array(lengths, dtype=np.int32))
    with open(root / "train" / "tokens.bin", "wb") as f:  # sparse: its size is what the count checks meta.json by
        f.truncate(2 * sum(lengths))
    return root


def test_a_two_epoch_packed_chat_fine_tune_announces_its_conversations(tmp_path):
    """9,090 conversations of 170 tokens pack 3 to a row of 512: 3,030 rows an epoch; 2 epochs = 6,060 rows =
    18,180 conversations trained (the windows' count, 3,017 an epoch, said "6,036 sample updates")."""
    corpus = conversation_corpus(tmp_path / "corpus", [170] * 9_090)
    base = fake_checkpoint(tmp_path / "base" / "step-00001000", {"step": 1_000, "rows_seen": 181_800})
    cfg = load_config(write_config(tmp_path, (corpus, 512), name="sft", init={"from": str(base)},
                                   data={"mode": "packed", "doc_mask": True},
                                   train={"seq_len": 512, "micro_batch_size": 4, "grad_accum": 1, "max_steps": 0,
                                          "max_epochs": 2},
                                   model={"max_position_embeddings": 512}))
    plan = planned(cfg)
    assert plan is not None and plan.epoch is not None
    assert (plan.epoch.rows, plan.rows, plan.samples) == (3_030, 6_060, 18_180)
    assert share_lines(cfg) == [
        "update share: this run trains 18,180 sample updates (conversations: 6,060 rows, each whole conversations "
        f"packed into 512 tokens, 3.0 a row), 10.0 % of the 181,800 rows its base {base} trained"]


def test_a_base_is_counted_in_documents_from_its_own_config_and_corpus(tmp_path):
    """A base pretrained in packed windows: its rows_seen converted to the documents they trained (epochs x
    documents), from the config its checkpoint records and the corpus that names."""
    pretrain = fake_corpus(tmp_path / "pretrain", "text", 1_000, 512_000)  # 999 windows of 512 an epoch
    base_cfg = load_config(write_config(tmp_path, (pretrain, 512), name="pre", train={"seq_len": 512},
                                        model={"max_position_embeddings": 512}))
    base = fake_checkpoint(tmp_path / "base" / "step-00000100",
                           {"step": 100, "rows_seen": 1_998, "config": base_cfg.to_dict()})
    lines = share_lines(style_config(tmp_path, "chat", base=base, train={"max_epochs": 0, "max_steps": 10}))
    assert lines == ["update share: this run trains 160 sample updates (conversations: 160 rows, each one "
                     "conversation, "
                     f"in buckets of like length), 8.0 % of the 2,000 of its base {base}"], lines


def test_corpus_report_counts_packed_conversations_as_the_sampler_does(tmp_path):
    """The same 2-epoch padding-free SFT through `corpus report --config`: the epoch's rows from the conversations'
    lengths (3,030, where the windows' formula gives 3,017), the conversations they hold."""
    from minilmd.corpus.analysis.report import format_report
    from minilmd.plan.model_budget import report_model

    corpus = conversation_corpus(tmp_path / "corpus", [170] * 9_090)
    config = write_config(tmp_path, (corpus, 512), name="sft", data={"mode": "packed", "doc_mask": True},
                          train={"seq_len": 512, "micro_batch_size": 4, "grad_accum": 1, "max_steps": 0,
                                 "max_epochs": 2}, model={"max_position_embeddings": 512})
    meta = json.loads((corpus / "meta.json").read_text(encoding="utf-8"))
    r = {"corpus": str(corpus), "kind": "prepared", "documents": 9_100, "length_unit": "tokens",
         "tokens": 1_546_000, "bad_lines": 0, "blank_lines": 0, "lengths": {},
         "scripts": {"dominant": {}, "contains": {}},
         "duplicates": {"copies": 0, "distinct_repeated": 0, "largest_group": 0}, "data_format": "chat",
         "splits": meta["splits"], "train_tokens": 9_090 * 170}
    m = report_model(r, params=None, config=str(config), budget_tokens=None)
    assert (m["rows"], m["rows_per_epoch"], m["samples"], m["epochs"]) == (6_060, 3_030, 18_180, 2.0), m
    assert ("(6,060 rows of 3,030 an epoch, each whole conversations packed into 512 tokens, 3.0 a row: 18,180 "
            "conversations) = 2 epochs of train") in format_report({**r, "model": m})


def test_a_dpo_run_counts_pairs_against_its_sft_bases_conversations_and_names_beta(tmp_path):
    """A DPO stage (issue 42): its sample updates are pairs (3,000 of 6,000 sides: one epoch, the last partial
    bucket of 8 left out), against the conversations its SFT base trained (20,000 rows of a bucketed chat corpus);
    15 % is above the warning, whose remedies are DPO's (dpo.beta, the price of the distance from the reference)."""
    sft = fake_corpus(tmp_path / "sft", "chat", 10_000, 1_000_000)
    sft_cfg = load_config(write_config(tmp_path, (sft, 512), name="sft", data={"mode": "bucketed"},
                                       train={"seq_len": 512, "max_steps": 0, "max_epochs": 2},
                                       model={"max_position_embeddings": 512}))
    base = fake_checkpoint(tmp_path / "base" / "step-00001250",
                           {"step": 1_250, "rows_seen": 20_000, "config": sft_cfg.to_dict()})
    pairs = fake_corpus(tmp_path / "pairs", "dpo", 2 * 3_004, 600_000)
    cfg = load_config(write_config(tmp_path, (pairs, 512), name="dpo", init={"from": str(base)},
                                   train={"seq_len": 512, "micro_batch_size": 8, "grad_accum": 1, "max_steps": 0,
                                          "max_epochs": 1}, model={"max_position_embeddings": 512}))
    lines = share_lines(cfg)
    assert len(lines) == 1 and lines[0].startswith(
        "WARNING: update share: this run trains 3,000 sample updates (pairs: 3,000 rows, each one pair (its chosen "
        f"and rejected sides), in buckets of like length), 15.0 % of the 20,000 of its base {base}"), lines
    assert "raise dpo.beta" in lines[0] and "use [lora]" in lines[0]


# --- a resumed run: its counts after what its checkpoint trained, as the trainer's (review11b F4) -----------------
def test_a_resumed_runs_update_share_counts_the_rows_its_checkpoint_trained(tmp_path):
    """1,000 steps of 8 conversations trained, then max_steps = 2,000 at micro-batch 16: 8,000 + 1,000 x 16 = 24,000
    rows (the trainer's count, plan/budget.py Planned.rows after `done`), not 2,000 x 16 = 32,000 (a fresh start's
    count at today's batch, what the share said before)."""
    from minilmd.plan.trainer_state import Trained

    base = fake_checkpoint(tmp_path / "base" / "step-00001000", {"step": 1_000, "rows_seen": 2_400_000})
    cfg = style_config(tmp_path, "chat", base=base, train={"max_epochs": 0, "max_steps": 2_000})
    done = Trained(step=1_000, rows=8_000, positions=8_000 * 768)
    assert share_lines(cfg)[0].startswith("update share: this run trains 32,000 sample updates")  # a fresh start
    lines = share_lines(cfg, done)
    assert lines[0].startswith("update share: this run trains 24,000 sample updates (conversations: 24,000 rows, "
                               "each one conversation"), lines
    assert "1.0 % of the 2,400,000 rows its base" in lines[0], lines


def test_corpus_report_config_counts_after_the_checkpoint_in_the_runs_scratch(tmp_path):
    """`corpus report --config` of a run that trained 10 steps of 4 windows and now says micro-batch 8: its 30 steps
    are 40 + 20 x 8 = 200 windows, 25,600 token positions, as the trainer will count them (240 and 30,720 before)."""
    from minilmd.plan.model_budget import model_budget

    corpus = fake_corpus(tmp_path / "corpus", "text", 735, 37_485)
    meta = json.loads((corpus / "meta.json").read_text(encoding="utf-8"))
    config = write_config(tmp_path, (corpus, 512), name="resumed",
                          train={"seq_len": 128, "micro_batch_size": 8, "grad_accum": 1, "max_steps": 30})
    fresh = model_budget(37_485, params=None, config=str(config), budget_tokens=None, meta=meta)
    assert (fresh["rows"], fresh["budget_tokens"]) == (240, 30_720), fresh
    fake_checkpoint(load_config(config).checkpoint_dir / "step-00000010",
                    {"step": 10, "rows_seen": 40, "positions_seen": 40 * 128, "global_batch": 4,
                     "config": {"train": {"seq_len": 128, "micro_batch_size": 4}}})
    resumed = model_budget(37_485, params=None, config=str(config), budget_tokens=None, meta=meta)
    assert (resumed["rows"], resumed["budget_tokens"]) == (200, 25_600), resumed
