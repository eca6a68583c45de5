"""meta.json of a prepared corpus as `minilmd prepare` builds it (minilmd/corpus/prepare/pipeline.py): the file
table, the splits, the split rule, the leak check, the figures (a chat corpus's own), and the report prepare and
`prepare --append` print from it."""
from __future__ import annotations

import hashlib
import time
from pathlib import Path

import numpy as np

from minilmd.corpus.analysis import stats as corpus_stats
from minilmd.corpus.analysis.report import prepare_summary
from minilmd.corpus.prepare.block import fraction_above
from minilmd.corpus.prepare.collect import Collector
from minilmd.corpus.prepare.dpo_meta import report_pairs
from minilmd.corpus.prepare.options import PrepareOptions, PrepareTokenizer
from minilmd.corpus_meta import DATA_FORMATS, FORMAT, MASKED_FORMATS
from minilmd.names import CORPUS_META as META
from minilmd.names import CORPUS_TOKENIZER, DOC_LENGTHS, LOSS_MASK, SPLITS, TOKENIZER_CONFIG, TOKENS, split_file
from minilmd.protocol import BOS_ID, EOS_ID, PAD_ID
from minilmd.rowcount import packed_too_small
from minilmd.untrusted import printable, sha256_regular

MIN_VAL_CONVERSATIONS = 64
"""Fewer val conversations than this (data.val_windows' default: the rows a val loss reads) are warned of: a
chat corpus's val rows are whole conversations, and the default --val-fraction of a small one leaves a handful."""


def file_table(tmp: Path, train_tokens_sha: str, chat: bool = False) -> dict[str, dict]:
    """Size and sha256 of every file, as meta.json lists them (train tokens were hashed while written)."""
    files = {}
    names = (TOKENS, DOC_LENGTHS, LOSS_MASK) if chat else (TOKENS, DOC_LENGTHS)
    top = [CORPUS_TOKENIZER, TOKENIZER_CONFIG] if chat else [CORPUS_TOKENIZER]
    for rel in [split_file(s, n) for s in SPLITS for n in names] + top:
        path = tmp / rel
        sha = train_tokens_sha if rel == split_file(SPLITS[0], TOKENS) else sha256_regular(path)
        files[rel] = {"size": path.stat().st_size, "sha256": sha}
    return files


def build_meta(tmp: Path, tok: PrepareTokenizer, opts: PrepareOptions, found: Collector, train_lengths: np.ndarray,
          val_lengths: np.ndarray, leaked: np.ndarray, leak_examples: list[str]) -> dict:
    """meta.json's content."""
    stats = {
        "train": corpus_stats.split_stats(train_lengths, opts.seq_len, opts.batch_size),
        "val": corpus_stats.split_stats(val_lengths, opts.seq_len, opts.batch_size),
        "documents_with_special_ids_inside": found.special_docs,
        "special_ids_inside_examples": found.special_examples,
        "input_text_bytes": found.text_bytes,
    }
    return {
        "format": FORMAT,
        "version": DATA_FORMATS[opts.data_format],
        "data_format": opts.data_format,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "vocab_size": tok.vocab_size,
        "special_ids": {"pad": PAD_ID, "bos": BOS_ID, "eos": EOS_ID},
        "tokenizer_sha256": sha256_regular(tmp / CORPUS_TOKENIZER),
        "token_dtype": "uint16 little-endian",
        "doc_lengths_dtype": "int32",
        "document_layout": "[BOS] ids [EOS], no PAD stored; doc length counts BOS and EOS",
        "splits": {
            "train": {"documents": int(train_lengths.size), "tokens": int(train_lengths.sum())},
            "val": {"documents": int(val_lengths.size), "tokens": int(val_lengths.sum())},
        },
        "files": file_table(tmp, found.train.sha.hexdigest(), found.chat),
        "sources": found.sources,
        "split_rule": {
            "rule": "val iff int.from_bytes(blake2b(text.encode('utf-8'), digest_size=8).digest(), 'little') "
                    "< val_fraction * 2**64",
            "val_fraction": opts.val_fraction,
        },
        "leak_check": {
            "key": "blake2b-64 of the text with all whitespace removed (exact duplicates share a split by the rule)",
            "val_documents_checked": int(leaked.size),
            "leaked_documents": int(leaked.sum()),
            "removed_from_val": int(leaked.sum()),
            "examples": leak_examples,
        },
        "stats": stats,
        "bad_lines": {"policy": opts.on_bad_line, "total": sum(found.bad_counts.values()),
                      "by_reason": dict(sorted(found.bad_counts.items())), "examples": found.bad_examples},
    }


