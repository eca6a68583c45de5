"""One rendering per conversation (minilmd/corpus/chat_spans.py) against the prefix renderings of
ChatTemplate.targets, the definition: the same spans or the same refusal for every conversation, and the same
tokens, loss masks, bad lines and counts byte for byte from ChatBlockEncoder, for the tests' template, the
synthetic corpora's template and MiniMind's (skipped without it; MINIMIND_TOKENIZER_DIR names another place), and
for templates that are not laid out by the shape of a conversation (the block falls back to the prefix way)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from chat_helpers import HAND_MADE, MINIMIND_DIR, a, chat_templates, outcome, read_conversations, s, u
from minilmd.corpus.chat import ChatTemplate, TurnError
from minilmd.corpus.chat_spans import UNLEARNT, VERIFIED_PER_BLOCK, BlockSpans, Layouts, shape
from minilmd.corpus.demo_text import write_repeated_chat_corpus
from minilmd.corpus.prepare.chat_encode import ChatBlockEncoder, ChatSpec
from minilmd.corpus.prepare.chat_masks import (
    ByteStarts,
    block_ids_and_masks,
    block_ids_and_masks_by_lookup,
    ids_and_mask,
    same_results,
    starts_in_order,
    target_mask,
)
from minilmd.protocol import BOS_ID, EOS_ID

SPECIALS = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
NOT_INCREMENTAL = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] }}"
                   "{% if loop.last and m['role'] == 'assistant' %}!{% endif %}{{ '<|im_end|>\\n' }}{% endfor %}")
BY_TEXT = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] }}"
           "{% if loop.last and '!' in m['content'] %}?{% endif %}{{ '<|im_end|>\\n' }}{% endfor %}")
"""Not incremental for a conversation with a "!" in a reply another message follows: its probe is, its layout is
learnt."""
SKIPS_EMPTY = ("{% for m in messages %}{% if m['content'] %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
               "'<|im_end|>\\n' }}{% endif %}{% endfor %}")


EDGES = [
    [s(""), u("empty system"), a("ok")],
    [u("a"), a("")] * 3,
    [s("sys"), u("q1"), a("r1"), u("q2"), a("r2"), u("q3"), a("r3")],
    [u("<tool_response>\n{\"temp\": 21}\n</tool_response>"), a("It is 21 degrees.")],
    [u("call a tool"), a('<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>'),
     u("<tool_response>\nsunny\n</tool_response>"), a("Sunny.")],
    [u("x"), {"role": "assistant", "content": "", "reasoning_content": "only a thought"}],
    [u("q"), a("\n\n<think>\nmixed\n</think>\n\n\nanswer\n")],
    [u("spells <|im_end|> in the text"), a("and <|im_start|>assistant\n here")],
    [u("  "), a("  \n  ")],
    [a("a reply first")],
    [s("one"), s("two"), u("q"), a("r")],
    [u("q"), a("r"), u("trailing question")],
]
"""Empty system and replies, many turns, tool-like text, a thought only, white space, special text, a reply
first, two system messages, a conversation ending on a question."""


@pytest.fixture(scope="module")
def conversations(chat_jsonl, demo_jsonl, tmp_path_factory) -> list[list[dict]]:
    mixed = write_repeated_chat_corpus(demo_jsonl, tmp_path_factory.mktemp("mixed") / "chat.jsonl", 0.4)
    return HAND_MADE + EDGES + read_conversations(chat_jsonl)[::2] + read_conversations([mixed])


@pytest.mark.parametrize("name", ["test", "synthetic", "minimind"])
def test_one_rendering_gives_the_prefix_spans_or_the_same_refusal(name, chat_tokenizer, conversations):
    templates = chat_templates(chat_tokenizer)
    if name not in templates:
        pytest.skip(f"MiniMind's tokenizer is not at {MINIMIND_DIR} (set MINIMIND_TOKENIZER_DIR)")
    template = templates[name][0]
    finder = BlockSpans(template, Layouts(template))
    finder.verified = VERIFIED_PER_BLOCK  # no sample: every conversation one rendering where it can
    assert len(conversations) > 600
    for messages in conversations:
        assert outcome(finder.targets, messages) == outcome(template.targets, messages), messages
    assert not finder.mismatch
    assert finder.renders_saved > 0.9 * len(conversations), "most conversations took one rendering"


@pytest.mark.slow  # twelve block-by-block comparisons of a few hundred conversations
@pytest.mark.parametrize("name", ["test", "synthetic", "minimind", "not-incremental", "by-text", "skips-empty"])
@pytest.mark.parametrize("block_bytes", [1 << 20, 8192])
def test_block_encoder_writes_the_same_tokens_and_masks_byte_for_byte(name, block_bytes, chat_tokenizer,
                                                                      conversations):
    templates = chat_templates(chat_tokenizer)
    tok = templates["test"][1]
    templates |= {"not-incremental": (ChatTemplate(NOT_INCREMENTAL, SPECIALS), tok),
                  "by-text": (ChatTemplate(BY_TEXT, SPECIALS), tok),
                  "skips-empty": (ChatTemplate(SKIPS_EMPTY, SPECIALS), tok)}
    if name not in templates:
        pytest.skip(f"MiniMind's tokenizer is not at {MINIMIND_DIR} (set MINIMIND_TOKENIZER_DIR)")
    template, tok = templates[name]
    convs = conversations
    if name == "by-text":  # its turns follow the text, in the block's first conversation: the sample sees it
        if block_bytes < 1 << 20:
            pytest.skip("one block: a block whose sample does not hold such a conversation is not proven")
        convs = [[u("q"), a("r!"), u("q"), a("r")]] + conversations
    lines = [json.dumps({"conversations": c}, ensure_ascii=False).encode() for c in convs]
    blocks, block, size = [], [], 0
    for line in lines:
        block.append(line)
        size += len(line) + 1
        if size >= block_bytes:
            blocks.append(block)
            block, size = [], 0
    blocks.append(block)
    # Today's way beside the prefix way with every token's offsets: the same output.
    encoders = [ChatBlockEncoder(tok, 0.1, ChatSpec(template, 256), one_render=one, by_bytes=one)
                for one in (False, True)]
    first = 1
    for block in blocks:
        blob = b"\n".join(block) + b"\n"
        old, new = (e(blob, first) for e in encoders)
        first += len(block)
        for field in ("train_tokens", "train_mask", "train_lengths", "train_keys", "train_facts", "val_tokens",
                      "val_mask", "val_lengths", "val_keys", "val_lines", "val_facts"):
            want, got = getattr(old, field), getattr(new, field)
            assert want.dtype == got.dtype and want.tobytes() == got.tobytes(), (name, field)
        assert (old.bad, old.chat_counts, old.text_bytes, old.train_min_digest) == \
            (new.bad, new.chat_counts, new.text_bytes, new.train_min_digest)
    if name in ("test", "synthetic", "minimind", "skips-empty"):
        assert encoders[1].renders_saved > 0.8 * (len(convs) - VERIFIED_PER_BLOCK * len(blocks))  # beside the samples
    elif name == "by-text":
        assert len(blocks) == 1 and encoders[1].renders_saved == 0, "the block went the prefix way"
    assert encoders[0].renders_saved == 0 and encoders[0].byte_starts is None
    assert encoders[1].byte_starts is not None and encoders[1].byte_starts.fallbacks == 0, "masks from the ids"


def test_a_template_that_is_not_incremental_learns_no_layout_and_a_sample_that_differs_marks_the_block(tokenizer):
    template = ChatTemplate(NOT_INCREMENTAL, SPECIALS)
    layouts = Layouts(template)
    assert layouts.get(shape([u("a"), a("b"), u("c"), a("d")])) is UNLEARNT
    assert layouts.get(shape([u("a"), a("b")])) is not UNLEARNT  # one reply: nothing follows it
    by_text = ChatTemplate(BY_TEXT, SPECIALS)
    finder = BlockSpans(by_text, Layouts(by_text))
    with pytest.raises(TurnError) as e:
        finder.targets([u("q"), a("r!"), u("q"), a("r")])
    assert e.value.reason == "template_not_incremental" and finder.mismatch
    assert finder.targets([u("q"), a("r")]) == by_text.targets([u("q"), a("r")])  # the prefix way from now on
    assert finder.renders_saved == 0


def test_target_mask_by_binary_search_equals_the_scan():
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(1, 60))
        ordered = np.sort(rng.integers(0, 80, n))
        spans = [tuple(sorted(rng.integers(0, 90, 2).tolist())) for _ in range(int(rng.integers(0, 4)))]
        shuffled = rng.permutation(ordered)
        mask, last = target_mask(ordered, spans)
        assert mask.tolist() == [int(any(x <= t < y for x, y in spans)) for t in ordered.tolist()]
        want_last = [max((i for i, t in enumerate(ordered.tolist()) if x <= t < y), default=None) for x, y in spans]
        assert last == want_last
        mask, last = target_mask(shuffled, spans)  # not in order: the scan
        assert mask.tolist() == [int(any(x <= t < y for x, y in spans)) for t in shuffled.tolist()]
        assert last == [max((i for i, t in enumerate(shuffled.tolist()) if x <= t < y), default=None)
                        for x, y in spans]



class FakeEncoding:
    """What block_ids_and_masks and block_ids_and_masks_by_lookup read of a tokenizers Encoding."""

    def __init__(self, ids, offsets):
        self.ids, self.offsets = ids, offsets

    def __len__(self):
        return len(self.ids)

    def char_to_token(self, at):  # as tokenizers' Encoding: the first token whose offsets hold the character
        return next((i for i, (b, e) in enumerate(self.offsets) if b <= at < e), None)

    def token_to_chars(self, i):
        return self.offsets[i]


def _same_results(want: list, got: list) -> set[str]:
    kinds = set()
    for w, g in zip(want, got, strict=True):
        if isinstance(w, TurnError):
            assert isinstance(g, TurnError) and (g.reason, g.detail) == (w.reason, w.detail)
            kinds.add(w.detail.split(" ")[0])
            continue
        assert not isinstance(g, TurnError)
        assert g[0].tobytes() == w[0].tobytes() and g[1].tobytes() == w[1].tobytes()
        kinds.add("ok")
    return kinds


@pytest.mark.parametrize("in_order", [True, False])
def test_a_block_converted_at_once_equals_each_conversation_alone(in_order):
    rng = np.random.default_rng(1)
    encs, texts, spans = [], [], []
    for c in range(60):
        n = int(rng.integers(0, 30))
        ids = [BOS_ID, *rng.integers(3, 50, max(n - 1, 0)).tolist()][:n]
        starts = np.sort(rng.integers(0, 40, n)).tolist()
        if not in_order and c == 30 and n > 2:
            starts[0], starts[-1] = starts[-1], starts[0]
        sp = sorted({tuple(sorted(rng.integers(0, 45, 2).tolist())) for _ in range(int(rng.integers(0, 3)))})
        for x, y in sp:  # most replies end with EOS, as a template writes them
            ends = [i for i, t in enumerate(starts) if x <= t < y]
            if ends and rng.random() < 0.8:
                ids[ends[-1]] = EOS_ID
        encs.append(FakeEncoding(ids, [(t, t + 1) for t in starts]))
        texts.append("x" * 45)
        spans.append(sp)
    def alone(enc, sp):
        try:
            return ids_and_mask(enc, sp)
        except TurnError as e:
            return e

    want = [alone(enc, sp) for enc, sp in zip(encs, spans, strict=True)]
    kinds = _same_results(want, block_ids_and_masks(encs, texts, spans))
    assert kinds == {"ok", "the", "reply"}, kinds  # kept ones, refused for BOS and for EOS


def test_spans_looked_up_at_their_ends_equal_the_offsets_of_every_token_on_fakes():
    """Token starts in order, with repeated starts (a character cut across tokens), tokens of no width (a trimmed
    space) and characters no token covers: the lookups give each conversation what its offsets give."""
    rng = np.random.default_rng(2)
    encs, texts, spans = [], [], []
    for _ in range(400):
        n = int(rng.integers(0, 25))
        starts = np.sort(rng.integers(0, 40, n)).tolist()
        ends = [min(t + int(rng.integers(0, 3)), 40) for t in starts]
        ids = [BOS_ID, *rng.integers(3, 50, max(n - 1, 0)).tolist()][:n]
        sp = sorted({tuple(sorted(rng.integers(0, 41, 2).tolist())) for _ in range(int(rng.integers(0, 3)))})
        for x, y in sp:
            inside = [i for i, t in enumerate(starts) if x <= t < y]
            if inside and rng.random() < 0.8:
                ids[inside[-1]] = EOS_ID
        encs.append(FakeEncoding(ids, list(zip(starts, ends, strict=True))))
        texts.append("x" * 40)
        spans.append(sp)
    kinds = _same_results(block_ids_and_masks(encs, texts, spans), block_ids_and_masks_by_lookup(encs, texts, spans))
    assert kinds == {"ok", "the", "reply"}, kinds


SPACED = [[u("q"), a(" leading space")], [u("q"), a("  two spaces  ")], [u("q"), a(" ")], [u("q"), a("\n\nx \n")],
          [u("q"), a("尾 ")], [u("问"), a(" 答，😀 x")], [u("q"), a("\t tab")],
          [s(" "), u(" "), a(" a "), u(" "), a("  ")]]
"""Replies whose first or last characters are white space a token of the header or of the next turn may take."""


def _rendered(template: ChatTemplate, conversations: list[list[dict]]) -> tuple[list[str], list]:
    """(renderings, target spans) of the conversations the template does not refuse."""
    texts, spans = [], []
    for messages in conversations:
        try:
            text, sp = template.targets(messages)
        except TurnError:
            continue
        texts.append(text)
        spans.append(sp)
    return texts, spans


@pytest.mark.parametrize("name", ["test", "synthetic", "minimind"])
def test_spans_looked_up_at_their_ends_equal_the_offsets_of_every_token(name, chat_tokenizer, conversations):
    from tokenizers import Tokenizer

    templates = chat_templates(chat_tokenizer)
    if name not in templates:
        pytest.skip(f"MiniMind's tokenizer is not at {MINIMIND_DIR} (set MINIMIND_TOKENIZER_DIR)")
    template, tok_json = templates[name]
    tok = Tokenizer.from_str(tok_json)
    assert starts_in_order(tok)
    texts, spans = _rendered(template, SPACED + conversations)
    encs = tok.encode_batch(texts, add_special_tokens=False)
    assert "ok" in _same_results(block_ids_and_masks(encs, texts, spans),
                                 block_ids_and_masks_by_lookup(encs, texts, spans))


def _trained(kind: str, text):
    """A small tokenizer of `kind` trained on text(), MiniMind's special ids, no normalizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # MiniMind's ids 0, 1, 2
    if kind.startswith("byte-level"):
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        if kind == "byte-level-trimmed":
            tok.post_processor = processors.ByteLevel(trim_offsets=True)
        trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    elif kind == "metaspace-unigram":
        tok = Tokenizer(models.Unigram())
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=300, special_tokens=specials, unk_token=specials[0])
    else:
        tok = Tokenizer(models.WordPiece(unk_token=specials[0]))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        trainer = trainers.WordPieceTrainer(vocab_size=300, special_tokens=specials)
    tok.train_from_iterator([text() for _ in range(2000)], trainer)
    return tok


