"""The operator's views of runs: `status`, `forget`, `plot`, `logs`, `stop` (daemon/views/).

`minilmd status` is run often and by scripts: nothing is imported here beyond typer until a command runs.
"""
from __future__ import annotations

import contextlib

import typer

from minilmd.corpus.cli_options import group_share_option

RUN_HELP = "The run directory, or the run config file that names it (its run.dir)."

commands = typer.Typer()
"""The top-level commands of this group; minilmd/cli/__init__.py registers them on the `minilmd` app."""


@commands.command("status")
def status_command(
    run_dir: str | None = typer.Argument(None, help="The run directory, or the run config file that names it (its "
                                                    "run.dir); none: every run."),
    all_: bool = typer.Option(False, "--all", help="Every run of this machine you may see, one line each."),
    as_json: bool = typer.Option(False, "--json", help="state.json (caught up with what the trainer wrote since, "
                                                       "when no supervisor runs) plus whether the supervisor runs, "
                                                       "as JSON (with --all: the rows)."),
) -> None:
    """Where a run stands: phase, step, loss (and a sparkline of it), tok/s, ETA, checkpoints local and remote,
    restarts, last error. With no run directory, or --all: every registered run you may see.

    Exit status: 0 shown, 1 another user's run directory you may not read, 2 not a run directory (nor a config),
    or a third user's link or config on the way to one (refused)."""
    if all_ or run_dir is None:
        from minilmd.daemon.views.overview import status_all

        raise typer.Exit(status_all(as_json))
    from minilmd.daemon.views.status import status

    raise typer.Exit(status(run_dir, as_json))


@commands.command("forget")
def forget_command(
    run: str = typer.Argument(..., help="A run's name or its run directory, as `minilmd status --all` lists it."),
) -> None:
    """Remove a run from the registry that `minilmd status --all` lists (a vanished run directory, say); the run
    directory itself is not touched. A NAME that is also a directory here forgets that run directory too, unless it
    is running (kept; the gone runs of that name are still forgotten).

    Exit status: 0 forgotten, 1 nothing forgotten (no such run of yours, only runs whose directory still exists, or
    the run directory named is running: kept), 2 a third user's link on the way to the run directory named
    (refused)."""
    from minilmd.daemon.views.overview import forget

    raise typer.Exit(forget(run))


@commands.command("plot")
def plot_command(
    run_dirs: list[str] = typer.Argument(..., help="One or more run directories, or run configs naming them "
                                         "(several: overlaid)."),
    out: str = typer.Option(..., "--out", help="FILE.png or FILE.svg (replaced whole; a link there is replaced, "
                            "never written through; another user's file or link there is refused)."),
    x: str = typer.Option("step", "--x", help="step or tokens (tokens trained on)."),
    title: str = typer.Option("", "--title", help="The figure's title (default: the runs' names)."),
    group_share: bool = group_share_option(),
) -> None:
    """Loss (raw, smoothed, val), learning rate, tok/s and grad norm of every attempt, with restarts (by cause),
    failing syncs and epoch boundaries marked. Needs matplotlib: pip install 'minilmd\\[plot]'.

    Exit status: 0 written, 1 matplotlib missing or another user's private run, 2 bad arguments, not a run
    directory (nor a config naming one, read as `status` reads it), a third user's link or config on the way to one
    (refused), or an --out in a directory others can rearrange
    (without --group-share), 74 the write failed; nothing is written but the whole picture."""
    # (the backslash: typer's rich markup would read "[plot]" as a style tag and drop it)
    from minilmd.corpus.exits import out_dir_of, out_error_exit
    from minilmd.daemon.views.plot import PlotUnavailable, plot
    from minilmd.daemon.views.runarg import opened_run
    from minilmd.dirfd import PlaceRefused
    from minilmd.protocol import COMMAND_FAILED, EXIT_CONFIG
    from minilmd.untrusted import printable

    with contextlib.ExitStack() as held:
        # each a run directory, or a config naming one (said), judged and held open: its files read through it
        found = [opened_run(d, "plot") for d in run_dirs]
        runs = [held.enter_context(run) for run, _ in found if run is not None]
        if refused := next((code for run, code in found if run is None), 0):
            raise typer.Exit(refused)
        try:
            summary = plot(runs, out, x=x, title=title or None, group_share=group_share)
        except PlotUnavailable as e:
            typer.echo(f"minilmd plot: {e}", err=True)
            raise typer.Exit(COMMAND_FAILED) from None
        except PlaceRefused as e:
            typer.echo(f"minilmd plot: {e}; nothing written", err=True)
            raise typer.Exit(EXIT_CONFIG) from None
        except OSError as e:
            raise out_error_exit(e, "minilmd plot", out_dir_of(out), f"nothing written ({out} is as it was)") from None
        except ValueError as e:
            typer.echo(f"minilmd plot: {e}", err=True)
            raise typer.Exit(EXIT_CONFIG) from None
    for problem in summary.unreadable:
        typer.echo(f"minilmd plot: {printable(problem)}", err=True)
    for left_out in summary.not_drawn:  # another timeline in the run.dir: the current lineage alone is drawn
        typer.echo(f"minilmd plot: {printable(left_out)}: not drawn")
    marks = ", ".join(f"{cause} at {at:,.0f}" for _, at, cause in summary.restart_marks) or "none"
    # the runs' names and causes are what each run directory's owner wrote (another user's, maybe): escaped
    typer.echo(f"wrote {summary.path} ({summary.size_px[0]}x{summary.size_px[1]} px): "
               f"{printable(', '.join(summary.runs))}; restarts: {printable(marks)}")


@commands.command("logs")
def logs_command(
    run_dir: str = typer.Argument(".", help=RUN_HELP),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new lines (next attempts too) until "
                                "the run ends; a run already ended is followed until it starts again."),
    lines: int = typer.Option(20, "--lines", "-n", min=0, help="Lines of each log to show first (0: none)."),
) -> None:
    """The supervisor's events and the current attempt's trainer output.

    Exit status: 0 shown (followed to the run's end), 1 another user's run directory you may not read, 2 not a run
    directory (nor a config), or a third user's link or config on the way to one (refused), 130 Ctrl-C."""
    from minilmd.daemon.views.logs import logs

    raise typer.Exit(logs(run_dir, follow, lines))


@commands.command("stop")
def stop_command(
    run_dir: str = typer.Argument(".", help=RUN_HELP),
    timeout: float = typer.Option(0.0, "--timeout", help="Give up waiting after this many seconds (0: wait)."),
) -> None:
    """Ask the supervisor to stop: the trainer saves at the next step, the last sync runs, then it exits 0.

    A link or a run config on the way to the run directory is followed only when it is yours, root's or the run
    directory's owner's; a third user's chooses whose run it is: refused, nothing signalled, nothing written.

    Exit status: 0 stopped, 1 not stopped (timeout, another user's supervisor or run directory), 2 not a run
    directory (nor a config), or a third user's link or config on the way to one (refused), 3 stopped but the
    newest checkpoint is only in scratch (the last sync failed; its path is printed)."""
    from minilmd.daemon.views.stop import stop

    raise typer.Exit(stop(run_dir, timeout))
