"""`minilmd plot RUN_DIR [RUN_DIR ...] --out FILE.png|.svg`: a run's curves as a picture, several runs overlaid.

Four panels: train loss (raw, faint, and smoothed) with the validation loss; learning rate; real tokens/s; grad
norm. A DPO run (its lines carry rewards) adds two, under TRL's names: rewards/accuracies, and rewards/margins with
rewards/chosen and rewards/rejected (each train value smoothed as the loss is, each validation as a marked point).
Against the step, or with x="tokens" against the tokens trained on. On every panel: each restart as a dashed
vertical line (labelled by its cause on the loss panel; restarts at about the same x share one label, and with
several runs each cause is prefixed by its run's name, in its colour), each span with a failing sync shaded, each
epoch boundary as a dotted line. The legend is below the panels, where it covers no curve. The curves are those of
daemon/views/curves.py: every attempt's lines, a repeated step once, of the current lineage only: a run.dir where
`minilmd run --fresh` started a new one draws from that start on, its title saying so (`since run --fresh ...`), and
the summary says what was left out (an earlier timeline, to its step).

matplotlib (the Agg backend: no display needed) is an optional extra, `pip install 'minilmd[plot]'`; without it
`plot` raises PlotUnavailable with that line. The picture is rendered in memory, then written as tokenizer train
writes its --out (minilmd/fsio.py write_out_bytes): at the descriptor of --out's directory, opened once under the
place rule (a directory others can rearrange refused, PlaceRefused, unless `group_share`: a team directory); a link
planted at --out is replaced, never written through. `plot` returns a PlotSummary read back from the figure's own
artists (each mark carries a gid), so a test can see what was drawn, not what was meant to be.
"""
from __future__ import annotations

import io
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from minilmd.daemon.base.runstate import fmt_time
from minilmd.daemon.views import curves as curves_mod
from minilmd.dirfd import Dir, PlaceRefused
from minilmd.fsio import out_parent_problem, write_out_bytes
from minilmd.metrics import REWARDS, number

INSTALL_HINT = "pip install 'minilmd[plot]'  (or: pip install matplotlib)"
X_AXES = ("step", "tokens")
REWARD_STYLES = {"reward_margin": "-", "reward_chosen": "--", "reward_rejected": ":"}
"""The lines of the rewards panel, told apart by their style (a run by its colour)."""
OUT_ADVICE = ("choose an --out in a directory only you (and root) can change, or pass --group-share to write the "
              "picture into a team directory anyway")


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


