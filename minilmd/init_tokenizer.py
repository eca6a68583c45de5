"""init.from's tokenizer against the corpus's: refused where they provably differ, a note where it cannot be proven.

A model trained with one tokenizer reads another tokenizer's ids as other text: an SFT or DPO stage on a corpus
prepared with another tokenizer than its pretrained model's trains that model on noise, and nothing fails. What
each side records:
  - the corpus: meta.json's `vocab_size` and `tokenizer_sha256` (the sha256 of the tokenizer.json copy it holds,
    which `minilmd prepare` encoded with);
  - init.from's checkpoint: trainer_state.json's `fingerprints.tokenizer` (its own corpus's tokenizer_sha256) and
    `config.model.vocab_size`, and a copy of that tokenizer.json beside its weights.
The sha256 alone proves nothing (the same tokenizer saved again has other bytes: indentation, another `tokenizers`
release). What proves it: another vocabulary size, or the two tokenizer.json files mapping some id to other text
(their vocabularies, `model.vocab` and `added_tokens`, compared id by id). That is refused (`mismatch`: `run
--check`, the launch before staging, and `minilmd train` on its own, all through minilmd/probes.py), naming both
tokenizers; another sha256 with no tokenizer.json to compare (one that cannot be read) stays a note (`notes`), as
does another chat template. A .pth records nothing: neither. Torch-free; files read as untrusted, bounded.
"""
from __future__ import annotations

from pathlib import Path

from minilmd.corpus_meta import meta_value
from minilmd.init_kinds import InitSource
from minilmd.names import TOKENIZER_CONFIG, TOKENIZER_CONFIG_MAX_BYTES, TOKENIZER_FILE, TOKENIZER_MAX_BYTES
from minilmd.untrusted import loads, printable


def mismatch(spec: str, prepared: str, source: InitSource, state: dict, meta: dict) -> str | None:
    """The refusal of a checkpoint `source` (init.from = `spec`, its trainer_state `state`) whose tokenizer
    provably differs from the one the corpus `prepared` (its meta.json `meta`) was prepared with; None when it does
    not, or when that cannot be proven (notes says the rest)."""
    theirs, ours = meta_value(state, "fingerprints", "tokenizer"), meta.get("tokenizer_sha256")
    if isinstance(theirs, str) and theirs == ours:
        return None
    their_size, our_size = meta_value(state, "config", "model", "vocab_size"), meta.get("vocab_size")
    sized = isinstance(their_size, int) and isinstance(our_size, int)
    if sized and their_size != our_size:
        why = f"a vocabulary of {their_size} against {our_size}"
    else:
        why = _vocabularies_differ(source.path, Path(prepared))
    if not why:
        return None
    return (f"init.from = {spec!r}: {source.path} was trained with another tokenizer than the corpus {prepared} was "
            f"prepared with ({why}; the checkpoint's tokenizer.json sha256 {_short(theirs)}, the corpus's "
            f"{_short(ours)}): the model would read the corpus's ids as other text. Prepare the corpus with the "
            f"checkpoint's tokenizer ({source.path / TOKENIZER_FILE}), or start from a model trained with the "
            f"corpus's ({Path(prepared) / TOKENIZER_FILE})")


def notes(spec: str, prepared: str, source: InitSource, state: dict, meta: dict) -> list[str]:
    """Notes, not refusals: another tokenizer.json sha256 where mismatch proves nothing (the same tokenizer saved
    again has other bytes; a tokenizer.json that cannot be read), another chat template (their
    tokenizer_config.json)."""
    said = []
    theirs, ours = meta_value(state, "fingerprints", "tokenizer"), meta.get("tokenizer_sha256")
    if isinstance(theirs, str) and isinstance(ours, str) and theirs != ours:
        said.append(f"init.from = {spec!r}: {source.path} was trained with another tokenizer than the corpus "
                    f"{prepared} was prepared with (tokenizer.json sha256 {printable(theirs)[:12]}, the corpus's "
                    f"{ours[:12]}): the same ids stand for other text; prepare the corpus with the checkpoint's "
                    f"tokenizer ({source.path / TOKENIZER_FILE})")
    ckpt_template, corpus_template = chat_template(source.path), chat_template(Path(prepared))
    if ckpt_template is not None and corpus_template is not None and ckpt_template != corpus_template:
        said.append(f"init.from = {spec!r}: {source.path} was trained with another chat template than the corpus "
                    f"{prepared} was rendered with (their {TOKENIZER_CONFIG}): the model meets its turns in another "
                    f"form; prepare the corpus with the tokenizer directory init.from's run used")
    return said


