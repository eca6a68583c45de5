"""The options several commands share, each defined here once: its flag, its default and the rule its help states.

`--group-share` (tokenizer train/template, prepare, demo-corpus, export, plot) and `--force` (tokenizer
train/template, prepare, demo-corpus, export) were declared in each command, their help copied and reworded apart
(one said what the team could do, another not; one ended "nothing written", another not). Now a command names only
what is its own: the place the option is about, what `--force` replaces, a sentence more; the rule's words, the
flag and its default (off) are these. tests/test_cli_options.py checks that no command declares them itself.
Typer only. Here, beside exits.py, not in minilmd/cli/: a module of that package imported by the corpus commands
would bring its __init__, which imports every group, the trainer's too (tests/test_layers.py).
"""
from __future__ import annotations

from typing import Any

import typer

GROUP_SHARE_RULE = ("is a team directory other users may write (group-writable, not sticky): use it anyway. Without "
                    "it such a directory is refused (they could swap what is written there); with it every file "
                    "there is still made, moved and removed through the directory opened once.")
"""What --group-share does wherever it is taken (minilmd/place_rule.py: `group_share`)."""
FORCE_RULE = "Without it an output already there is refused, nothing written."
"""What a command does without --force (minilmd/fsio.py `out_taken`)."""


def group_share_option(place: str = "--out's directory", more: str = "") -> Any:
    """--group-share for a command writing into `place`; `more`: a sentence of that command's own."""
    return typer.Option(False, "--group-share", help=" ".join(filter(None, [f"{place} {GROUP_SHARE_RULE}", more])))


def force_option(replaces: str) -> Any:
    """--force for a command whose outputs are `replaces` (words after "Replace")."""
    return typer.Option(False, "--force", help=f"Replace {replaces}. {FORCE_RULE}")