def add_chat_meta(meta: dict, tok: PrepareTokenizer, opts: PrepareOptions, found: Collector,
                   train_lengths: np.ndarray, val_lengths: np.ndarray, leaked: np.ndarray) -> None:
    """A chat corpus's meta.json: its figures per split replace the text ones (packing does not apply), the
    target tokens per split, the length rule and what it cut and dropped."""
    assert tok.chat_config is not None
    facts = {"train": found.train.all_facts(), "val": found.val_raw.all_facts()[~leaked]}
    lengths = {"train": train_lengths, "val": val_lengths}
    stats = meta["stats"]
    for split in SPLITS:
        stats[split] = corpus_stats.chat_split_stats(lengths[split], facts[split], opts.seq_len, opts.batch_size)
        meta["splits"][split]["target_tokens"] = stats[split]["target_tokens"]
    counts = found.chat_counts
    meta["chat"] = {
        "seq_len": opts.seq_len,
        "on_long": opts.on_long,
        "cut": sum(stats[split]["cut"] for split in SPLITS),
        "dropped_long": counts.get("dropped_long", 0),
        "dropped_no_target": counts.get("dropped_no_target", 0),
        "conversations_with_special_text": counts.get("special_text", 0),
        "conversations_with_ignored_keys": counts.get("ignored_keys", 0),
        "ignored_keys_examples": found.ignored_examples,
        "template_sha256": hashlib.sha256(tok.chat_config["chat_template"].encode("utf-8")).hexdigest(),
        "target_rule": "every token of an assistant reply after its '<|im_start|>assistant\\n' header up to and "
                       "including its '<|im_end|>'; a token counts where its first character is",
    }
    meta["split_rule"]["text"] = "a conversation's canonical JSON: its messages, keys sorted, compact, UTF-8"


def _unit(meta: dict) -> str:
    """What prepare counts as one of a masked corpus's items: a preference corpus's pairs (two documents each),
    a chat corpus's conversations."""
    return "pairs" if meta["data_format"] == "dpo" else "conversations"


def _report_chat(meta: dict, log) -> None:
    for split in SPLITS:
        log(corpus_stats.format_chat_report(split, meta["stats"][split]))
    c, unit = meta["chat"], _unit(meta)  # a preference corpus's counts are its pairs' (dpo_encode.py)
    dropped = [f"{c['dropped_long']:,} {unit} longer than seq_len {c['seq_len']}"] if c["dropped_long"] else []
    if c["dropped_no_target"]:
        dropped.append(f"{c['dropped_no_target']:,} whose replies all fall past the cut at {c['seq_len']}")
    if dropped:  # the policy this prepare ran under, cut (the default) or drop
        log(f"dropped: {', '.join(dropped)} (--on-long {c['on_long']})")
    if c.get("conversations_with_ignored_keys"):  # absent from a corpus prepared before they were counted
        log(f"kept without keys MiniMind's template never renders: {c['conversations_with_ignored_keys']:,} "
            f"{unit} (tools off a system message, tool_calls off an assistant one, tool_call_id, name), e.g. "
            f"{'; '.join(c['ignored_keys_examples'][:3])}")


def report(meta: dict, log) -> None:
    stats = meta["stats"]
    if meta["data_format"] in MASKED_FORMATS:
        _report_chat(meta, log)
    else:
        log(corpus_stats.format_report("train", stats["train"]))
        train = stats["train"]
        if too_small := packed_too_small(train["lengths"]["tokens"], train["seq_len"]):  # 0 windows: a warning
            log(f"warning: {too_small}: a packed run on it fails at its start (`minilmd run --check` says so)")
    if meta["data_format"] == "dpo":
        for line in report_pairs(meta):
            log(line)
    for line in prepare_summary(meta):
        log(line)
    v = meta["splits"]["val"]
    fraction = meta["split_rule"]["val_fraction"]
    log(f"val: {v['documents']:,} documents, {v['tokens']:,} tokens (val fraction {fraction})")
    lc = meta["leak_check"]
    log(f"leak check: {lc['leaked_documents']:,} of {lc['val_documents_checked']:,} val documents also in train "
        f"(whitespace ignored), removed from val" + (f": {', '.join(lc['examples'])}" if lc["examples"] else ""))
    if v["documents"] == 0:
        log("warning: --val-fraction 0: no val split; `minilmd train` refuses a corpus without one")
    elif meta["data_format"] in MASKED_FORMATS and (few := _few_val(meta)):
        log(few)
    bad = meta["bad_lines"]
    if bad["total"]:
        counts = ", ".join(f"{reason.replace('_', ' ')} {n:,}" for reason, n in bad["by_reason"].items())
        log(f"skipped {bad['total']:,} bad lines: {counts}")
    if stats["documents_with_special_ids_inside"]:
        log(f"warning: {stats['documents_with_special_ids_inside']:,} documents contain a literal special token "
            f"(<|endoftext|>, <|im_start|> or <|im_end|>) that encodes to id 0/1/2 inside the document, e.g. "
            f"{', '.join(stats['special_ids_inside_examples'][:3])}: each trains as that token (a document's end "
            f"or a turn's marker in the middle of its text); if they are text, not markers, remove them from the "
            f"source (`minilmd corpus count '<|im_end|>' '<|im_start|>' '<|endoftext|>' SOURCE.jsonl` counts them) "
            f"and prepare again; if they are meant, nothing to do")


