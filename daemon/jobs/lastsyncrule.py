"""When the stopping phase's last sync pushes nothing (daemon/jobs/syncworker.py `final_sync`): scratch holds nothing
newer than what the remote is recorded to hold.

- No trainer ran in this start and scratch's newest checkpoint is the one this start's staging fetched from the
  remote (daemon/jobs/stagingfetch.py `fetched_step`): nothing new. A stop during staging's re-list of a remote
  that listed only older steps than the run's records (the first fetch had already put that older step in scratch)
  pushed it: the remote's LATEST moved back, state.json's remote step was rewritten to the older one, and the next
  start resumed from it with no note of the steps trained again (review12a F1).
- Scratch's newest is older than the step state.json records synced to this remote: a sync never moves the
  remote's LATEST back to an older step (the periodic sync's own rule: only a newer step than the remote's starts
  one). `run --fresh` is one way back: its start from step 0 forgets state.json's remote step
  (daemon/jobs/stagingworker.py), so nothing is refused then; the other is a start whose staging resumed from an
  older step than the remote held, saying so (its newer steps set aside as invalid, or gone: stagingfetch.py
  `rewound`): those are lost, and the steps trained again are what the remote is to hold.
Torch-free.
"""
from __future__ import annotations

from minilmd.daemon.base.runstate import RunState, names_remote


def nothing_to_push(url: str, state: RunState, newest: int | None, fetched: int | None,
                    trainer_launched: bool, rewound: bool = False) -> str:
    """Why the last sync pushes nothing, in words read after "the last sync pushes nothing: "; "" when it syncs.
    `newest`: scratch's newest checkpoint step; `fetched`: the step this start's staging fetched from `url` into
    scratch (None: none); `trainer_launched`: a trainer was launched in this start (it may have saved since);
    `rewound`: this start resumed from an older step than the remote held, saying so."""
    if newest is None:
        return ""
    if not trainer_launched and fetched is not None and newest == fetched:
        return f"scratch's newest checkpoint, step {newest}, is the one this start fetched from {url}, and no " \
               f"trainer ran since: nothing new"
    recorded = state.remote_checkpoint
    if not rewound and recorded is not None and recorded.step is not None and newest < recorded.step and \
            names_remote(recorded.path, url):
        return f"scratch's newest checkpoint, step {newest}, is older than step {recorded.step}, which state.json " \
               f"records synced to {url}: the remote's LATEST is never moved back to an older step (but by " \
               f"`minilmd run --fresh`), and the record stays step {recorded.step}"
    return ""
