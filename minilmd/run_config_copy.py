"""A run directory's copy of its config (run.toml, names.RUN_CONFIG_COPY), read one way: `run_config_of`.

The supervisor writes the copy at its start (daemon/runfiles.py) and the trainer is launched with it; everyone else
who wants to know what a run was started with reads it here: `minilmd stop`'s grace for an orphaned trainer
(daemon/child/grace.py), status's bit-reproducible line and overfitting warnings (daemon/views/reproducible.py,
fitwatch.py), its lineage, the commands given a run directory (sample, chat, export, verify: checkpoint_select.py),
and a later stage's init.from naming the run (init_source.py). The copy is read with state.json's owner rule
(perms.owner_or_me: the run directory's owner, whose supervisor wrote it, or ours): root's `stop` or `status` of a
user's run reads her copy, her grace and her warnings, not the defaults; a file a third user planted there is
refused. Read through the run directory's descriptor (the one a view judged, or opened here as its path leads),
no link followed, no FIFO opened, bounded (init_place.read_in), before a byte is parsed. Torch-free.
"""
from __future__ import annotations

import os
from pathlib import Path

from minilmd.config import MAX_CONFIG_BYTES, RunConfig, config_from_bytes
from minilmd.config_values import TrainTokens
from minilmd.dirfd import Dir
from minilmd.init_place import open_named, read_in
from minilmd.names import RUN_CONFIG_COPY
from minilmd.perms import owner_or_me


def run_config_of(run_dir: str | os.PathLike, dir_fd: int | None = None,
                  train_tokens_of: TrainTokens | None = None) -> RunConfig:
    """The run config copy in `run_dir`, loaded; `dir_fd`: the run directory already opened (a view's, judged:
    daemon/views/runarg.py open_run), read through it, `run_dir` then only names it. Raises ConfigError when it does
    not load, init_place.Refused (a ValueError) when it is not a regular file of the run's user or ours (a link, a
    FIFO, a third user's), FileNotFoundError when there is none, another OSError when it cannot be read now."""
    if dir_fd is None:
        with open_named(run_dir) as opened:
            return _read(opened, train_tokens_of)
    return _read(Dir(dir_fd, Path(run_dir)), train_tokens_of)  # not closed: the caller's descriptor


def _read(run: Dir, train_tokens_of: TrainTokens | None) -> RunConfig:
    raw = read_in(run, RUN_CONFIG_COPY, MAX_CONFIG_BYTES, owner_or_me(os.fstat(run.fd).st_uid))
    return config_from_bytes(raw, run.path / RUN_CONFIG_COPY, train_tokens_of=train_tokens_of)
