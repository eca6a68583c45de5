"""What chat prepare and `corpus report` say about a chat corpus (issue 39): the length policy printed is the one
prepare ran under (it printed "(--on-long drop)" while cutting), and `corpus report` on the raw JSONL of a chat
run's config, which counted its lines as text against the model's budget, names `prepare` instead."""
from __future__ import annotations

from typer.testing import CliRunner

from chat_helpers import a, u, write_chat_jsonl
from minilmd.cli import app
from trainer_corpus import write_config


def _prepare(src, tok, out, *extra):
    return CliRunner().invoke(app, ["prepare", str(src), "--tokenizer", str(tok), "--format", "chat", "--out",
                                    str(out), "--val-fraction", "0", "--seq-len", "64", "--workers", "0", *extra])


def test_chat_prepare_names_the_length_policy_it_ran_under(tmp_path, chat_tokenizer):
    convs = [[u(f"问题 {i}"), a(f"回答 {i}")] for i in range(20)]
    convs += [[u("长" * 400), a("回答在截断之后")], [u("问"), a("答" * 400)]]  # past the cut; longer than seq_len
    src = write_chat_jsonl(tmp_path / "c.jsonl", convs)
    tok = chat_tokenizer / "tokenizer.json"
    cut = _prepare(src, tok, tmp_path / "cut")
    assert cut.exit_code == 0, cut.output
    assert "dropped: 1 whose replies all fall past the cut at 64 (--on-long cut)" in cut.output
    assert "--on-long drop" not in cut.output
    drop = _prepare(src, tok, tmp_path / "drop", "--on-long", "drop")
    assert drop.exit_code == 0, drop.output
    assert "dropped: 2 conversations longer than seq_len 64 (--on-long drop)" in drop.output


def test_corpus_report_of_a_chat_jsonl_against_a_run_config_names_prepare(tmp_path, chat_corpus, chat_jsonl):
    config = write_config(tmp_path, chat_corpus)
    runner = CliRunner()
    for budget in (["--config", str(config)], ["--params", "1000000"]):
        r = runner.invoke(app, ["corpus", "report", str(chat_jsonl[0]), *budget, "--workers", "0"])
        assert r.exit_code == 2, r.output  # a bad argument: the raw JSONL where the prepared corpus belongs
        said = " ".join(r.output.split())
        assert "holds chat conversations" in said and "minilmd prepare" in said, r.output
    plain = runner.invoke(app, ["corpus", "report", str(chat_jsonl[0]), "--workers", "0"])  # no budget: as before
    assert plain.exit_code == 0 and "holds chat conversations" not in plain.output, plain.output
    prepared = runner.invoke(app, ["corpus", "report", str(chat_corpus[0]), "--config", str(config), "--workers", "0"])
    assert prepared.exit_code == 0, prepared.output
