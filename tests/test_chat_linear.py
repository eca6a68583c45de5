"""Chat prepare linear in a conversation's length, its template bound on the template's own CPU time (issue 39): a
conversation shape not seen before used to be rendered the prefix way (once per assistant turn) to learn its
layout, the first conversations of each block again as the proof, all of it under a 2-second wall-clock alarm, so
that a valid 400-turn conversation became a bad line (or "the template is the problem", exit 65) on a loaded
machine. Now a long shape's layout is read off one rendering (checked the prefix way at three turns), the proof
takes only short conversations, and the bound counts the rendering thread's CPU time, scaled to the messages
rendered. The output stays byte for byte the prefix way's (the definition)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from chat_helpers import MINIMIND_DIR, a, chat_templates, outcome, s, u, write_chat_jsonl
from minilmd.cli import app
from minilmd.corpus.chat import ChatTemplate, TurnError
from minilmd.corpus.chat_budget import TemplateLimits
from minilmd.corpus.chat_spans import BlockSpans, Layouts

OUTPUT_FILES = ("train/tokens.bin", "train/loss_mask.bin", "train/doc_lengths.npy",
                "val/tokens.bin", "val/loss_mask.bin", "val/doc_lengths.npy")


def turns(n: int, tag: str = "") -> list[dict]:
    return [m for i in range(n) for m in (u(f"问题{tag} {i}"), a(f"回答{tag} {i}，好的。"))]


def long_conversations() -> list[list[dict]]:
    """Long conversations of several shapes (a system message, an empty reply, a thought, an empty system)."""
    thought = turns(60, "t")
    thought[41] = {"role": "assistant", "content": "想好了", "reasoning_content": "先想一想"}
    empty = turns(90, "e")
    empty[7] = a("")
    return [[s("你是助手")] + turns(120), thought, empty, [s("")] + turns(70, "s"), turns(45, "x")]


class Counting(ChatTemplate):
    """A ChatTemplate that counts the messages it renders (the template's work, not a clock)."""

    def __post_init__(self):
        super().__post_init__()
        self.rendered = 0

    def __setstate__(self, state):
        super().__setstate__(state)
        self.rendered = 0

    def _render(self, messages, add_generation_prompt=False, conversation=None):
        self.rendered += len(messages)
        return super()._render(messages, add_generation_prompt, conversation)


@pytest.mark.slow  # the definition renders each long conversation once per turn
@pytest.mark.parametrize("name", ["test", "synthetic", "minimind"])
def test_long_conversations_take_work_linear_in_their_length_with_the_prefix_way_spans(name, chat_tokenizer):
    templates = chat_templates(chat_tokenizer)
    if name not in templates:
        pytest.skip(f"MiniMind's tokenizer is not at {MINIMIND_DIR} (set MINIMIND_TOKENIZER_DIR)")
    template = templates[name][0]
    definition = ChatTemplate(template.source, template.special_tokens, TemplateLimits(seconds=600))
    counting = Counting(definition.source, definition.special_tokens)
    finder = BlockSpans(counting, Layouts(counting))  # a fresh block: its proof still to make
    longs = long_conversations()
    # The first long shapes read off one rendering of a probe; the later ones predicted from the short shapes.
    convs = longs[:2] + [turns(2), [s("sys")] + turns(3), [s("")] + turns(1), turns(1, "t")] + longs[2:] + \
        [lc[:-2] for lc in longs]
    for messages in convs:
        assert outcome(finder.targets, messages) == outcome(definition.targets, messages), len(messages)
    assert not finder.mismatch
    assert finder.layouts is not None and finder.layouts.prelude, "short shapes proved a prediction"
    messages = sum(map(len, convs))
    # Learning each long shape: one rendering and three checked turns (2 prefixes each) of at most its length;
    # the conversation: one rendering. The prefix way renders about n^2 / 2 messages for n.
    assert counting.rendered <= 9 * messages, (counting.rendered, messages)


def test_a_conversation_beyond_the_bound_names_its_size_and_the_bound():
    loop = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    template = ChatTemplate(loop + "{{ messages[0]['content'] }}", {}, TemplateLimits(seconds=0.2))
    with pytest.raises(TurnError) as got:
        template.targets([u("q"), a("r")])
    assert got.value.reason == "template_limit"
    assert "more than 0.202 CPU s, its bound for 2 messages rendered (0.2 s + 1 ms per message)" in got.value.detail


def _prepare(src: Path, tok: Path, out: Path, *extra: str):
    return CliRunner().invoke(app, ["prepare", str(src), "--tokenizer", str(tok), "--format", "chat", "--out",
                                    str(out), "--val-fraction", "0.2", "--seq-len", "16384", "--workers", "1",
                                    *extra])


def _burners(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


@pytest.mark.slow  # four busy loops on the machine's cores while a worker prepares
@pytest.mark.parametrize("name", ["test", "minimind"])
def test_a_400_turn_conversation_prepares_under_cpu_burners_as_it_does_unloaded(tmp_path, chat_tokenizer, name):
    tok = chat_tokenizer / "tokenizer.json" if name == "test" else MINIMIND_DIR / "tokenizer.json"
    if not tok.is_file():
        pytest.skip(f"MiniMind's tokenizer is not at {MINIMIND_DIR}")
    convs = [turns(1, str(i)) for i in range(30)] + [[s("你是助手")] + turns(400), turns(300, "b")] + \
        [turns(400, str(i)) for i in range(4)]
    src = write_chat_jsonl(tmp_path / "c.jsonl", convs)
    quiet = _prepare(src, tok, tmp_path / "quiet")
    assert quiet.exit_code == 0, quiet.output
    burners = _burners(4)
    try:
        busy = _prepare(src, tok, tmp_path / "busy")
    finally:
        for p in burners:
            p.kill()
            p.wait()
    assert busy.exit_code == 0, busy.output
    for name in OUTPUT_FILES:
        assert (tmp_path / "quiet" / name).read_bytes() == (tmp_path / "busy" / name).read_bytes(), name
    quiet_meta, busy_meta = (json.loads((tmp_path / d / "meta.json").read_text()) for d in ("quiet", "busy"))
    for key in ("splits", "chat", "bad_lines", "stats"):
        assert quiet_meta[key] == busy_meta[key], key
    assert quiet_meta["splits"]["train"]["documents"] + quiet_meta["splits"]["val"]["documents"] == len(convs)