@pytest.mark.parametrize("kind", ["byte-level", "byte-level-trimmed", "metaspace-unigram", "whitespace-wordpiece"])
def test_spans_looked_up_at_their_ends_equal_the_offsets_under_other_pre_tokenizers(kind):
    """Tokenizers without a normalizer (starts_in_order) of other kinds than the tests' byte-level BPE: random
    ChatML renderings of white space, CJK and emoji, the same masks and refusals both ways; and from the ids alone
    (ByteStarts) for the plain byte-level BPE, the only one of them it takes."""
    rng = np.random.default_rng(3)
    words = ["hello", "world", "你好", "世界", "😀", "a", "  ", " ", "\n", "\t", "x y", "éé", "...", "<", ">"]

    def text() -> str:
        return "".join(rng.choice(words) for _ in range(int(rng.integers(0, 12))))

    tok = _trained(kind, text)
    assert starts_in_order(tok)
    texts, spans = [], []
    for _ in range(600):
        rendering, sp = f"<|im_start|>user\n{text()}<|im_end|>\n", []
        for _ in range(int(rng.integers(1, 4))):
            start = len(rendering) + len("<|im_start|>assistant\n")
            rendering += f"<|im_start|>assistant\n{text()}<|im_end|>"
            sp.append((start, len(rendering)))
            rendering += str(rng.choice(["\n", "", " ", "\n\n"]))
        texts.append(rendering)
        spans.append(sp)
    encs = tok.encode_batch(texts, add_special_tokens=False)
    want = block_ids_and_masks(encs, texts, spans)
    assert "ok" in _same_results(want, block_ids_and_masks_by_lookup(encs, texts, spans))
    byte_starts = ByteStarts.of(tok, tok.to_str())
    assert (byte_starts is not None) == (kind == "byte-level")
    if byte_starts is not None:
        fast = tok.encode_batch_fast(texts, add_special_tokens=False)
        assert "ok" in _same_results(want, byte_starts._from_ids(fast, texts, spans))


