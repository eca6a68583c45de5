"""The pairs a stopped DPO reference pass kept, for `minilmd status`'s step line: a DPO run stopped (or killed after
a periodic save) during its reference pass has step 0 saved with the pass's sums so far, and its trainer said
"the pairs done are saved at step 0 (408/2,490 pairs)"; status showed only "step 0", as if nothing of the pass was
kept. Read from that step 0's manifest (its REFERENCE_PASS, minilmd/checkpoint_contents.py reference_pass): a
regular file of the run's owner (or ours), no link followed, at most MANIFEST_MAX_BYTES, its JSON depth bounded.
Torch- and numpy-free.
"""
from __future__ import annotations

from pathlib import Path

from minilmd import names
from minilmd.checkpoint_contents import reference_pass
from minilmd.daemon.base.runstate import reference_pass_words, state_owners
from minilmd.daemon.base.statesections import StateJson
from minilmd.untrusted import Unreadable, loads, read_bytes


def saved_pass_words(run_dir: Path, state: StateJson, dir_fd: int | None = None) -> str:
    """" (DPO reference pass 408/2,490 pairs saved)" when the run is at step 0 and its newest local checkpoint is a
    step 0 whose manifest says a stopped pass; "" otherwise (no pass, its sums complete, or it cannot be read).
    `dir_fd`: the run directory judged (runarg.open_run), whose owner's manifest is read."""
    local = state.local_checkpoint
    if state.progress.step != 0 or local is None or local.step != 0 or not local.path:
        return ""
    step0 = Path(local.path)
    if step0.name != names.step_name(0):  # state.json's path names something else: not read
        return ""
    try:
        manifest = loads(read_bytes(step0 / names.MANIFEST, max_bytes=names.MANIFEST_MAX_BYTES,
                                    owner=state_owners(run_dir, dir_fd)), expect=dict)
    except (Unreadable, OSError, ValueError):
        return ""
    saved = reference_pass(manifest) if manifest.get("step") == 0 else None
    return f" ({reference_pass_words(saved)} saved)" if saved else ""
