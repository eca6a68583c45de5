"""Using a model trained on a chat corpus: the checkpoint carries the chat template, `minilmd sample --chat` and
`minilmd chat` (a real process fed on stdin) render it with the generation prompt and print only the replies,
and the HF export renders and generates the same in transformers."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from typer.testing import CliRunner

from chat_helpers import a, s, u
from minilmd.checkpoint import validate
from minilmd.cli import app
from minilmd.protocol import EOS_ID
from minilmd.trainer.model.chat import MIN_REPLY_TOKENS, ChatSession, converse, reply_ids
from weights_helpers import save_checkpoint, tiny_model

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def chat_checkpoint(chat_corpus, tmp_path_factory):
    """A checkpoint of a tiny random model whose tokenizer (and, beside it, the template) is the chat corpus's."""
    root, vocab = chat_corpus
    ckpt = save_checkpoint(tmp_path_factory.mktemp("chat-ckpt") / "ckpt", tiny_model(seed=21, vocab_size=vocab),
                           step=1, tokenizer=root / "tokenizer.json")
    return ckpt


def test_the_checkpoint_carries_the_chat_template_of_its_corpus(chat_checkpoint, chat_corpus):
    root, _ = chat_corpus
    manifest = json.loads((chat_checkpoint / "manifest.json").read_text())
    assert "tokenizer_config.json" in manifest["files"]
    assert (chat_checkpoint / "tokenizer_config.json").read_bytes() == (root / "tokenizer_config.json").read_bytes()
    validate(chat_checkpoint)


def test_a_reply_stops_at_im_end_and_a_long_conversation_loses_its_oldest_exchanges(chat_checkpoint):
    assert reply_ids([5, 6, EOS_ID, 7, EOS_ID]) == [5, 6] and reply_ids([5, 6]) == [5, 6]
    session = ChatSession(chat_checkpoint, device="cpu")
    history = [s("系统消息")] + [m for i in range(20) for m in (u(f"第{i}个问题"), a(f"第{i}个回答"))] + [u("最后")]
    ids = session.prompt_ids(history)
    assert len(ids) + MIN_REPLY_TOKENS <= session.limit
    text = session.tok.decode(ids, skip_special_tokens=False)
    assert text.startswith("<|im_start|>system\n系统消息") and "最后" in text and "第0个问题" not in text
    with pytest.raises(ValueError, match="max_position_embeddings"):
        session.prompt_ids([u("长" * 400)])


def test_sample_chat_prints_only_the_reply_and_a_text_model_is_refused(chat_checkpoint, tmp_path, tokenizer):
    session = ChatSession(chat_checkpoint, device="cpu", max_new_tokens=10, temperature=0)
    want = session.reply([s("简短回答"), u("你好")])
    got = CliRunner().invoke(app, ["sample", str(chat_checkpoint), "--chat", "--prompt", "你好", "--system",
                                   "简短回答", "--temperature", "0", "--max-new-tokens", "10", "--device", "cpu"])
    assert got.exit_code == 0, got.output
    assert got.output == want + "\n" and "你好" not in want
    text_ckpt = save_checkpoint(tmp_path / "text", tiny_model(seed=2, vocab_size=session.tok.get_vocab_size()),
                                tokenizer=tokenizer)
    refused = CliRunner().invoke(app, ["sample", str(text_ckpt), "--chat", "--prompt", "x", "--device", "cpu"])
    assert refused.exit_code == 1 and "no chat template" in refused.output


def ends_at_once(vocab_size: int):
    """A tiny model whose every next token is <|im_end|>: the layers add nothing, the final norm keeps only
    dimension 0, where every token's embedding is 1 and <|im_end|>'s 2 (the head is tied to the embedding)."""
    model = tiny_model(seed=3, vocab_size=vocab_size)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.norm.weight.zero_()
        model.model.norm.weight[0] = 1.0
        model.model.embed_tokens.weight[:, 0] = 1.0
        model.model.embed_tokens.weight[EOS_ID, 0] = 2.0
    return model


def test_sample_chat_says_empty_reply_when_the_model_ends_at_once(chat_corpus, tmp_path):
    root, vocab = chat_corpus
    ckpt = save_checkpoint(tmp_path / "eos", ends_at_once(vocab), step=0, tokenizer=root / "tokenizer.json")
    assert ChatSession(ckpt, device="cpu", temperature=0).reply([u("你好")]) == ""
    got = CliRunner().invoke(app, ["sample", str(ckpt), "--chat", "--prompt", "你好", "--temperature", "0",
                                   "--device", "cpu"])
    assert got.exit_code == 0, got.output
    assert got.output == "(empty reply)\n"  # not an empty line that looks like a hang (issue 24)


class ScriptedSession:
    """A ChatSession's `reply` without a model: the given replies in turn, and the conversations it was asked."""

    def __init__(self, replies: list[str]):
        self.replies, self.asked = list(replies), []

    def reply(self, messages: list[dict]) -> str:
        self.asked.append(list(messages))
        return self.replies.pop(0)