@dataclass
class PlotSummary:
    """What the figure holds, read from its artists."""

    path: Path
    size_px: tuple[int, int]
    runs: list[str] = field(default_factory=list)
    restart_marks: list[tuple[str, float, str]] = field(default_factory=list)
    """(run, x, cause) of every restart line on the loss panel."""
    restart_labels: list[tuple[float, str]] = field(default_factory=list)
    """(x, text) of each restart label on the loss panel: one per group of restarts at about the same x."""
    legend_overlaps: list[str] = field(default_factory=list)
    """The panels (by y label) whose area the legend covers: none, it is below them."""
    sync_spans: list[tuple[str, float, float]] = field(default_factory=list)
    epoch_marks: list[tuple[str, float]] = field(default_factory=list)
    points: dict[str, int] = field(default_factory=dict)
    """Points of each run's raw train-loss line."""
    rewards: dict[str, int] = field(default_factory=dict)
    """A DPO run's reward curves: "RUN:rewards/accuracies:train" (or ":val") -> its points."""
    unreadable: list[str] = field(default_factory=list)
    """"RUN: metrics.jsonl: unreadable (a FIFO)" for each file that could not be read (its curves are missing)."""
    not_drawn: list[str] = field(default_factory=list)
    """"RUN: an earlier timeline (to step N) is in this run.dir, before the run --fresh start of T" for each run
    whose earlier timeline was left out."""


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise PlotUnavailable(f"minilmd plot needs matplotlib, which is not installed: {INSTALL_HINT}") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot(run_dirs: Sequence[str | os.PathLike | Dir], out: str | os.PathLike, x: str = "step",
         smoothing: float | None = None, title: str | None = None, dpi: int = 100, *,
         group_share: bool = False) -> PlotSummary:
    """Draw the runs' curves into out (.png or .svg, by its suffix) and say what was drawn. smoothing: the EMA's
    weight of a new point; None: auto_smoothing's. PlaceRefused (nothing written) when out's directory is not a
    place for it (the module's docstring); `group_share`: a team directory, used anyway. A run given as a Dir (the
    `minilmd plot` command's: daemon/views/runarg.py open_run) is read through its descriptor, named by its path."""
    if x not in X_AXES:
        raise ValueError(f"--x {x!r}: use one of {', '.join(X_AXES)}")
    out = Path(out)
    if out.suffix.lower() not in (".png", ".svg"):
        raise ValueError(f"--out {out}: the file name must end in .png or .svg")
    if problem := out_parent_problem(out, "--out", "the picture", OUT_ADVICE, group_share=group_share):
        raise PlaceRefused(problem)  # said before the runs are read, by the walk that opens the directory to write
    plt = _pyplot()
    runs = [curves_mod.load(d.path, d.fd) if isinstance(d, Dir) else curves_mod.load(d) for d in run_dirs]
    dpo = any(_has_rewards(run) for run in runs)
    fig, axes = plt.subplots(3 if dpo else 2, 2, figsize=(11, 10 if dpo else 7), sharex=True)
    loss_ax, lr_ax, toks_ax, grad_ax = axes.flat[:4]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    restart_labels: list[tuple[float, str, str]] = []
    for i, run in enumerate(runs):
        label = _label(run, runs)
        restart_labels += _draw_run(run, tuple(axes.flat), colors[i % len(colors)], x, smoothing,
                                    label=label, whose=label if len(runs) > 1 else "")
        if dpo:
            _draw_rewards(run, axes.flat[4:], colors[i % len(colors)], x, smoothing)
    loss_ax.set_ylabel("loss")
    lr_ax.set_ylabel("learning rate")
    toks_ax.set_ylabel("real tokens/s")
    grad_ax.set_ylabel("grad norm")
    if dpo:
        _label_reward_panels(*axes.flat[4:])
    for ax in axes.flat[-2:]:
        ax.set_xlabel("tokens trained on" if x == "tokens" else "step")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    _label_restarts(loss_ax, restart_labels)
    handles, labels = loss_ax.get_legend_handles_labels()
    legend_rows = 0
    if handles:  # below the panels, never over a curve
        columns = min(len(handles), 4)
        legend_rows = -(-len(handles) // columns)
        fig.legend(handles, labels, fontsize=8, loc="lower center", ncol=columns, frameon=False)
    fig.suptitle(title or ", ".join(_title(r) for r in runs))
    fig.tight_layout(rect=(0, min(0.3, 0.035 * legend_rows + 0.01 * bool(legend_rows)), 1, 1))
    picture = io.BytesIO()  # never savefig(out): it opens the name, and a link planted there, by path
    fig.savefig(picture, format=out.suffix.lower()[1:], dpi=dpi)
    summary = _summarize(fig, loss_ax, out, runs)
    summary.rewards = {line.get_gid()[len("reward:"):]: len(line.get_xdata()) for ax in axes.flat[4:]
                       for line in ax.lines if (line.get_gid() or "").startswith("reward:")}
    plt.close(fig)
    write_out_bytes(out, picture.getvalue(), "--out", "the picture", OUT_ADVICE, group_share=group_share)
    return summary


def auto_smoothing(points: int) -> float:
    """The EMA's weight of a new point: 0.05 (a memory of ~20 points) on a long curve, up to 0.5 on a short one,
    whose 12 points (the demo's) a memory of 20 would drag far behind the raw line."""
    return min(0.5, max(0.05, 5.0 / max(points, 1)))


def _label(run: curves_mod.Curves, runs: list[curves_mod.Curves]) -> str:
    same_name = sum(r.name == run.name for r in runs) > 1
    return f"{run.name} ({run.run_dir})" if same_name else run.name


def _title(run: curves_mod.Curves) -> str:
    """The run's name, with the start of its current lineage when a `run --fresh` began one (what came before is
    not drawn)."""
    if run.earlier.fresh_since is None:
        return run.name
    return f"{run.name} (since run --fresh {fmt_time(run.earlier.fresh_since)})"


def _draw_run(run: curves_mod.Curves, axes, color: str, x: str, smoothing: float | None, label: str,
              whose: str = "") -> list[tuple[float, str, str]]:
    """Draw one run's loss, lr, tokens/s and grad norm on the first four of `axes`, its restarts, sync failures and
    epochs on every one; returns its restart labels as (x, text, color) for _label_restarts (`whose` prefixes the
    text when several runs share the picture)."""
    loss_ax, lr_ax, toks_ax, grad_ax = axes[:4]

    def xs(steps):
        return [run.tokens_at(s) for s in steps] if x == "tokens" else list(steps)

    loss = [(r["step"], r["loss"]) for r in run.train if isinstance(r.get("loss"), (int, float))]
    if loss:
        raw, = loss_ax.plot(xs([s for s, _ in loss]), [v for _, v in loss], color=color, alpha=0.25, lw=0.8)
        raw.set_gid(f"train_loss_raw:{run.name}")
        alpha = smoothing if smoothing is not None else auto_smoothing(len(loss))
        loss_ax.plot(xs([s for s, _ in loss]), curves_mod.smooth([v for _, v in loss], alpha), color=color,
                     lw=1.6, label=f"{label} train (smoothed)")
    val = [(r["step"], r["val_loss"]) for r in run.evals if isinstance(r.get("val_loss"), (int, float))]
    if val:
        loss_ax.plot(xs([s for s, _ in val]), [v for _, v in val], color=color, ls="--", marker="o", ms=3, lw=1.2,
                     label=f"{label} val")
    for ax, key in ((lr_ax, "lr"), (toks_ax, "tok_s"), (grad_ax, "grad_norm")):
        pts = [(r["step"], r[key]) for r in run.train if isinstance(r.get(key), (int, float))]
        if pts:
            ax.plot(xs([s for s, _ in pts]), [v for _, v in pts], color=color, lw=1.2)
    for lo, hi in run.sync_failures:
        for ax in axes:
            span = ax.axvspan(*xs([lo, hi]), color="tab:red", alpha=0.12, lw=0)
            span.set_gid(f"sync_failed:{run.name}:{lo}:{hi}")
    for step in run.epochs:
        for ax in axes:
            ax.axvline(xs([step])[0], color=color, ls=":", lw=1, alpha=0.8).set_gid(f"epoch:{run.name}:{step}")
    labels = []
    for mark in run.restarts:
        at = xs([mark.step])[0]
        for ax in axes:
            ax.axvline(at, color="tab:red", ls="--", lw=1, alpha=0.9).set_gid(f"restart:{run.name}:{mark.cause}")
        labels.append((at, f"{whose}: {mark.cause}" if whose else mark.cause, color if whose else "tab:red"))
    return labels


def _has_rewards(run: curves_mod.Curves) -> bool:
    return any(isinstance(r.get(key), (int, float)) for r in run.train for key in REWARDS) or any(
        isinstance(r.get(f"val_{key}"), (int, float)) for r in run.evals for key in REWARDS)


def _reward_points(records: list[dict], key: str) -> list[tuple[int, float]]:
    return [(r["step"], value) for r in records if (value := number(r.get(key))) is not None]


def _draw_rewards(run: curves_mod.Curves, axes, color: str, x: str, smoothing: float | None) -> None:
    """A DPO run's rewards: the accuracies on the first panel, margins, chosen and rejected on the second; train
    lines smoothed (their memory as the loss's), validations as points. Each line's gid: reward:RUN:NAME:SPLIT."""
    def xs(steps):
        return [run.tokens_at(s) for s in steps] if x == "tokens" else list(steps)

    accuracy_ax, rewards_ax = axes
    for key, trl in REWARDS.items():
        ax, style = (accuracy_ax, "-") if key == "reward_accuracy" else (rewards_ax, REWARD_STYLES[key])
        train = _reward_points(run.train, key)
        if train:
            alpha = smoothing if smoothing is not None else auto_smoothing(len(train))
            line, = ax.plot(xs([s for s, _ in train]), curves_mod.smooth([v for _, v in train], alpha), color=color,
                            ls=style, lw=1.4)
            line.set_gid(f"reward:{run.name}:{trl}:train")
        val = _reward_points(run.evals, f"val_{key}")
        if val:
            line, = ax.plot(xs([s for s, _ in val]), [v for _, v in val], color=color, ls="none", marker="o", ms=3)
            line.set_gid(f"reward:{run.name}:{trl}:val")


def _label_reward_panels(accuracy_ax, rewards_ax) -> None:
    accuracy_ax.set_ylabel(REWARDS["reward_accuracy"])
    accuracy_ax.axhline(0.5, color="grey", lw=0.8, ls=":")  # a policy that tells chosen from rejected by chance
    rewards_ax.set_ylabel("rewards")
    rewards_ax.axhline(0.0, color="grey", lw=0.8, ls=":")
    from matplotlib.lines import Line2D

    styles = [Line2D([], [], color="black", ls=style, lw=1.4) for style in REWARD_STYLES.values()]
    rewards_ax.legend(styles, [REWARDS[key] for key in REWARD_STYLES], fontsize=7, loc="upper left", frameon=False)


LABEL_GAP = 0.02
"""Restart labels closer than this share of the x axis are written as one (they would overprint)."""


def _label_restarts(loss_ax, labels: list[tuple[float, str, str]]) -> None:
    """One vertical label per group of restarts at (about) the same x: their causes joined, each once with a count
    ("sigkill x3"), in the run's colour when one run's alone, else red."""
    lo, hi = loss_ax.get_xlim()
    gap = LABEL_GAP * (hi - lo if hi > lo else 1.0)
    groups: list[list[tuple[float, str, str]]] = []
    for label in sorted(labels, key=lambda item: item[0]):
        if groups and label[0] - groups[-1][0][0] <= gap:
            groups[-1].append(label)
        else:
            groups.append([label])
    for group in groups:
        texts = [text for _, text, _ in group]
        counted = [f"{t} x{texts.count(t)}" if texts.count(t) > 1 else t for t in dict.fromkeys(texts)]
        colors = {color for _, _, color in group}
        text = ", ".join(counted)
        loss_ax.annotate(text, xy=(group[0][0], 1.0), xycoords=("data", "axes fraction"), xytext=(2, -2),
                         textcoords="offset points", rotation=90, va="top", ha="left", fontsize=8,
                         color=colors.pop() if len(colors) == 1 else "tab:red").set_gid(f"restart_label:{text}")


def _summarize(fig, loss_ax, out: Path, runs: list[curves_mod.Curves]) -> PlotSummary:
    width, height = fig.get_size_inches() * fig.dpi
    summary = PlotSummary(out, (round(width), round(height)), [r.name for r in runs])
    summary.unreadable = [f"{r.name}: {problem}" for r in runs for problem in r.unreadable]
    summary.not_drawn = [f"{r.name}: {words}" for r in runs if (words := curves_mod.earlier_words(r.earlier))]
    for line in loss_ax.lines:
        gid = line.get_gid() or ""
        kind, _, rest = gid.partition(":")
        if kind == "restart":
            run, _, cause = rest.rpartition(":")
            summary.restart_marks.append((run, float(line.get_xdata()[0]), cause))
        elif kind == "epoch":
            summary.epoch_marks.append((rest.rsplit(":", 1)[0], float(line.get_xdata()[0])))
        elif kind == "train_loss_raw":
            summary.points[rest] = len(line.get_xdata())
    for text in loss_ax.texts:
        kind, _, rest = (text.get_gid() or "").partition(":")
        if kind == "restart_label":
            summary.restart_labels.append((float(text.xy[0]), rest))
    renderer = fig.canvas.get_renderer()
    for legend in fig.legends:
        box = legend.get_window_extent(renderer)
        summary.legend_overlaps += [ax.get_ylabel() for ax in fig.axes if box.overlaps(ax.get_window_extent(renderer))]
    for patch in loss_ax.patches:
        kind, _, rest = (patch.get_gid() or "").partition(":")
        if kind == "sync_failed":
            run, lo, hi = rest.rsplit(":", 2)
            summary.sync_spans.append((run, float(lo), float(hi)))
    return summary
