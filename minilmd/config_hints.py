"""What an unknown name in a run config probably is (user10 #4): a MiniMind, PEFT or HF Trainer name
(minimind_names.py), a key written in the wrong section (`[model] lr`: did you mean train.lr?), a typo of any
section's key (`train.log_evry`: did you mean train.log_every?), or a key above every section header (a missing
`[run]`). Torch-free; imports only minimind_names."""
from __future__ import annotations

import difflib
import re

from minilmd.minimind_names import unknown_key_hint

TYPO_CUTOFF = 0.75
"""difflib's ratio against the whole `section.key` above which a name is offered: 0.97 for train.log_evry, 0.67
for train.bogus -> train.seed, which is no guess worth making."""
KEY_TYPO_CUTOFF = 0.85
"""The same against the key alone, in any section (`[model] seq_lenn` -> train.seq_len): stricter, as the section
does not help."""


def _dotted(known: dict[str, list[str]]) -> list[str]:
    return [f"{s}.{k}" for s, keys in known.items() for k in keys]


def key_hint(section: str, key: str, known: dict[str, list[str]]) -> str:
    """"did you mean S.K?" (or the foreign name's line) for an unknown `section.key`, "" without a good guess.
    `known`: each section's keys, those the user may set."""
    foreign = unknown_key_hint(section, key)
    if foreign:
        return foreign
    # `[eval] every` is train.eval_every rather than sync.every: the section's own name joined to the key first
    elsewhere = ([f"{s}.{section}_{key}" for s, keys in known.items() if f"{section}_{key}" in keys]
                 or [f"{s}.{key}" for s, keys in known.items() if key in keys and s != section])
    if elsewhere:
        return f"did you mean {' or '.join(elsewhere)}?"
    close = difflib.get_close_matches(f"{section}.{key}", _dotted(known), n=1, cutoff=TYPO_CUTOFF)
    if not close:
        by_key = {k: f"{s}.{k}" for s, keys in known.items() for k in keys}
        close = [by_key[k] for k in difflib.get_close_matches(key, list(by_key), n=1, cutoff=KEY_TYPO_CUTOFF)]
    return f"did you mean {close[0]}?" if close else ""


_MEANT = re.compile(r"did you mean ([a-z_]+\.[a-z_]+(?: or [a-z_]+\.[a-z_]+)*)\?")


def meant_keys(hint: str) -> list[str]:
    """The `section.key`s a key_hint offers ("did you mean train.max_epochs?", "... A or B?"): fields the user meant
    to set, whose defaults stand in their place (config.py takes them as invalid: what derives from them waits)."""
    found = _MEANT.match(hint)
    return found.group(1).split(" or ") if found else []


def top_level_problem(name: str, value: object, known: dict[str, list[str]]) -> str:
    """The problem of a top-level `name` that is no section: a key outside any section (a value, not a table), or
    an unknown section."""
    if isinstance(value, dict):
        close = difflib.get_close_matches(name, list(known), n=1, cutoff=TYPO_CUTOFF)
        hint = unknown_key_hint("", name)  # a MiniMind name as a table header
        return f"unknown section [{name}]" + (f": {hint}" if hint else f": did you mean [{close[0]}]?" if close
                                             else f" (known: {', '.join(known)})")
    owners = [s for s, keys in known.items() if name in keys]
    if owners:
        guess = " or ".join(f"{s}.{name}" for s in owners)
        headers = " or ".join(f"[{s}]" for s in owners)
        return f"key {name} outside any section: did you mean {guess} (a missing {headers} header?)"
    hint = key_hint("", name, known)
    return f"key {name} outside any section" + (f": {hint}" if hint else f" (the sections: {', '.join(known)})")