def test_a_piped_chat_prints_a_transcript_that_delimits_every_turn():
    import io

    out = io.StringIO()
    session = ScriptedSession(["line one\nline two", "fine"])
    assert converse(session, ["hi\n", "\n", "/reset\n", "and you?\n", "/exit\n", "unread\n"], out,
                    echo=True) == 2  # type: ignore[arg-type]
    assert out.getvalue() == "> hi\nline one\nline two\n\n> /reset\n\n> and you?\nfine\n\n"
    empty = io.StringIO()
    converse(ScriptedSession(["", "\n"]), ["hi\n", "again\n"], empty, echo=True)  # type: ignore[arg-type]
    assert empty.getvalue() == "> hi\n(empty reply)\n\n> again\n\n\n\n"  # white space is the model's own
    assert session.asked[1] == [u("and you?")]  # /reset forgot the first exchange
    typed = io.StringIO()  # at a terminal: the replies alone, the person saw what they typed
    converse(ScriptedSession(["a", "b"]), ["x\n", "y\n"], typed)  # type: ignore[arg-type]
    assert typed.getvalue() == "a\nb\n"


@pytest.mark.slow  # a real `minilmd chat` process (imports torch)
def test_minilmd_chat_answers_each_stdin_line_with_the_conversation_so_far(chat_checkpoint):
    session = ChatSession(chat_checkpoint, device="cpu", max_new_tokens=8, temperature=0)
    history = [s("你是助手")]
    want = []
    for line in ("你好", "how are you?", None, "再来"):
        if line is None:  # /reset
            history = [s("你是助手")]
            continue
        history.append(u(line))
        want.append(session.reply(history))
        history.append(a(want[-1]))
    proc = subprocess.run([sys.executable, "-m", "minilmd.cli", "chat", str(chat_checkpoint), "--system", "你是助手",
                           "--temperature", "0", "--max-new-tokens", "8", "--device", "cpu"],
                          input="你好\nhow are you?\n\n/reset\n再来\n/exit\n没有回答\n", capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    # piped: a transcript, each message echoed after "> ", its reply, an empty line (issue 24)
    questions = ["你好", "how are you?", "/reset", "再来"]
    assert proc.stdout == "".join(f"> {q}\n" + (f"{want.pop(0)}\n" if q != "/reset" else "") + "\n"
                                  for q in questions)
    assert "> " not in proc.stderr  # no prompt on a pipe


@pytest.mark.slow  # transformers' tokenizer and model
def test_hf_export_renders_and_generates_the_same_in_transformers(chat_checkpoint, tmp_path):
    transformers = pytest.importorskip("transformers")
    from minilmd.trainer.model.export import export_hf
    from minilmd.trainer.model.generate import generate

    out = export_hf(chat_checkpoint, tmp_path / "hf")
    assert json.loads((out / "tokenizer_config.json").read_text())["chat_template"]
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    hf_model = transformers.Qwen3ForCausalLM.from_pretrained(out).eval()
    session = ChatSession(chat_checkpoint, device="cpu", temperature=0)
    messages = [s("助手"), u("天气？"), a("好。"), u("明天？")]
    prompt = hf_tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=True,
                                        return_tensors="pt")["input_ids"]
    assert prompt.shape[1] + 12 <= session.limit  # nothing for prompt_ids to drop
    assert prompt[0].tolist() == session.prompt_ids(messages)
    with torch.no_grad():
        theirs = hf_model.generate(prompt, max_new_tokens=12, do_sample=False, eos_token_id=EOS_ID,
                                   pad_token_id=0)[0, prompt.shape[1]:].tolist()
    ours = generate(session.model, prompt[0].tolist(), 12, temperature=0)[0, prompt.shape[1]:].tolist()
    assert reply_ids(theirs) == reply_ids(ours) and len(reply_ids(ours)) >= 3, (theirs, ours)


def test_minimind_export_of_a_chat_model_points_eval_llm_at_full_sft(chat_corpus, tmp_path):
    from minilmd.config import ModelSection
    from minilmd.trainer.model.minimind import MiniMindForCausalLM

    root, _ = chat_corpus
    torch.manual_seed(0)
    model = MiniMindForCausalLM(ModelSection(hidden_size=64, num_hidden_layers=2))  # MiniMind's defaults otherwise
    ckpt = save_checkpoint(tmp_path / "ckpt", model, step=1, tokenizer=root / "tokenizer.json")
    out = CliRunner().invoke(app, ["export", str(ckpt), "--format", "minimind", "--out", str(tmp_path / "m.pth")])
    assert out.exit_code == 0, out.output
    assert "out/full_sft_64.pth" in out.output and "--weight full_sft --hidden_size 64" in out.output