def _short(sha: object) -> str:
    return printable(sha)[:12] if isinstance(sha, str) else "not recorded"


def _vocabularies_differ(checkpoint: Path, corpus: Path) -> str:
    """How the two directories' tokenizer.json map ids to other text ("3 of 6400 ids differ: id 300 is 'ab' in
    the checkpoint's, 'cd' in the corpus's"), "" when they map every id alike or either cannot be read."""
    mine_raw, yours_raw = (read_named(folder, TOKENIZER_FILE, TOKENIZER_MAX_BYTES) for folder in (checkpoint, corpus))
    mine, yours = _vocabulary(mine_raw), _vocabulary(yours_raw)
    if mine is None or yours is None or mine == yours:
        return ""
    if len(mine) != len(yours):
        return f"{len(mine)} entries against {len(yours)}"
    differ = sorted(i for i in mine.keys() | yours.keys() if mine.get(i) != yours.get(i))
    first = differ[0]
    return (f"{len(differ)} of {len(mine)} ids stand for other text: id {first} is "
            f"{_shown(mine_raw, mine.get(first), first)} in the checkpoint's, "
            f"{_shown(yours_raw, yours.get(first), first)} in the corpus's")


def _shown(raw: bytes | None, token: str | None, token_id: int) -> str:
    """A vocabulary entry as the user reads it: the text its tokenizer decodes the id to (a byte-level BPE spells
    '与' as 'ä¸İ'), with the entry itself beside when they differ; escaped (the tokenizer may be another user's)."""
    decoded = _decoded(raw, token_id)
    if decoded is None or decoded == token:
        return printable(repr(token))
    return f"{printable(repr(decoded))} (token {printable(repr(token))})"


def _decoded(raw: bytes | None, token_id: int) -> str | None:
    """The tokenizer.json `raw`'s decode of one id (special tokens kept), None where the tokenizers library cannot
    load or decode it. Imported here, on the refusal's path alone: the supervisor's launch check runs this."""
    if raw is None:
        return None
    try:
        from tokenizers import Tokenizer

        return Tokenizer.from_str(raw.decode("utf-8")).decode([token_id], skip_special_tokens=False)
    except Exception:  # noqa: BLE001 - malformed JSON, a model the library refuses: Rust raises plain Exception
        return None


def _vocabulary(raw: bytes | None) -> dict[int, str] | None:
    """{id: token} of a tokenizer.json's bytes (its model.vocab and added_tokens), None when there are none (it
    could not be read: read_named's rules), they do not parse or hold no vocabulary."""
    try:
        parsed = loads(raw) if raw is not None else None
    except ValueError:
        return None
    model = parsed.get("model") if parsed is not None else None
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if parsed is None or not isinstance(vocab, dict):
        return None
    table = {i: token for token, i in vocab.items() if isinstance(i, int)}
    for added in parsed.get("added_tokens") or []:
        if isinstance(added, dict) and isinstance(added.get("id"), int) and isinstance(added.get("content"), str):
            table[added["id"]] = added["content"]
    return table


def chat_template(folder: Path) -> str | None:
    """The chat_template of a checkpoint's or corpus's tokenizer_config.json; None when there is none or it cannot
    be read (read_named's rules)."""
    raw = read_named(folder, TOKENIZER_CONFIG, TOKENIZER_CONFIG_MAX_BYTES)
    try:
        template = loads(raw).get("chat_template") if raw is not None else None
    except ValueError:
        return None
    return template if isinstance(template, str) else None


def read_named(folder: Path, name: str, max_bytes: int) -> bytes | None:
    """`name` in `folder`, read in the directory opened once, as a file of that directory's owner or ours
    (init_place: bounded, no link followed, no FIFO opened); None when it cannot be read so."""
    from minilmd.init_place import open_named, owners_of, read_in

    try:
        with open_named(folder) as where:
            return read_in(where, name, max_bytes, owners_of(where))
    except (OSError, ValueError):
        return None
