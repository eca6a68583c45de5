"""minilmd/corpus/cli_options.py: --group-share and --force are defined once, so that no command's help or default
drifts from the rule. Before, each of tokenizer train/template, prepare, demo-corpus, export and plot declared its own,
their help copied and reworded apart (tokenizer template's said only "as tokenizer train --group-share")."""
from __future__ import annotations

import re
from pathlib import Path

import click
import typer

from minilmd.cli import app
from minilmd.corpus.cli_options import FORCE_RULE, GROUP_SHARE_RULE

CLI = Path(__file__).resolve().parent.parent / "minilmd" / "cli"


def shared_options(flag: str) -> dict[str, click.Parameter]:
    """Every command's option `flag`, by the command's path ("tokenizer train")."""
    found = {}

    def walk(command: click.Command, path: str) -> None:
        for param in command.params:
            if flag in param.opts:
                found[path] = param
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, f"{path} {name}".strip())

    walk(typer.main.get_command(app), "")
    return found


def test_every_group_share_states_the_one_rule_and_is_off_by_default():
    options = shared_options("--group-share")
    assert {"tokenizer train", "tokenizer template", "prepare", "demo-corpus", "export", "plot"} <= set(options)
    for command, option in options.items():
        assert option.default is False and option.is_flag, command
        assert GROUP_SHARE_RULE in option.help, (command, option.help)


def test_every_force_states_what_is_refused_without_it_and_is_off_by_default():
    options = shared_options("--force")
    assert {"tokenizer train", "tokenizer template", "prepare", "demo-corpus", "export"} <= set(options)
    for command, option in options.items():
        assert option.default is False and option.is_flag, command
        assert option.help.startswith("Replace ") and option.help.endswith(FORCE_RULE), (command, option.help)


def test_no_command_module_declares_them_itself():
    declared = {path.name: re.findall(r'typer\.Option\([^)]*"--(?:group-share|force)"', path.read_text())
                for path in CLI.glob("*.py")}
    assert not any(declared.values()), declared
