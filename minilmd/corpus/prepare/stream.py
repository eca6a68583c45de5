"""The streaming half of `minilmd prepare` and `prepare --append` (minilmd/corpus/prepare/pipeline.py, append.py):
the sources opened one at a time (checked and measured up front: minilmd/corpus/sources/source_list.py), read in
blocks of whole lines (a line longer than a block parsed as it is read:
minilmd/corpus/sources/longdoc.py, its text sent in pieces), encoded by the worker processes
(minilmd/corpus/prepare/encode.py) and collected in input order (minilmd/corpus/prepare/collect.py), a bounded
number in flight; its progress on stderr (minilmd/corpus/progress.py)."""
from __future__ import annotations

import hashlib
from collections import deque
from concurrent.futures import Future

from minilmd.corpus.analysis.scripts import script_matrix
from minilmd.corpus.prepare.block import EncodedBlock
from minilmd.corpus.prepare.chat_encode import chat_blocks, longest_token, text_limit
from minilmd.corpus.prepare.collect import Collector, LongEnd
from minilmd.corpus.prepare.encode import Encoders, done
from minilmd.corpus.prepare.options import PrepareOptions, PrepareTokenizer
from minilmd.corpus.progress import Progress
from minilmd.corpus.sources.jsonl import LongLine, Source
from minilmd.corpus.sources.longdoc import PieceCutter, parse_chunks
from minilmd.corpus.workers import default_workers


def encode_all(found: Collector, tok: PrepareTokenizer, opts: PrepareOptions, progress: Progress | bool | None
               ) -> None:
    """Blocks of whole lines, and the pieces of long lines, of each of found's sources -> worker processes ->
    `found`, in input order, a bounded number in flight. One source is open at a time, read to its end and closed
    before the next is opened (the workers get its bytes, never the file): however many the sources, they never
    hold more than one descriptor among them, where all held at once ran out of them (EMFILE) past the soft limit
    of open files."""
    total_bytes = sum(s["bytes"] for s in found.sources)  # as measured up front
    if progress is None or progress is True:
        progress = Progress(total_bytes)
    elif progress is False:
        progress = None
    workers = default_workers() if opts.workers is None else opts.workers
    chat = tok.chat_spec(opts)
    encoders = Encoders(tok.json, opts.val_fraction, workers, chat, opts.drop_scripts)
    found.threshold = int(opts.val_fraction * 2**64)
    found.drop_scripts = opts.drop_scripts
    pending: deque = deque()
    max_in_flight = 2 * max(workers, 1) + 1
    done_before = 0  # raw bytes of the sources already finished
    src: Source | None = None

    def submit(src_idx: int, kind: str, future: Future) -> None:
        pending.append((src_idx, kind, future))
        while len(pending) >= max_in_flight:
            found.take(*_result(pending.popleft()))
            if progress and src is not None:
                progress.update(done_before + src.position, found.tokens, found.documents)

    try:
        for src_idx, path in enumerate(found.paths):
            src = Source(path)  # Source's checks again on this open: the file read passes them too
            try:
                # A chat line is held whole (pipeline.py's docstring), up to chat_encode's bound.
                items = src.items(opts.block_bytes) if chat is None else chat_blocks(
                    src, opts.block_bytes, text_limit(chat.seq_len, longest_token(tok.json)))
                for item in items:
                    if isinstance(item, LongLine):
                        _stream_long_line(item, src_idx, encoders, submit)
                    elif isinstance(item, EncodedBlock):  # a chat line too long to hold: a bad line
                        submit(src_idx, "block", done(item))
                    else:
                        first_line, blob = item
                        submit(src_idx, "block", encoders.submit("__call__", blob, first_line))
            finally:
                src.close()
            found.read_through(src_idx, src)
            done_before += src.size
        while pending:
            found.take(*_result(pending.popleft()))
        if progress:
            progress.update(total_bytes, found.tokens, found.documents, force=True)
    finally:
        for _, _, f in pending:
            f.cancel()
        encoders.shutdown()
        if progress:
            progress.close()
        found.close()


def _result(entry: tuple[int, str, Future]) -> tuple[int, str, object]:
    src_idx, kind, future = entry
    return src_idx, kind, future.result()


def _stream_long_line(long: LongLine, src_idx: int, encoders: Encoders, submit) -> None:
    """A line too long to hold, as it is read: parsed in chunks, its text cut into pieces for the workers; its
    end, with the verdict and the hashes of the whole text, follows its pieces."""
    doc = _LongText(lambda piece: submit(src_idx, "piece", encoders.submit("encode_piece", piece)))

    def restart() -> None:  # another top-level "text": the last one is the document
        doc.reset()
        submit(src_idx, "restart", done(None))

    verdict = parse_chunks(long.chunks(), doc.add, restart)
    doc.finish()
    submit(src_idx, "long_end", done(LongEnd(long.line, verdict, _digest_int(doc.digest), _digest_int(doc.key),
                                              doc.text_bytes, doc.scripts)))


class _LongText:
    """The text of a long line as it streams by: cut into pieces (handed to `send`), hashed on the way for the split
    rule and the leak key of the whole text (blake2b is the same fed in parts)."""

    def __init__(self, send):
        self.send = send
        self.reset()

    def reset(self) -> None:
        self.cutter = PieceCutter()
        self.digest = hashlib.blake2b(digest_size=8)
        self.key = hashlib.blake2b(digest_size=8)
        self.text_bytes = 0
        self.scripts = script_matrix([])[:1].sum(axis=0)  # its characters by script, piece by piece
        self.encodable = True  # no lone surrogate so far (with one, the line is bad: nothing more is encoded)

    def add(self, fragment: str) -> None:
        for piece in self.cutter.add(fragment):
            self._piece(piece)

    def finish(self) -> None:
        for piece in self.cutter.finish():
            self._piece(piece)

    def _piece(self, piece: str) -> None:
        if not self.encodable:
            return
        try:
            data = piece.encode("utf-8")
        except UnicodeEncodeError:
            self.encodable = False
            return
        self.digest.update(data)
        self.key.update("".join(piece.split()).encode("utf-8"))
        self.text_bytes += len(data)
        self.scripts = self.scripts + script_matrix([piece])[0]
        self.send(piece)


def _digest_int(h) -> int:
    return int.from_bytes(h.digest(), "little")
