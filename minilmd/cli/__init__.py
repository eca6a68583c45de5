"""The `minilmd` command line: the app, and the command groups registered on it, one module each.

- data.py: `prepare`, `corpus`, `demo-corpus`; tokenizer.py: `tokenizer` (torch-free all the way down; their exits:
  minilmd/corpus/exits.py, outside this package, which imports every group; the options several commands share,
  `--group-share` and `--force`, each defined once: minilmd/corpus/cli_options.py, beside it for that reason)
- trainer.py: `train`, `verify`, `sample`, `chat`, `export`; bench.py: `bench ...` (they run the trainer's code)
- run.py: `run` (the supervisor, `run --check`); views.py: `status`, `forget`, `plot`, `logs`, `stop`

Each command imports its implementation inside its body, so that `minilmd status` never pays for torch: the group
modules import only typer (and the stdlib) at module level. `python -m minilmd.cli` is this app too (__main__.py).
"""
from __future__ import annotations

import inspect
import sys

import typer

from minilmd.cli import bench, data, run, tokenizer, trainer, views

app = typer.Typer(no_args_is_help=True, add_completion=False, help="minilmd: resilient training of small LMs.")
# The order of registration is the order `minilmd --help` lists them in: the top-level commands group by group,
# then the sub-command groups.
for group in (data, trainer, run, views):
    app.registered_commands += group.commands.registered_commands
app.add_typer(tokenizer.tokenizer_app, name="tokenizer")
app.add_typer(bench.bench_app, name="bench")
app.add_typer(data.corpus_app, name="corpus")


def unwrapped(doc: str) -> str:
    """A command's docstring as --help shows it: its paragraphs kept, the source's line breaks within each joined.
    Rich wraps a paragraph at the terminal's width and keeps its line breaks too, so a docstring wrapped at 120
    columns came out ragged at 80 ("could not set up the run directory,", then a new line)."""
    return "\n\n".join(" ".join(p.split()) for p in inspect.cleandoc(doc).split("\n\n"))


for commands in (app, tokenizer.tokenizer_app, bench.bench_app, data.corpus_app):
    for info in commands.registered_commands:
        info.help = unwrapped(info.help or inspect.getdoc(info.callback) or "")


def main() -> None:
    # Every Python this command starts by any way (prepare's spawned workers, multiprocessing's resource tracker, a
    # `python -c` of a library) with no planted module of the working directory on its path (minilmd/pychild.py).
    from minilmd import pychild, terminal

    pychild.guard_descendants()
    # What any command prints, through printable: a name from someone else's file is never a terminal's escape
    terminal.escape_std_streams()
    from minilmd.supervision import SupervisionRefused, supervision

    try:  # every command asks it somewhere (scratch's root, the probes): a stray half is said here, not as a traceback
        supervision()
    except SupervisionRefused as e:
        from minilmd.protocol import EXIT_CONFIG

        print(f"minilmd: {e}", file=sys.stderr)
        raise SystemExit(EXIT_CONFIG) from None
    _refuse_foreign_flags(sys.argv[1:])
    app()


def _refuse_foreign_flags(argv: list[str]) -> None:
    """`minilmd run cfg.toml --epochs 2`: MiniMind's flag names get the --set that says it, exit 2, where typer
    said only "No such option: --epochs" (user10 #5)."""
    if argv[:1] not in (["run"], ["train"]):
        return
    from minilmd.minimind_names import foreign_flag_hint

    found = foreign_flag_hint(argv[1:])
    if found is None:
        return
    command = typer.main.get_command(app).commands[argv[0]]  # type: ignore[attr-defined]
    if any(found[0] in (*p.opts, *p.secondary_opts) for p in command.params):
        return  # an option of ours after all
    from minilmd.protocol import EXIT_CONFIG

    print(f"minilmd {argv[0]}: no such option {found[0]}: {found[1]}", file=sys.stderr)
    raise SystemExit(EXIT_CONFIG)  # 2, as typer's own "No such option"
