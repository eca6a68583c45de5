"""`make demo-dpo`'s DPO stage (daemon/demo_dpo.py, issue 42): its config is a DPO run of the SFT demo's model from
the SFT run, named by its config (the form that waits for it to finish), its pairs are the demo chat corpus's (the
real reply chosen, another dialog's rejected) prepared with `--format dpo` under the SFT stage's tokenizer, and it
reports the val reward accuracy of each evaluation, the last attempt's where a restart logged a step twice. The whole
demo runs by `make demo-dpo`."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from minilmd.config import load_config
from minilmd.corpus.format import open_prepared
from minilmd.daemon import demo_dpo, demo_sft
from minilmd.init_source import predecessor


def test_the_dpo_config_is_a_dpo_stage_of_the_sft_demos_model_from_the_sft_run_by_its_config(tmp_path):
    dpo = tmp_path / "demo-dpo.toml"
    dpo.write_text(demo_dpo.dpo_config(tmp_path, tmp_path / "scratch", 60), encoding="utf-8")
    sft = tmp_path / "demo-sft.toml"
    sft.write_text(demo_sft.SFT_CONFIG.format(root=tmp_path, scratch=tmp_path / "s", epochs=3), encoding="utf-8")
    cfg, base = load_config(dpo), load_config(sft)
    # the SFT run by its config (the form that waits for it to finish), whose final checkpoint is on its remote
    assert cfg.init.from_ == str(sft) and base.run.remote == str(tmp_path / "nfs-sft")
    assert predecessor(cfg.init.from_).root == tmp_path / "nfs-sft"
    assert cfg.model == base.model and cfg.train.seq_len == base.train.seq_len  # the model init.from holds
    assert cfg.data.prepared == str(tmp_path / "dpo-prepared") and cfg.run.remote == str(tmp_path / "nfs-dpo")
    assert cfg.run.scratch == str(tmp_path / "scratch") and cfg.run.dir == str(tmp_path / "dpo-run")
    assert cfg.dpo.beta == 0.1 and cfg.train.lr == 1e-4 and cfg.train.max_steps == 60
    assert cfg.train.eval_every == 20 and cfg.train.micro_batch_size == 8  # three evaluations, 8 pairs a step


def test_the_pairs_are_the_demo_chat_corpus_prepared_as_dpo_under_the_sft_tokenizer(tmp_path, chat_tokenizer):
    shutil.copytree(chat_tokenizer, tmp_path / "sft-tokenizer")  # what demo_sft leaves there: a template with it
    pairs = demo_dpo.prepare_pairs(tmp_path, max_docs=60)
    assert pairs == tmp_path / "dpo" / "dpo_pairs.jsonl"
    lines = [json.loads(line) for line in pairs.read_text("utf-8").splitlines()]
    assert 100 <= len(lines) <= 120  # 60 dialogs of each language, those whose two replies differ
    corpus = open_prepared(tmp_path / "dpo-prepared", verify_hash=True)
    meta = json.loads((tmp_path / "dpo-prepared" / "meta.json").read_text())
    assert corpus.data_format == "dpo" and meta["splits"]["val"]["pairs"] > 0
    assert meta["splits"]["train"]["pairs"] + meta["splits"]["val"]["pairs"] <= len(lines)
    assert corpus.train.n_docs == 2 * meta["splits"]["train"]["pairs"]  # both sides of a pair, together


def test_the_report_says_where_each_start_took_its_reference_and_each_evaluations_reward_accuracy(tmp_path):
    evals = [(20, 0.70, 1), (40, 0.75, 1), (40, 0.80, 2), (60, 0.90, 2)]  # the restart logged step 40 again
    lines = [{"kind": "dpo_reference", "step": 0, "pairs": 2446, "seconds": 47.335, "source": "computed", "time": 0.5},
             {"kind": "train", "step": 1, "loss": 0.6931, "time": 1.0},
             {"kind": "dpo_reference", "step": 20, "pairs": 2446, "seconds": None, "source": "checkpoint",
              "time": 300.5}]
    lines += [{"kind": "eval", "step": step, "val_loss": 0.5, "val_reward_accuracy": acc, "val_reward_margin": 0.25,
               "time": 10.0 * step + attempt} for step, acc, attempt in evals]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines), encoding="utf-8")
    assert demo_dpo.report_lines(tmp_path) == [
        "  reference at the start from step 0: computed over 2,446 pairs in 47.3 s",
        "  reference at the start from step 20: read back from its checkpoint (2,446 pairs)",
        "  step  20: val reward accuracy 0.700, margin 0.2500, val loss 0.5000",
        "  step  40: val reward accuracy 0.800, margin 0.2500, val loss 0.5000",
        "  step  60: val reward accuracy 0.900, margin 0.2500, val loss 0.5000"]


def _sections(module, function: str) -> list[int]:
    """The numbers of the `=== N.` sections `function` of `module` prints (say("N. ...") calls), in source order."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(getattr(module, function)).lstrip())
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "say"]
    calls.sort(key=lambda node: (node.lineno, node.col_offset))
    return [int(call.args[0].value.split(".")[0]) for call in calls]


def test_the_three_demos_number_their_sections_on_from_each_other():
    """Found by a new user: demo-sft and demo-dpo printed two `=== 6.` sections (the demo's plot, then demo-sft's
    first)."""
    from minilmd.daemon import demo

    chain = _sections(demo, "main") + _sections(demo_sft, "main") + _sections(demo_dpo, "dpo_stage")
    assert chain == list(range(1, len(chain) + 1)), chain


def test_each_demo_has_a_directory_of_its_own_and_says_when_it_removes_an_earlier_one(tmp_path, capsys):
    """Found by a new user: `make demo-sft` and `make demo-dpo` removed, without a word, the demo-run/ that `make
    demo` had made (all three defaulted to it)."""
    import inspect

    from minilmd.daemon import demo

    defaults = [inspect.signature(m.main).parameters["root"].default for m in (demo, demo_sft, demo_dpo)]
    assert defaults == ["demo-run", "demo-sft-run", "demo-dpo-run"]
    ignored = (Path(__file__).parents[1] / ".gitignore").read_text().splitlines()
    assert all(f"/{d}/" in ignored for d in defaults), ignored
    root = tmp_path / "demo-sft-run"
    demo.fresh_start(root)  # an earlier demo's directory: its marker in it
    (root / "run").mkdir()
    capsys.readouterr()
    demo.fresh_start(root)
    assert f"demo: removing the earlier {root}/ (" in capsys.readouterr().out
    assert root.is_dir() and not (root / "run").exists()
    demo.fresh_start(tmp_path / "new")  # nothing there before: nothing to say
    assert capsys.readouterr().out == ""
