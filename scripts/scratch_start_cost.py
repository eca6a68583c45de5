"""What hashing scratch's newest checkpoint costs a supervisor's start, side by side in one run, for a 25M and a
200M-parameter model (real checkpoints with their AdamW state, on tmpfs: /dev/shm).

A restart with a checkpoint in scratch and the same step synced to a local run.remote does, before training goes on:
- the launch's look (`run --check`'s rule, daemon/jobs/resumefrom.py): scratch's newest valid step (find_latest),
- staging's look (daemon/jobs/scratch_behind.py fetch_over_scratch): the same again, then the remote's newest,
- the trainer's resume (trainer/loop/resume.py): find_latest's walk in its own process validating with
  checkpoint_load.validated_for_loading, and the model's and optimizer's state made of the bytes that validation read.
Timed three ways, the median of `--repeats` each: `repeated hash` (each look validates: the code before
checkpoint_select.validate_once), `one hash` (staging reuses the launch's validation of the unchanged checkpoint: the
code now), and `no supervisor hash` (the trainer's resume alone: a floor no supervisor look can go under). torch's
import and the model's construction are not counted: they would lower every ratio. `--trainer-before` times also the
trainer's resume as it was before validated_for_loading (find_latest, then save.load_carrying reading and hashing
every file again), side by side: the rows `one hash, trainer before` and `trainer before`, and their ratios.
`.venv/bin/python scripts/scratch_start_cost.py [--repeats N] [--dir DIR] [--trainer-before]`
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import time
from pathlib import Path

SIZES = {"25M": (512, 8), "200M": (1024, 16)}
"""hidden_size x num_hidden_layers (vocab 6400, MiniMind's): 25.8M and 208M parameters."""


def _checkpoint(root: Path, hidden: int, layers: int):
    """(the run's config, its Expectation, the checkpoint's directory, the model's parameters): step 1 of a real model
    and AdamW state, as resume_load_cost.py saves it."""
    from resume_load_cost import save_step_one

    from minilmd.checkpoint import Expectation

    cfg, path, params = save_step_one(root, hidden, layers)
    return cfg, Expectation.for_corpus(cfg), path, params


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(work: Path, label: str, hidden: int, layers: int, repeats: int, trainer_before: bool = False) -> None:
    from minilmd import checkpoint_select
    from minilmd.checkpoint_load import validated_for_loading
    from minilmd.checkpoint_select import find_latest, first_valid
    from minilmd.daemon.jobs.scratch_behind import fetch_over_scratch
    from minilmd.daemon.jobs.sync import Syncer
    from minilmd.trainer.checkpoint import save as ckpt_io
    from minilmd.trainer.loop.resume import CARRIED

    scratch, remote = work / label / "scratch" / "checkpoints", work / label / "remote"
    _, expected, path, params = _checkpoint(scratch, hidden, layers)
    Syncer(scratch, str(remote), expected, log=lambda _: None).sync_newest()  # the same step synced: a restart
    size = sum(f.stat().st_size for f in path.iterdir())

    def launch_look(reuse: bool) -> None:
        assert find_latest([scratch], expected, log=lambda _: None, set_aside=False, reuse=reuse) == path

    def staging_look() -> None:
        verdict = fetch_over_scratch(Syncer(scratch, str(remote), expected, log=lambda _: None), scratch, expected)
        assert verdict.taken is None and not verdict.wait and not verdict.unlooked, verdict

    def trainer_resume() -> None:  # its own process: nothing reused
        taken = first_valid([scratch], lambda p: validated_for_loading(p, expected, CARRIED), log=lambda _: None)
        assert taken is not None and taken[0] == path
        ckpt_io.loaded(taken[1])

    def trainer_resume_before() -> None:
        assert find_latest([scratch], expected, log=lambda _: None) == path
        ckpt_io.load_carrying(path, CARRIED)

    rows: dict[str, list[float]] = {"repeated hash": [], "one hash": [], "no supervisor hash": []}
    if trainer_before:
        rows.update({"one hash, trainer before": [], "trainer before": []})
    looks: dict[str, list[float]] = {"repeated hash": [], "one hash": []}
    if trainer_before:
        looks["one hash, trainer before"] = looks["one hash"]  # the same supervisor looks
    for _ in range(repeats):
        checkpoint_select._validated.clear()
        before = _timed(lambda: launch_look(False)) + _timed(lambda: (checkpoint_select._validated.clear(),
                                                                      staging_look()))
        checkpoint_select._validated.clear()
        now = _timed(lambda: launch_look(True)) + _timed(staging_look)
        checkpoint_select._validated.clear()
        trainer = _timed(trainer_resume)
        looks["repeated hash"].append(before)
        looks["one hash"].append(now)
        rows["repeated hash"].append(before + trainer)
        rows["one hash"].append(now + trainer)
        rows["no supervisor hash"].append(trainer)
        if trainer_before:
            checkpoint_select._validated.clear()
            before_trainer = _timed(trainer_resume_before)
            rows["one hash, trainer before"].append(now + before_trainer)
            rows["trainer before"].append(before_trainer)
    med = statistics.median
    floor = med(rows["no supervisor hash"])
    print(f"{label}: {params:,} parameters, checkpoint {size / 1e6:,.0f} MB on {scratch}")
    print(f"  {'start':<26}{'supervisor looks s':>20}{'start s':>10}{'x of no hash':>14}")
    for name, times in rows.items():
        sup = f"{med(looks[name]):20.2f}" if name in looks else f"{0:20.2f}"
        print(f"  {name:<26}{sup}{med(times):10.2f}{med(times) / floor:14.2f}")
    print(f"  repeated / one hash: {med(rows['repeated hash']) / med(rows['one hash']):.2f}x", flush=True)
    if trainer_before:
        print(f"  trainer's resume now / before: {floor / med(rows['trainer before']):.2f}x; the start now / before "
              f"(one hash): {med(rows['one hash']) / med(rows['one hash, trainer before']):.2f}x", flush=True)
    shutil.rmtree(work / label)


def main() -> int:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", default="/dev/shm", help="where a new directory of the bench's own is made (tmpfs)")
    parser.add_argument("--trainer-before", action="store_true",
                        help="also time the trainer's resume before validated_for_loading (validate, then load)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="minilmd-start-cost-", dir=args.dir))  # new, 0700: the bench's own
    try:
        for label, (hidden, layers) in SIZES.items():
            measure(work, label, hidden, layers, args.repeats, args.trainer_before)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # made above: nothing else
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
