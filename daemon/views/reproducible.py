"""`minilmd status`'s line on whether the run is bit-reproducible: a run killed and resumed ends with the weights an
undisturbed run would have, bit for bit. The rule is minilmd/batch_stream.py's bit_reproducible (always on the CPU;
on the GPU only with train.deterministic; never once a resume changed the batch stream, state.json's shape_changes);
train.deterministic is read from the run's copy of its config (run_config_of: as another user's file may be), and
this view only says which case it is."""
from __future__ import annotations

from pathlib import Path

from minilmd.batch_stream import bit_reproducible
from minilmd.config import ConfigError
from minilmd.daemon.base.statesections import StateJson


def reproducibility_lines(run_dir: Path, state: StateJson) -> list[str]:
    from minilmd.run_config_copy import run_config_of

    try:
        cfg = run_config_of(run_dir)
    except (ConfigError, OSError, ValueError):  # ValueError: init_place.Refused (a link, a FIFO, a third user's)
        return []
    trained = state.child is not None or state.progress.step is not None  # a trainer ran (or runs): its devices
    on_cpu = cfg.train.device == "cpu" or (trained and not state.devices)  # are kept once it ended (a done run)
    if bit_reproducible(on_cpu, cfg.train.deterministic, state.shape_changes):
        if on_cpu:  # first: train.deterministic (on by default) chooses GPU kernels, and says nothing of a CPU run
            return ["  bit-reproducible: yes, on the CPU (a resumed run ends as an undisturbed one would)"]
        return ["  bit-reproducible: yes (train.deterministic: deterministic kernels on the GPU; a resumed run ends "
                "as an undisturbed one would)"]
    if state.shape_changes:  # a resume changed the batch stream (minilmd/batch_stream.py): no run ends as it does
        return [f"  bit-reproducible: no (a resume changed the batch stream, the lr schedule or the update: "
                f"{'; '.join(state.shape_changes)}; the run is the same as an undisturbed run of neither config)"]
    return ["  bit-reproducible: no on the GPU (train.deterministic = false: torch's default kernels; a resumed run "
            "ends close to, not equal to, an undisturbed one)"]
