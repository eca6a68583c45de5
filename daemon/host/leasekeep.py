"""A held GPU lease kept valid while its run holds its cards (GpuAdmission.keep, from the supervisor's every tick
through daemon/phases/gpuwait.py keep_lease): each lease file touched and still named (daemon/host/leases.py keep),
else its name taken again as a lease is taken, and what each keep found, in words and a kind (`Kept`).

The kinds keep apart what the run must do about each:
- AGAIN: the file was removed (a cleaner of old files) and its name is this run's again: said, nothing lost;
- LOST: another run holds the name now, and so the card: by the admission's own rule (GpuAdmission.lease_busy, the
  rule's lease part) this run would not be admitted to that card now;
- UNTAKEN: the name is gone and could not be taken again, though no run holds it (a file no lease is taken through
  stands there now, or the file system refused): no other run leases the card through it either; tried again;
- UNSEEN: the name could not be looked at this time (the lock directory refused or unreadable for a moment, EIO,
  EMFILE): nothing is known, nothing is done, and the next keep looks again. Before, such a moment counted as a name
  gone: the run took its own lease's name again, found it flocked (by itself) and said the card lost to itself.
Nothing here removes, writes or touches another run's lease file. Torch-free.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from minilmd.daemon.host import leases
from minilmd.daemon.host.leases import LeaseFile
from minilmd.run_states import Named


class Kept(Named):
    """What a keep found of one lease file that was not simply still named (its name is the rest of the words)."""

    AGAIN = "taken again"
    LOST = "lost"
    UNTAKEN = "not taken again"
    UNSEEN = "not seen"


@dataclass(frozen=True)
class Said:
    words: str
    kind: Kept


class Taker(Protocol):
    """What a keep asks of the admission (daemon/host/gpu.py GpuAdmission): a name taken as try_acquire takes one,
    and why a lease cannot be ours now, by the admission's rule (`LEASED_BY` ...: another run holds it)."""

    lock_dir: Path
    LEASED_BY: str

    def take_name(self, name: str) -> LeaseFile | None: ...

    def lease_busy(self, name: str) -> str | None: ...


def keep(admission: Taker, files: list[LeaseFile], devices: list[int]) -> list[Said]:
    """A lease's files (`files`, of the cards `devices`) kept valid: each touched and still named (leases.keep), else
    its name taken again as try_acquire takes it (a new file made there, or the one there flocked) and held instead,
    in `files`. A `Said` for each file that was not seen still named."""
    said: list[Said] = []
    for k, held in enumerate(files):
        card = f"GPU {devices[k]}"
        try:
            if leases.keep(held):
                continue
        except leases.LeaseUnseen as e:
            said.append(Said(f"{card}: its lease file {held.path} could not be looked at ({e}): looked at again at "
                             f"the next keep; the lease holds while that name leads to the file held", Kept.UNSEEN))
            continue
        gone = f"{card}: its lease file {held.path} was removed while this run held it"
        again = admission.take_name(held.path.name)
        if again is None:
            busy = admission.lease_busy(held.path.name)
            if busy is not None and busy.startswith(admission.LEASED_BY):
                said.append(Said(f"{gone}, and its name is not this run's again ({busy}): another run may train on "
                                 f"that GPU now", Kept.LOST))
            else:
                said.append(Said(f"{gone}, and its name is not this run's again ({busy or 'free again now'}): "
                                 f"taken again at the next keep once it can be", Kept.UNTAKEN))
            continue
        leases.clear_body(held)
        held.close()  # a file no longer named: its flock leases nothing
        files[k] = again
        said.append(Said(f"{gone} (a cleaner of old files in {admission.lock_dir}?): its name taken again",
                         Kept.AGAIN))
    return said
