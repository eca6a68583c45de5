"""A config checked or launched while its run is running (another supervisor holds its run lock): what its edits
do. A running run goes on with the config it started with: its supervisor restarts the trainer from its copy,
RUN_DIR/run.toml, never from the file the user edits, so an edit applies at the run's next start. Before (user
report 9, finding 8), `run --check` of an edited config said only that another supervisor owned the run, and a
restart after a crash kept the old `lr` with nothing saying so. Torch-free.
"""
from __future__ import annotations

from minilmd import names
from minilmd.config import ConfigError, RunConfig
from minilmd.run_config_copy import run_config_of

SHOWN = 6
"""Changed keys named at most; the rest counted."""


def running_words(cfg: RunConfig, config_path: str = "CONFIG") -> str:
    """What follows "run already owned by another supervisor": that edits apply at the next start, how to get
    there, and which keys this config (with its --set) changes against the running run's copy, when it reads. A
    config of another run.name is no edit of the running run (a new user's second config on one run.dir was told
    to stop the healthy run, then refused): it is said to need a run.dir of its own."""
    running = _running_copy(cfg)
    restart = f"`minilmd stop {cfg.run_dir}`, then `minilmd run {config_path}`"
    if running is not None and running.run.name != cfg.run.name:
        return (f"{cfg.run_dir} is the run directory of the running run {running.run.name!r}, not of this config's "
                f"run {cfg.run.name!r}: two runs need two run directories, so give this config a run.dir (and a "
                f"run.remote) of its own (if it renames that run, the new name applies at its next start: "
                f"{restart})")
    said = (f"a running run keeps the config it started with ({cfg.run_dir / names.RUN_CONFIG_COPY}, which its "
            f"restarts read too): edits to this file apply at its next start ({restart})")
    changed = changes(cfg, running)
    if changed:
        more = f" and {len(changed) - SHOWN} more" if len(changed) > SHOWN else ""
        said += f"; this config changes, against that copy: {', '.join(changed[:SHOWN])}{more}"
    elif changed is not None:
        said += "; this config is the same as that copy"
    return said


def _running_copy(cfg: RunConfig) -> RunConfig | None:
    """The running run's copy of its config, read as every reader of that copy reads it (run_config_of); None when
    it cannot be read."""
    try:
        return run_config_of(cfg.run_dir)
    except (ConfigError, OSError, ValueError):
        return None


def changes(cfg: RunConfig, running: RunConfig | None) -> list[str] | None:
    """`KEY = value (running: value)` for each key whose value differs from the running run's copy of its config
    (`running`: _running_copy); None when the copy cannot be read."""
    if running is None:
        return None
    now, then = cfg.to_dict(), running.to_dict()
    return [f"{section}.{key} = {value!r} (running: {then.get(section, {}).get(key)!r})"
            for section, body in now.items() for key, value in body.items()
            if then.get(section, {}).get(key) != value]