@pytest.mark.parametrize("name", ["test", "synthetic", "minimind"])
def test_masks_from_the_ids_byte_lengths_equal_the_lookup(name, chat_tokenizer, conversations):
    """Every conversation of the tests (white space at a reply's ends, CJK, emoji, special text, refusals) from
    encode_batch_fast and the ids' byte lengths alone: the masks and refusals of the lookup on encode_batch."""
    from tokenizers import Tokenizer

    templates = chat_templates(chat_tokenizer)
    if name not in templates:
        pytest.skip(f"MiniMind's tokenizer is not at {MINIMIND_DIR} (set MINIMIND_TOKENIZER_DIR)")
    template, tok_json = templates[name]
    tok = Tokenizer.from_str(tok_json)
    byte_starts = ByteStarts.of(tok, tok_json)
    assert byte_starts is not None
    texts, spans = _rendered(template, SPACED + conversations + [[u("😀" * 5), a("尾 \n")],
                                                                 [a("<|im_start|>x<|im_end|>")]])
    want = block_ids_and_masks_by_lookup(tok.encode_batch(texts, add_special_tokens=False), texts, spans)
    got = byte_starts._from_ids(tok.encode_batch_fast(texts, add_special_tokens=False), texts, spans)
    assert got is not None and "ok" in _same_results(want, got)
    assert same_results(want, byte_starts.masks(tok, texts, spans, block_ids_and_masks_by_lookup))
    assert byte_starts.fallbacks == 0


