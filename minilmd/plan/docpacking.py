"""Padding-free SFT: whole conversations packed into rows of seq_len (`data.mode = "packed"` with `data.doc_mask` on
a chat corpus).

A row holds whole conversations, one after another, never a part of one (a conversation longer than seq_len is cut
at seq_len, as in padded mode: bucketing.py's DocumentRows gives each its row); the rest of a row that no next
conversation fits in is PAD, the only padding. The rows carry their pieces' positions (minilmd/plan/docmask.py:
0 at each conversation's start, and at the PAD tail's), so each conversation attends only to itself and has its own
rotary positions: it computes what it would alone in a row of its own, with its assistant-only loss mask as
prepared (tests/test_docmask_sft.py: the loss and gradients of one conversation per row).

Packing: once per run (pack_longest_fit): each row starts with the longest conversation left and takes the longest
left that fits its remaining room, until none does; conversations of equal length in a random order drawn from
(train.seed, its own stream). A greedy next fit over a random order left 20 % PAD on MiniMind-like lengths (mean
234, seq_len 768), more than bucketing's 8 %; this leaves 0.2 %. The packed rows then play
the role windows play in packed mode: epoch e visits them in the order of a permutation drawn from (seed, e), so the
rows of a step are a pure function of (seed, step) like every sampler's (sampler_base.py), and a resume is exact.
The same rows every epoch, in another order: the conversations sharing a row stay together (invisible to each
other under the mask, they only share a micro-batch).
"""
from __future__ import annotations

import bisect

import numpy as np

from minilmd.plan.bucketing import DocumentRows
from minilmd.plan.sampler_base import STREAM_PACKING, Batch, Sampler, seeded_generator
from minilmd.protocol import PAD_ID


def pack_longest_fit(lengths: np.ndarray, order: np.ndarray, seq_len: int) -> list[np.ndarray]:
    """Documents (their row lengths: `lengths`, each in [1, seq_len]) in rows of at most seq_len tokens: each row
    starts with the longest document left, then takes the longest left that fits its remaining room, until none
    does. Among documents of one length, the first in `order` goes first (the seeded tie break)."""
    by_length: list[list[int]] = [[] for _ in range(seq_len + 1)]
    for d in order[::-1].tolist():  # reversed: pop() takes the first in order
        by_length[int(lengths[d])].append(d)
    rows: list[np.ndarray] = []
    top, low = seq_len, 1  # no document is longer than top, nor shorter than low
    while True:
        while top >= low and not by_length[top]:
            top -= 1
        if top < low:
            return rows
        row, room = [by_length[top].pop()], seq_len - top
        n = min(room, top)
        while n >= low:
            if by_length[n]:
                row.append(by_length[n].pop())
                room -= n
                n = min(n, room)
            else:
                n -= 1
        while low <= top and not by_length[low]:
            low += 1
        rows.append(np.array(row, np.int64))


def packed_row_count(counts: np.ndarray, seq_len: int) -> int:
    """len(pack_longest_fit(...)) from `counts` alone (counts[n]: the documents of row length n, 1 <= n <= seq_len),
    with no document held: the greedy's choices depend on the lengths left, never on which document of a length it
    takes (the seeded order only breaks ties among equal lengths). A row is found once and counted for every repeat
    of it: it repeats while each length it took has as many left, so the work grows with seq_len's lengths, not
    with the documents (minilmd/plan/epoch.py counts a teammate's corpus so: hostile audit 9 F3)."""
    left = [int(c) for c in counts[:seq_len + 1]]
    present = [n for n in range(1, len(left)) if left[n] > 0]  # ascending: the lengths some document still has
    rows = 0
    while present:
        taken, room, most = [], seq_len, present[-1]  # a row starts with the longest left
        while most >= 1 and (at := bisect.bisect_right(present, most)):
            n = present[at - 1]  # the longest left that fits
            k = min(left[n], room // n)
            taken.append((n, k))
            room -= k * n
            most = min(n - 1, room)  # none of n left, or no room for another n
        repeats = min(left[n] // k for n, k in taken)
        rows += repeats
        for n, k in taken:
            left[n] -= repeats * k
            if not left[n]:
                present.remove(n)
    return rows


def packed_rows(lengths: np.ndarray, seq_len: int, seed: int) -> list[np.ndarray]:
    """The rows of padding-free SFT, once per run: documents of row lengths `lengths` (row_lengths) packed by
    pack_longest_fit, ties broken in an order drawn from (seed, its own stream). The sampler's rows, and the core's
    count of an epoch (minilmd/plan/epoch.py)."""
    order = seeded_generator(seed, STREAM_PACKING, 0).permutation(len(lengths))
    return pack_longest_fit(lengths, order, seq_len)


class PackedConversationsSampler(Sampler):
    """Rows of whole conversations (the module docstring); `groups[i]` are the documents of packed row i."""

    mode = "packed"

    def __init__(self, tokens: np.ndarray, doc_starts: np.ndarray, seq_len: int, seed: int,
                 loss_mask: np.ndarray | None):
        self.docs = DocumentRows(tokens, doc_starts, seq_len, loss_mask)
        self.groups = packed_rows(self.docs.lengths, seq_len, seed)
        super().__init__(len(self.groups), seq_len, seed)

    def _too_small_message(self, seq_len: int) -> str:
        return "the train split has no conversation to pack"

    def rows(self, positions: np.ndarray) -> Batch:
        idx, _ = self.order.items(positions)
        x = np.full((len(idx), self.seq_len), PAD_ID, np.uint16)
        targets = np.zeros((len(idx), self.seq_len), np.uint8)
        pos = np.zeros((len(idx), self.seq_len), np.int32)
        n_targets = n_real = 0
        for i, g in enumerate(idx.tolist()):
            at = 0
            for d in self.groups[g].tolist():
                ids, t = self.docs.row(d)
                x[i, at:at + len(ids)] = ids
                targets[i, at:at + len(t)] = t
                pos[i, at:at + len(ids)] = np.arange(len(ids))
                at += len(ids)
            pos[i, at:] = np.arange(self.seq_len - at)  # the PAD tail: a piece of its own, seen by no one
            docs = self.groups[g]
            n_targets += int(self.docs.n_targets[docs].sum())
            n_real += at
        return Batch(x, targets, n_targets, n_real, pos)

    def pad_share(self) -> float:
        """PAD tokens over all tokens of one epoch's rows."""
        return 1.0 - float(self.docs.lengths.sum()) / (len(self.groups) * self.seq_len)
