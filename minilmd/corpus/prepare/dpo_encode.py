"""Encoding preference pairs for `minilmd prepare --format dpo` in prepare's worker processes: MiniMind's DPO lines
(`{"chosen": [messages], "rejected": [messages]}`) rendered, encoded and masked exactly as `--format chat` renders
a conversation (chat_encode.ChatBlockEncoder, whose rendering this reuses), each pair kept as two documents, chosen
then rejected, adjacent and in one split.

- A line is bad (reason and detail, as chat lines are named) when it is not an object with "chosen" and "rejected"
  (`missing_chosen_rejected`), when a side is not a non-empty list of messages (`dpo_side_not_messages`), when
  either side is not a valid conversation (chat.check_conversation's reasons, the detail naming the side), when a
  side's last message is not the assistant's (`dpo_no_final_reply`), when the two sides' messages before that last
  reply differ (`dpo_prompt_differs`: the pair must answer one prompt), or when the two final replies are the same
  (`dpo_same_replies`: a margin of 0 whatever the model, a constant loss of ln 2 with no gradient).
- Keys MiniMind's template never renders (OpenAI's `tool_call_id` and `name`) are dropped from a side's messages and
  the pair kept, counted and named as a chat line's are (chat.check_conversation's `ignored`, each note naming the
  side).
- The loss mask covers the final assistant reply of each side only: the prompt, earlier replies included, is the
  same on both sides, so its log-probabilities cancel in the DPO objective.
- Length: a side longer than seq_len is cut to its first seq_len tokens (the pair counts as `cut`), or with on_long
  "drop" the pair is dropped (`dropped_long`); a pair either of whose final replies falls wholly past the cut is
  dropped (`dropped_no_target`).
- Split: the split rule and the leak key of block.py applied to the pair's canonical JSON, one key for both
  documents, so the leak check removes a pair whole and the two stay adjacent in every split.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from minilmd.corpus.chat import ParsedChatBlock, TurnError, check_conversation, checked_lines, has_special_text
from minilmd.corpus.chat_spans import BlockSpans
from minilmd.corpus.prepare.block import NO_DIGEST, EncodedBlock, digest64, leak_key_given
from minilmd.corpus.prepare.chat_encode import COUNTS, ChatBlockEncoder, encoded_block
from minilmd.corpus.sources.line_shape import other_format

SIDES = ("chosen", "rejected")


def check_pair(obj, ignored: list[str] | None = None
               ) -> tuple[tuple[list[dict], list[dict]] | None, tuple[str, str] | None]:
    """((chosen, rejected), None) for a good line's JSON value, (None, (reason, detail)) for a bad one; the keys
    dropped from its sides named in `ignored` (`chosen: message 2 (role 'user') "name"`)."""
    if not isinstance(obj, dict) or not all(side in obj for side in SIDES):
        other = other_format(obj, "dpo")  # a chat line, a text line: --format chat, text
        if other:
            return None, other
        what = f"an object with keys {sorted(obj)[:5]}" if isinstance(obj, dict) else f"a JSON {type(obj).__name__}"
        return None, ("missing_chosen_rejected", f'line is {what}; a preference pair has "chosen" and "rejected"')
    sides = []
    for side in SIDES:
        if not isinstance(obj[side], list) or not obj[side]:  # check_conversation would name a "conversations" key
            what = "an empty list" if isinstance(obj[side], list) else f"a JSON {type(obj[side]).__name__}"
            return None, ("dpo_side_not_messages", f"{side} is {what}; a side is a list of messages")
        notes: list[str] = []
        messages, bad = check_conversation({"conversations": obj[side]}, tools=False, ignored=notes)
        if bad is not None:
            return None, (bad[0], f"{side}: {bad[1]}")
        assert messages is not None
        if messages[-1]["role"] != "assistant":
            return None, ("dpo_no_final_reply", f"{side}: its last message is the {messages[-1]['role']}'s; a side "
                                                "ends with the assistant reply that is judged")
        sides.append(messages)
        if ignored is not None:
            ignored.extend(f"{side}: {note}" for note in notes)
    chosen, rejected = sides
    if chosen[:-1] != rejected[:-1]:
        at = next((i for i, (c, r) in enumerate(zip(chosen[:-1], rejected[:-1], strict=False)) if c != r),
                  min(len(chosen), len(rejected)) - 1)
        return None, ("dpo_prompt_differs", f"chosen has {len(chosen) - 1} messages before its reply, rejected "
                                            f"{len(rejected) - 1}, differing from message {at}: both sides must "
                                            "answer the same prompt")
    if chosen[-1] == rejected[-1]:  # a margin of 0 always: a constant ln 2 loss, no gradient, never counted right
        return None, ("dpo_same_replies", "chosen and rejected give the same final reply: the pair prefers nothing")
    return (chosen, rejected), None


def pair_canonical(chosen: list[dict], rejected: list[dict]) -> str:
    """The text the split rule and the leak key of a pair are computed on (as chat.canonical for a conversation)."""
    return json.dumps({"chosen": chosen, "rejected": rejected}, ensure_ascii=False, sort_keys=True,
                      separators=(",", ":"))


@dataclass
class ParsedPairBlock:
    pairs: list[tuple[list[dict], list[dict]]] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)
    bad: list[tuple[int, str, str]] = field(default_factory=list)
    ignored: list[tuple[int, str]] = field(default_factory=list)
    blank: int = 0
    n_lines: int = 0


def parse_pair_block(blob: bytes, first_line: int) -> ParsedPairBlock:
    """Whole lines of DPO JSONL -> the pairs, the bad lines with their reasons, and (line, keys dropped) of the
    pairs kept without keys their template never renders (as chat.parse_chat_block)."""
    out = ParsedPairBlock()
    notes: list[str] = []  # each line's, cleared before it is checked

    def check(obj):
        notes.clear()
        return check_pair(obj, notes)

    for lineno, pair in checked_lines(blob, first_line, out, check):
        out.pairs.append(pair)
        out.lines.append(lineno)
        if notes:
            out.ignored.append((lineno, "; ".join(notes)))
    return out


def last_reply_only(mask: np.ndarray) -> np.ndarray:
    """The loss mask with only its last run of targets (the final assistant reply) kept."""
    ones = np.flatnonzero(mask)
    if not ones.size:
        return mask
    end = int(ones[-1])
    zeros = np.flatnonzero(mask[:end] == 0)
    start = int(zeros[-1]) + 1 if zeros.size else 0
    out = np.zeros_like(mask)
    out[start:end + 1] = 1
    return out


class PairBlockEncoder(ChatBlockEncoder):
    """Parse, render, encode, mask and split one block of DPO lines. Lives in each worker process."""

    def __call__(self, blob: bytes, first_line: int) -> EncodedBlock:
        parsed = parse_pair_block(blob, first_line)
        sides = ParsedChatBlock(conversations=[m for pair in parsed.pairs for m in pair],
                                lines=[line for line in parsed.lines for _ in SIDES], bad=list(parsed.bad))
        finder = BlockSpans(self.chat.template, self.layouts)
        bad, rendered, kept = self._render(sides, first_line, finder)
        if finder.mismatch:
            bad, rendered, kept = self._render(sides, first_line, BlockSpans(self.chat.template, None))
        return self._encode_pairs(parsed, bad, rendered, kept)

    def _encode_pairs(self, parsed: ParsedPairBlock, bad: list, rendered: list, kept: list) -> EncodedBlock:
        encoded = self._ids_and_masks(rendered)
        by_line: dict[int, list] = {}
        for (messages, line), got in zip(kept, encoded, strict=True):
            if isinstance(got, TurnError):
                bad.append((line, got.reason, got.detail))
            else:
                by_line.setdefault(line, []).append((messages, got))
        counts = dict.fromkeys(COUNTS, 0)
        out: dict[bool, dict[str, list]] = {v: {"tokens": [], "masks": [], "lengths": [], "keys": [], "lines": [],
                                                 "facts": []} for v in (False, True)}
        train_min, text_bytes = NO_DIGEST, 0
        ignored, ignored_kept = dict(parsed.ignored), []  # (line, keys dropped): most blocks have none
        for line, (chosen, rejected) in zip(parsed.lines, parsed.pairs, strict=True):
            both = by_line.get(line, [])
            if len(both) != 2:  # a side the template could not render: the line is bad already
                continue
            sides = [self._side(got) for _, got in both]
            if any(s is None for s in sides):
                counts["dropped_long"] += 1
                continue
            if any(not int(mask.sum()) for _, mask, _ in sides):  # type: ignore[misc]
                counts["dropped_no_target"] += 1
                continue
            counts["cut"] += int(any(cut for _, _, cut in sides))  # type: ignore[misc]
            counts["special_text"] += int(has_special_text(chosen) or has_special_text(rejected))
            if ignored and line in ignored:
                ignored_kept.append((line, ignored[line]))
            data = pair_canonical(chosen, rejected).encode("utf-8")
            text_bytes += len(data)
            digest = digest64(data)
            is_val = digest < self.threshold
            if not is_val and digest < train_min:
                train_min = digest
            key = leak_key_given(data.decode("utf-8"), digest)
            side = out[is_val]
            for (messages, _), (ids, mask, cut) in zip(both, sides, strict=True):  # type: ignore[misc]
                if int(ids.max()) >= self.vocab_size:
                    raise ValueError(f"tokenizer produced id {int(ids.max())} >= its vocabulary {self.vocab_size}")
                side["tokens"].append(ids)
                side["masks"].append(mask)
                side["lengths"].append(ids.size)
                side["keys"].append(key)
                side["lines"].append(line)
                side["facts"].append((len(messages), sum(m["role"] == "assistant" for m in messages),
                                      int(mask.sum()), int(cut)))
        bad = sorted(set(bad))  # a line both of whose sides failed is named once
        counts["ignored_keys"] = len(ignored_kept)
        return encoded_block(parsed, bad, text_bytes, train_min, out, counts, ignored_kept)

    def _side(self, got) -> tuple[np.ndarray, np.ndarray, bool] | None:
        """(ids, mask on the final reply, cut) of one side at seq_len; None when on_long drops it."""
        ids, mask = got
        mask = last_reply_only(mask)
        cut = ids.size > self.chat.seq_len
        if cut:
            if self.chat.on_long == "drop":
                return None
            ids, mask = ids[:self.chat.seq_len], mask[:self.chat.seq_len]
        return ids, mask, cut
