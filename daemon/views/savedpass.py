"""The pairs a stopped DPO reference pass kept, for `minilmd status`'s step line: a DPO run stopped (or killed after
a periodic save) during its reference pass has step 0 saved with the pass's sums so far, and its trainer said
"the pairs done are saved at step 0 (408/2,490 pairs)"; status showed only "step 0", as if nothing of the pass was
kept. Read from that step 0's manifest (its REFERENCE_PASS, minilmd/checkpoint_contents.py reference_pass): a
regular file of the run's owner (or ours), no link followed, at most MANIFEST_MAX_BYTES, its JSON depth bounded.
Torch- and numpy-free.
"""
from __future__ import annotations

import os
from pathlib import Path

from minilmd import names
from minilmd.checkpoint_contents import reference_pass
from minilmd.daemon.base.runstate import reference_pass_words, state_owners
from minilmd.daemon.base.statesections import StateJson
from minilmd.daemon.views.pathlooks import Looks
from minilmd.untrusted import Unreadable, loads, read_bytes


def saved_pass_words(run_dir: Path, state: StateJson, dir_fd: int | None = None, looks: Looks | None = None) -> str:
    """" (DPO reference pass 408/2,490 pairs saved)" when the run is at step 0 and its newest local checkpoint is a
    step 0 whose manifest says a stopped pass; "" otherwise (no pass, its sums complete, or it cannot be read).
    `dir_fd`: the run directory judged (runarg.open_run), whose owner's manifest is read; the path is state.json's,
    read as pathlooks.py looks (bounded: one that does not answer is said through `looks`)."""
    local = state.local_checkpoint
    if state.progress.step != 0 or local is None or local.step != 0 or not local.path:
        return ""
    step0 = Path(local.path)
    if step0.name != names.step_name(0):  # state.json's path names something else: not read
        return ""
    owners = state_owners(run_dir, dir_fd)
    manifest = (looks or Looks()).look("the checkpoint", step0, _manifest, step0, owners, default=None)
    if manifest is None:
        return ""
    saved = reference_pass(manifest) if manifest.get("step") == 0 else None
    return f" ({reference_pass_words(saved)} saved)" if saved else ""


def _manifest(step0: Path, owners) -> dict | None:
    """step0's manifest, a regular file of `owners` (no link as it, nor as step0: the walk is not followed at
    either), None when it cannot be read."""
    try:
        fd = os.open(step0, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return loads(read_bytes(names.MANIFEST, max_bytes=names.MANIFEST_MAX_BYTES, owner=owners, dir_fd=fd),
                     expect=dict)
    except (Unreadable, OSError, ValueError):
        return None
    finally:
        os.close(fd)
