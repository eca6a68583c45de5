"""Encoding in worker processes for `minilmd prepare`: blocks of JSONL lines (and pieces of long documents) in,
uint16 ids with the split of each document out.

Each worker is a process of its own with a single-threaded tokenizer (the cores work in parallel without a thread
pool's overhead), made with spawn, and dies with prepare's process (PR_SET_PDEATHSIG): a prepare killed with
SIGKILL leaves no worker behind. workers=0 runs the same code in the calling process.

The split rule and the EncodedBlock a worker sends back are block.py's (chat_encode.py applies the same).
"""
from __future__ import annotations

import itertools
import os
from concurrent.futures import Future

import numpy as np

from minilmd.corpus.analysis.scripts import ScriptTally, containing, script_matrix
from minilmd.corpus.prepare.block import NO_DIGEST, EncodedBlock, digest64, leak_key_given
from minilmd.corpus.sources.jsonl import parse_block
from minilmd.corpus.sources.longdoc import split_pieces
from minilmd.corpus.workers import WorkerPool
from minilmd.corpus_meta import CorpusError
from minilmd.protocol import BOS_ID, EOS_ID, PAD_ID


class BlockEncoder:
    """Parse, split and encode one block of lines. Lives in each worker process (or inline with workers=0)."""

    def __init__(self, tokenizer_json: str, val_fraction: float, drop_scripts: frozenset[str] = frozenset()):
        from tokenizers import Tokenizer

        self.drop_scripts = drop_scripts

        self.tok = Tokenizer.from_str(tokenizer_json)
        self.vocab_size = self.tok.get_vocab_size(with_added_tokens=True)
        self.threshold = int(val_fraction * 2**64)
        # encode_batch_fast skips offset tracking, which prepare does not need; same ids as encode_batch.
        self.encode = getattr(self.tok, "encode_batch_fast", self.tok.encode_batch)

    def __call__(self, blob: bytes, first_line: int) -> EncodedBlock:
        parsed = parse_block(blob, first_line)
        tally, dropped = self._scripts(parsed)
        texts = parsed.texts
        utf8 = [t.encode("utf-8") for t in texts]
        digests = [digest64(b) for b in utf8]
        is_val = np.fromiter((d < self.threshold for d in digests), dtype=bool, count=len(texts))
        keys = np.fromiter(map(leak_key_given, texts, digests), dtype=np.uint64, count=len(texts))
        body, body_lengths = self._encode_texts(texts)
        special_inside = []
        special = body <= max(PAD_ID, BOS_ID, EOS_ID)
        if special.any():
            doc_of_token = np.repeat(np.arange(len(texts)), body_lengths)
            special_inside = [parsed.lines[d] for d in np.unique(doc_of_token[special])]
        lengths = body_lengths + 2
        ends = np.cumsum(lengths)
        tokens = np.empty(int(ends[-1]) if len(ends) else 0, dtype="<u2")
        is_body = np.ones(tokens.size, dtype=bool)
        is_body[ends - lengths] = False
        is_body[ends - 1] = False
        tokens[ends - lengths] = BOS_ID
        tokens[ends - 1] = EOS_ID
        tokens[is_body] = body
        token_is_val = np.repeat(is_val, lengths)
        lines = np.asarray(parsed.lines, dtype=np.int64)
        train_min = min((d for d, v in zip(digests, is_val, strict=True) if not v), default=NO_DIGEST)
        return EncodedBlock(
            n_lines=parsed.n_lines, blank=parsed.blank, bad=parsed.bad, text_bytes=sum(map(len, utf8)),
            special_inside=special_inside,
            train_tokens=tokens[~token_is_val], train_lengths=lengths[~is_val].astype(np.int32),
            train_keys=keys[~is_val],
            val_tokens=tokens[token_is_val], val_lengths=lengths[is_val].astype(np.int32), val_keys=keys[is_val],
            val_lines=lines[is_val], train_min_digest=train_min, scripts=tally, dropped=dropped,
        )

    def _scripts(self, parsed) -> tuple[ScriptTally, int]:
        """The block's documents by script; those holding a --drop-scripts script are taken out of `parsed`."""
        matrix = script_matrix(parsed.texts)
        drop = containing(matrix, self.drop_scripts)
        tally = ScriptTally()
        tally.add(matrix[~drop])
        if drop.any():
            parsed.texts = [t for t, d in zip(parsed.texts, drop, strict=True) if not d]
            parsed.lines = [n for n, d in zip(parsed.lines, drop, strict=True) if not d]
        return tally, int(drop.sum())


    def _encode_texts(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(the texts' ids one after the other, each text's number of ids). A text longer than PIECE_CHARS is
        encoded in the pieces longdoc.split_pieces cuts, exactly as when it is streamed as a long line."""
        pieces = [split_pieces(t) for t in texts]
        flat = [piece for text_pieces in pieces for piece in text_pieces]
        encs = self.encode(flat, add_special_tokens=False)
        lengths = np.fromiter((len(e) for e in encs), dtype=np.int64, count=len(encs))
        body = np.fromiter(itertools.chain.from_iterable(e.ids for e in encs), dtype=np.uint16,
                           count=int(lengths.sum()))
        self._check_ids(body)
        if len(flat) == len(texts):
            return body, lengths
        firsts = np.cumsum([0] + [len(text_pieces) for text_pieces in pieces[:-1]])
        return body, np.add.reduceat(lengths, firsts)

    def _check_ids(self, body: np.ndarray) -> None:
        if body.size and int(body.max()) >= self.vocab_size:
            raise CorpusError(f"tokenizer produced id {int(body.max())} >= its vocabulary {self.vocab_size}")

    def encode_piece(self, text: str) -> tuple[np.ndarray, bool]:
        """One piece of a long document: (its ids, whether one of them is PAD/BOS/EOS)."""
        enc = self.encode([text], add_special_tokens=False)[0]
        body = np.asarray(enc.ids, dtype=np.uint16)
        self._check_ids(body)
        return body, bool((body <= max(PAD_ID, BOS_ID, EOS_ID)).any())


class Encoders:
    """BlockEncoder in `workers` processes, or in this one for workers=0: `submit(method, *args)` returns a Future
    of BlockEncoder.<method>(*args) ("__call__" for a block of lines, "encode_piece" for a piece of a long one)."""

    def __init__(self, tokenizer_json: str, val_fraction: float, workers: int, chat=None,
                 drop_scripts: frozenset[str] = frozenset()):
        self.pool: WorkerPool | None = None
        self.inline = None  # a BlockEncoder, or a chat_encode.ChatBlockEncoder when `chat` (a ChatSpec) is given
        if workers > 0:
            self.pool = WorkerPool(workers, _worker_init, (tokenizer_json, val_fraction, chat, drop_scripts))
        else:
            self.inline = _encoder(tokenizer_json, val_fraction, chat, drop_scripts)

    def submit(self, method: str, *args) -> Future:
        if self.pool is not None:
            return self.pool.submit(_worker_call, method, *args)  # its workers start deaf to Ctrl-C
        assert self.inline is not None  # one of the two is set
        return done(getattr(self.inline, method)(*args))

    def shutdown(self) -> None:
        if self.pool is not None:
            self.pool.close()


def done(value) -> Future:
    """A Future that already holds its result."""
    f: Future = Future()
    f.set_result(value)
    return f


_worker_encoder = None


def _encoder(tokenizer_json: str, val_fraction: float, chat, drop_scripts: frozenset[str] = frozenset()):
    if chat is None:
        return BlockEncoder(tokenizer_json, val_fraction, drop_scripts)
    from minilmd.corpus.prepare.chat_encode import ChatBlockEncoder
    from minilmd.corpus.prepare.dpo_encode import PairBlockEncoder

    return (PairBlockEncoder if chat.pairs else ChatBlockEncoder)(tokenizer_json, val_fraction, chat)


def _worker_init(tokenizer_json: str, val_fraction: float, chat=None,
                 drop_scripts: frozenset[str] = frozenset()) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per worker: the workers are the parallelism
    global _worker_encoder
    _worker_encoder = _encoder(tokenizer_json, val_fraction, chat, drop_scripts)


def _worker_call(method: str, *args):
    """In a pool process: BlockEncoder.<method>(*args) of the worker's encoder ("__call__": a block of lines)."""
    assert _worker_encoder is not None  # set by _worker_init in every pool process
    return getattr(_worker_encoder, method)(*args)



