"""A prepared chat corpus is scanned in its messages' content, not in its template (issue 24): `corpus report`'s
scripts and `corpus count` saw "assistant" and latin in 100 % of the conversations of a Chinese chat corpus, the
role names the template writes. Checked against the JSONL the corpus was prepared from (chat_jsonl)."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from minilmd.corpus.analysis import scan
from minilmd.corpus.analysis.count import CountTask
from minilmd.corpus.analysis.report import report


@dataclass
class Texts:
    """Every document's text and length, in order."""
    texts: list[str] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)

    def fresh(self) -> Texts:
        return Texts()

    def add(self, batch: scan.Batch) -> None:
        self.texts += batch.texts
        self.lengths += batch.lengths.tolist()

    def result(self) -> Texts:
        return self


def jsonl_contents(chat_jsonl) -> list[str]:
    """What each conversation holds as content: its messages' content, a reply trimmed as the template trims it."""
    out = []
    for path in chat_jsonl:
        for line in path.read_text(encoding="utf-8").splitlines():
            conv = json.loads(line)["conversations"]
            out.append("\n".join(m["content"].strip() if m["role"] == "assistant" else m["content"] for m in conv))
    return out


def test_a_prepared_chat_document_is_its_messages_content(chat_corpus, chat_jsonl):
    prepared, _ = chat_corpus
    corpus = scan.open_corpus(str(prepared), parts=2)
    docs = [(t, n) for part in scan.run(corpus, Texts(), workers=0) for t, n in zip(part.texts, part.lengths,
                                                                                       strict=True)]
    whole = [t for t, n in docs if n < 128]  # conversations not cut at seq_len (128)
    assert len(whole) > 600, len(whole)
    contents = set(jsonl_contents(chat_jsonl))
    assert [t for t in whole if t not in contents] == []
    assert not any(t.startswith(("system", "user\n")) or "<think" in t for t, _ in docs)


def test_role_names_and_the_template_are_not_counted(chat_corpus, chat_jsonl):
    prepared, _ = chat_corpus
    by_hand = jsonl_contents(chat_jsonl)
    patterns = ["assistant", "user", "你是助手", "think"]
    parts = scan.run(scan.open_corpus(str(prepared), parts=2), CountTask(patterns), workers=0)
    found = [sum(p.documents[i] for p in parts) for i in range(len(patterns))]
    expected = [sum(p in t for t in by_hand) for p in patterns]  # at most: some were cut at 128 tokens or in val
    assert all(f <= e for f, e in zip(found, expected, strict=True)), (found, expected)
    assert found[2] == 0 and found[0] < 10, found  # the template's default system prompt; "assistant" in 100 % before

    r = report(str(prepared), workers=0)
    latin = r["scripts"]["contains"].get("latin", 0)
    latin_by_hand = sum(bool(re.search(r"[A-Za-z]", t)) for t in by_hand)
    # 300 English conversations and the Chinese ones that hold a latin word ("什么是ai"), not 100 % of 767
    assert 300 <= latin <= latin_by_hand < r["documents"], (latin, latin_by_hand, r["documents"])