def _few_val(meta: dict) -> str:
    """The warning of a val split of fewer than MIN_VAL_CONVERSATIONS items (a preference corpus: pairs, which
    DPO's validation draws; data.val_windows counts them too), "" when it holds that many. The --val-fraction it
    suggests gives at most half the corpus, and says so when that is fewer than MIN_VAL_CONVERSATIONS.

    The split goes by a hash of each text, so identical texts fall on one side: a corpus of many copies gets far
    fewer at MIN / total than MIN. Once the fraction in use is that share already, the suggestion scales it by what
    it gave instead, so that it is always above the fraction that fell short (before: `val fraction 0.026 ...
    --val-fraction 0.026 gives about 64`, the same advice again on the demo's chat corpus)."""
    key = "pairs" if meta["data_format"] == "dpo" else "documents"
    n_val, unit, fraction = meta["splits"]["val"][key], _unit(meta), meta["split_rule"]["val_fraction"]
    if n_val >= MIN_VAL_CONVERSATIONS:
        return ""
    total = n_val + meta["splits"]["train"][key]
    share = MIN_VAL_CONVERSATIONS / total
    scaled = n_val > 0 and fraction >= share
    suggested = min(0.5, fraction_above(fraction * MIN_VAL_CONVERSATIONS / n_val if scaled else share))
    expected = min(total, suggested * (n_val / fraction if scaled else total))  # at the rate it saw, if scaled
    gives = f"about {expected:.0f}" + (
        f" (as {fraction} gave {n_val:,}: identical texts fall on the same side of the split)" if scaled else "") + (
        f" (the corpus holds only {total:,} {unit})" if suggested * total < MIN_VAL_CONVERSATIONS else "")
    return (f"warning: val holds only {n_val:,} of {total:,} {unit} (val fraction {fraction}): its loss, which early "
            f"stopping and the best checkpoint follow, is that few {unit}' noise; --val-fraction {suggested:.2g} "
            f"gives {gives}")


PREPARED_AT = "prepared_at"
"""meta.json's record of where prepare published the corpus: its name and its directory's inode (the temporary
directory's, renamed in place: the same inode). What `prepare --force` in a team directory asks before it replaces a
corpus, since a name proves nothing where others may rename (`made_here`). Not its directory: moving a directory
to another one needs write permission on it (its `..`), which a teammate lacks on the user's 0755 corpus."""


def prepared_at(corpus: tuple[int, int], name: str) -> dict:
    """The record of a corpus made in the directory of identity `corpus` (device, inode), to be published as
    `name`. The inode only: a network share's device number changes when it is mounted again, its inodes do not."""
    return {"name": name, "inode": corpus[1]}


def made_here(meta: dict, corpus: tuple[int, int], name: str) -> str:
    """"" when meta.json (the corpus's own, read through the directory judged) records that prepare published this
    very directory (`corpus`: its identity) as `name`; else why not, for the refusal. A teammate can rename the
    user's other corpus to the name: it keeps its own record; a copy has another inode."""
    record = meta.get(PREPARED_AT)
    if not isinstance(record, dict):
        return f"its {META} records no name it was prepared as (an older minilmd's corpus)"
    if record.get("inode") != corpus[1]:
        return f"its {META} was written for another directory (a copy of a corpus)"
    was = record.get("name")
    if was != name:
        return f"it was prepared as {printable(str(was))!r} and renamed to this name since"
    return ""
