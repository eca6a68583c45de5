"""The docs promise only what exists: every `minilmd ...` command line and every config key written in README.md,
docs/ and deploy/ is checked against the real CLI and the real config schema."""
from __future__ import annotations

import re
import shlex
import sys
from dataclasses import fields
from pathlib import Path

import pytest
import typer

from minilmd.cli import app
from minilmd.config import ConfigError, RunConfig, config_from_dict

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parent.parent
DOCS = sorted([REPO / "README.md", *REPO.glob("docs/*.md"), *REPO.glob("deploy/*.md")])
SECTIONS = {f.name: {g.name for g in fields(f.default_factory())} for f in fields(RunConfig) if f.name != "source"}
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
INLINE_COMMAND = re.compile(r"`(minilmd [^`]+)`")
CONFIG_KEY = re.compile(r"`\[?(run|data|model|train|gpu|sync|restart|log)\]?\.([a-z_]+)")


def command_lines(text: str) -> list[str]:
    """`minilmd ...` lines from fenced blocks (after an optional prompt) and from inline code."""
    found = [m.group(1) for m in INLINE_COMMAND.finditer(text)]
    for lang, body in FENCE.findall(text):
        if lang in ("toml", "json", "text", "mermaid"):
            continue
        for line in body.splitlines():
            line = re.sub(r"^\s*(\$|#)?\s*", "", line)
            for part in re.split(r"&&|\|\||;", line):
                part = part.strip()
                if part.startswith("minilmd "):
                    found.append(part)
    return found


def is_group(command) -> bool:
    # typer ships its own copy of click in recent versions: duck-type rather than isinstance(click.Group)
    return hasattr(command, "commands")


def check_command(root, line: str) -> str | None:
    """None if `line` names an existing command with existing options, else what is wrong."""
    line = re.split(r"\s(?:\||>|2>|#)\s?", line)[0]
    try:
        words = shlex.split(line)[1:]
    except ValueError:
        words = line.split()[1:]
    command = root
    path = ["minilmd"]
    while is_group(command) and words and not words[0].startswith("-"):
        if words[0] not in command.commands:
            if words[0].isupper() or "/" in words[0] or "." in words[0]:
                break  # a placeholder or a path, not a subcommand
            return f"{' '.join(path)} has no subcommand {words[0]!r}"
        command = command.commands[words[0]]
        path.append(words.pop(0))
    if is_group(command):
        return f"{' '.join(path)} is a group, the line names no command"
    known = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)} | {"--help"}
    for word in words:
        if word.startswith("-") and word != "-":
            name = word.split("=", 1)[0]
            if name not in known:
                return f"{' '.join(path)} has no option {name!r} (known: {sorted(known)})"
    return None


def test_the_docs_exist():
    names = {p.name for p in DOCS}
    assert "README.md" in names


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_documented_command_exists(doc):
    root = typer.main.get_command(app)
    problems = [f"{line}: {why}" for line in command_lines(doc.read_text(encoding="utf-8"))
                if (why := check_command(root, line))]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_documented_config_key_exists(doc):
    text = doc.read_text(encoding="utf-8")
    problems = [f"{s}.{k}" for s, k in CONFIG_KEY.findall(text) if k not in SECTIONS[s]]
    for lang, body in FENCE.findall(text):
        if lang != "toml":
            continue
        try:
            config_from_dict(tomllib.loads(body))
        except ConfigError as e:
            problems += [p for p in e.problems if p.startswith("unknown")]
    assert not problems, f"{doc.name} names config keys that do not exist: {problems}"


def test_the_checker_catches_what_does_not_exist():
    root = typer.main.get_command(app)
    assert check_command(root, "minilmd frobnicate now") is not None
    assert check_command(root, "minilmd bench") is not None
    assert command_lines("run `minilmd status --json` then\n```bash\n$ minilmd logs -f\n```\n") == [
        "minilmd status --json", "minilmd logs -f"]
    assert CONFIG_KEY.findall("set `train.nonexistent`") == [("train", "nonexistent")]


def commands(command, path=()):
    """(path, command) of every command under `command`, groups walked."""
    if is_group(command):
        for name, sub in command.commands.items():
            yield from commands(sub, (*path, name))
    else:
        yield path, command


def undocumented_options(root, texts: list[str]) -> list[str]:
    """`PATH --option` for each long option of a command that no paragraph of `texts` names together with the
    command (`minilmd logs RUN -f` alone leaves `--follow` unsaid: what --help shows cannot be found in the docs)."""
    paragraphs = [p for text in texts for p in re.split(r"\n\s*\n", text)]
    missing = []
    for path, command in commands(root):
        named = re.compile(rf"(?<![\w-]){re.escape(' '.join(path))}(?![\w-])")
        near = [p for p in paragraphs if named.search(p)]
        for param in command.params:
            longs = [o for o in (*param.opts, *param.secondary_opts) if o.startswith("--")]
            said = re.compile("|".join(re.escape(o) for o in longs) + r"(?![\w-])") if longs else None
            if said and not getattr(param, "hidden", False) and not any(said.search(p) for p in near):
                missing.append(f"{' '.join(path)} {longs[0]}")
    return missing