class _Shifted:
    """A tokenizer whose encode_batch_fast gives other ids than encode_batch (as a tokenizer ByteStarts misjudged
    might), that still spell as many bytes: each conversation's tokens in reverse order."""

    def __init__(self, tok):
        self.tok = tok

    def encode_batch(self, texts, add_special_tokens):
        return self.tok.encode_batch(texts, add_special_tokens=add_special_tokens)

    def encode_batch_fast(self, texts, add_special_tokens):
        return [FakeEncoding(e.ids[::-1], e.offsets)
                for e in self.tok.encode_batch(texts, add_special_tokens=add_special_tokens)]


def test_a_block_whose_ids_do_not_spell_its_text_or_whose_sample_differs_goes_the_lookup_way(chat_tokenizer):
    from tokenizers import Tokenizer

    template, tok_json = chat_templates(chat_tokenizer)["test"]
    tok = Tokenizer.from_str(tok_json)
    rendered = [template.targets(m) for m in [[u("q"), a("回答 one")], [u("问"), a("r"), u("q2"), a("r2")]] * 6]
    texts, spans = [t for t, _ in rendered], [sp for _, sp in rendered]
    want = block_ids_and_masks_by_lookup(tok.encode_batch(texts, add_special_tokens=False), texts, spans)
    assert "ok" in _same_results(want, want)

    lying = ByteStarts.of(tok, tok_json)
    common = int(np.bincount(np.concatenate([w[0] for w in want])).argmax())
    lying.lengths[common] += 1  # a token said to be a byte longer than it is: the ids do not spell the text
    assert lying._from_ids(tok.encode_batch_fast(texts, add_special_tokens=False), texts, spans) is None
    assert same_results(want, lying.masks(tok, texts, spans, block_ids_and_masks_by_lookup))
    assert lying.fallbacks == 1

    honest = ByteStarts.of(tok, tok_json)
    shifted = _Shifted(tok)
    assert not same_results(want, honest._from_ids(shifted.encode_batch_fast(texts, False), texts, spans))
    assert same_results(want, honest.masks(shifted, texts, spans, block_ids_and_masks_by_lookup))
    assert honest.fallbacks == 1, "the sample saw it: the whole block by lookup"


def test_byte_starts_takes_only_tokenizers_whose_tokens_spell_the_text_bytes(chat_tokenizer):
    from tokenizers import AddedToken, Tokenizer, normalizers, processors

    tok_json = (chat_tokenizer / "tokenizer.json").read_text(encoding="utf-8")
    assert ByteStarts.of(Tokenizer.from_str(tok_json), tok_json) is not None
    for change in ("normalizer", "post_processor", "lstrip", "prefix_space"):
        tok = Tokenizer.from_str(tok_json)
        if change == "normalizer":
            tok.normalizer = normalizers.NFC()
        elif change == "post_processor":
            tok.post_processor = processors.ByteLevel(trim_offsets=True)
        elif change == "lstrip":
            tok.add_special_tokens([AddedToken("<mask>", lstrip=True)])
        else:
            spec = json.loads(tok_json)
            spec["pre_tokenizer"]["add_prefix_space"] = True
            tok = Tokenizer.from_str(json.dumps(spec))
        assert ByteStarts.of(tok, tok.to_str()) is None, change
