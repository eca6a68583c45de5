"""Helpers for the data tests ([A]): small real corpora from the demo source, a small tokenizer, decoding."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from minilmd.corpus.demo_text import write_demo_corpus
from minilmd.corpus.prepare.pipeline import prepare
from minilmd.corpus.sources.train_texts import iter_texts
from minilmd.corpus.tokenizer_train import train_tokenizer
from minilmd.protocol import BOS_ID, EOS_ID

REPO = Path(__file__).resolve().parents[1]
MINIMIND_TOKENIZER = REPO / ".." / "shared" / "minimind-tokenizer" / "tokenizer.json"


def demo_slice(out_dir: Path, docs_per_file: int) -> list[str]:
    return [str(p) for p in write_demo_corpus(out_dir, max_docs_per_file=docs_per_file)]


def small_tokenizer(corpus: list[str], out: Path, vocab_size: int = 512) -> Path:
    train_tokenizer(iter_texts(corpus), vocab_size, out)
    return out


def run_prepare(sources, tokenizer, out, **kw):
    """`prepare` in this process (no worker processes, no progress line unless asked): (its meta, what it logged)."""
    kw.setdefault("workers", 0)
    kw.setdefault("progress", False)
    logged = []
    meta = prepare([str(s) for s in sources], tokenizer, out, log=logged.append, **kw)
    return meta, "\n".join(logged)


def write_jsonl(path: Path, texts: list[str]) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")
    return path


def read_texts(paths: list[str]) -> list[str]:
    return list(iter_texts(paths))


def decoded_documents(stream, tok) -> list[str]:
    """Decode each document of a TokenStream between its BOS and EOS."""
    out = []
    for d in range(stream.n_docs):
        doc = np.asarray(stream.document(d))
        assert doc[0] == BOS_ID and doc[-1] == EOS_ID
        out.append(tok.decode(doc[1:-1].tolist(), skip_special_tokens=False))
    return out


def no_leftovers(out: Path) -> bool:
    """Nothing of a prepare to `out` is there: neither `out` nor a temporary or aside name beside it."""
    return not out.exists() and not list(out.parent.glob(f".{out.name}.*"))