def test_every_option_of_every_command_is_documented():
    """Each option --help lists is in README.md or docs/, in a paragraph that names its command (user report 6:
    sample's and chat's --max-new-tokens, --temperature, --top-p, --top-k, --seed, plot --title, logs --follow and
    --lines were in --help only; this suite checked that what the docs name exists, not the other way round)."""
    root = typer.main.get_command(app)
    missing = undocumented_options(root, [doc.read_text(encoding="utf-8") for doc in DOCS])
    assert not missing, "options in --help that no doc names beside their command: " + ", ".join(missing)


def test_the_option_checker_wants_the_option_beside_its_command():
    root = typer.main.get_command(app)
    said = "`minilmd logs RUN --follow`\n\n`minilmd sample CKPT --top-k 5`"
    missing = undocumented_options(root, [said])
    assert "logs --follow" not in missing and "sample --top-k" not in missing
    assert "logs --lines" in missing and "sample --top-p" in missing
    assert "sample --top-k" in undocumented_options(root, ["`minilmd sample CKPT`\n\n`--top-k 5`"])


TEST_REF = re.compile(r"tests/([\w/]+\.py)::(\w+)|(?<=[ `,])::(\w+)")


def test_references_to_tests_name_tests_that_exist():
    """A doc that cites a test as its proof (docs/failure-modes.md's tables) cites one that is there: `tests/F.py::T`,
    and `::T` after it for another test of the same file (a parametrized test is cited by its function name)."""
    problems = []
    for doc in DOCS:
        current = None
        for m in TEST_REF.finditer(doc.read_text(encoding="utf-8")):
            if m.group(1):
                current, name = REPO / "tests" / m.group(1), m.group(2)
            else:
                name = m.group(3)
            if current is None:
                problems.append(f"{doc.name}: ::{name} without a file before it")
            elif not current.is_file():
                problems.append(f"{doc.name}: {current.relative_to(REPO)} does not exist")
            elif not re.search(rf"^(?:async )?def {re.escape(name)}\(", current.read_text(encoding="utf-8"), re.M):
                problems.append(f"{doc.name}: {current.relative_to(REPO)} has no test {name}")
    assert not problems, "\n".join(problems)


def test_the_readme_picture_is_made_by_a_script_the_docs_name():
    """Issue 39: docs/img/demo-curves.png was older than what `plot` draws, and nothing said how to make it again."""
    import os
    import subprocess

    script = REPO / "scripts" / "demo-curves.sh"
    for doc in (REPO / "README.md", REPO / "docs" / "operations.md"):
        text = doc.read_text(encoding="utf-8")
        assert "docs/img/demo-curves.png" in text and "scripts/demo-curves.sh" in text, doc.name
    assert os.access(script, os.X_OK) and subprocess.run(["bash", "-n", str(script)]).returncode == 0
    body = script.read_text(encoding="utf-8")
    assert "-m minilmd.daemon.demo" in body and 'plot "$work/demo/run" --out "$root/docs/img/demo-curves.png"' in body


RUN_ARG_COMMANDS = ("status", "logs", "stop", "plot", "forget")
"""The commands whose run argument daemon/views/runarg.py resolves: exit 2 refuses a third user's link or config."""


def test_the_help_of_each_run_argument_command_lists_the_refusal_of_a_third_users_link():
    """Their --help listed "2 not a run" (forget: "0 forgotten, 1 no such run of yours") after the refusal came,
    which docs/operations.md describes (review 6, finding 4)."""
    from minilmd.daemon.views.runarg import NOT_A_RUN

    root = typer.main.get_command(app)
    operations = " ".join((REPO / "docs" / "operations.md").read_text(encoding="utf-8").split())
    assert "refused, exit 2, nothing signalled, nothing written" in operations
    for name in RUN_ARG_COMMANDS:
        said = " ".join((root.commands[name].help or "").split())
        assert f"{NOT_A_RUN} " in said.split("Exit status:", 1)[-1], (name, said)
        assert "a third user's link" in said and "(refused)" in said, (name, said)
    forget = " ".join((root.commands["forget"].help or "").split())
    assert "1 nothing forgotten" in forget and "running: kept" in forget, forget


def test_help_wraps_each_paragraph_at_the_terminals_width():
    """Rich keeps a docstring's line breaks, so the 120-column source came out ragged at 80 columns (user report 6:
    `(without\\n--force)`); every paragraph is one line before rich wraps it (minilmd/cli/__init__.py unwrapped)."""
    import os
    import subprocess

    root = typer.main.get_command(app)
    ragged = [" ".join(path) for path, command in commands(root)
              if any("\n" in p for p in (command.help or "").split("\n\n"))]
    assert not ragged, f"help with line breaks inside a paragraph: {ragged}"
    shown = subprocess.run([sys.executable, "-m", "minilmd.cli", "run", "--help"], capture_output=True, text=True,
                           env={**os.environ, "COLUMNS": "80", "TERMINAL_WIDTH": "80"}).stdout
    prose = [line.strip() for line in shown.split("╭")[0].splitlines()]
    short = [a for a, b in zip(prose[:-1], prose[1:], strict=True) if a and b and len(a) < 50]  # cut short
    assert "Exit status:" in shown and not short, shown
