"""`minilmd export` stopped at a known point while it writes, for tests/test_export_way_out.py: the export's files
are written into its temporary copy, then, as argv[1] says, "raise": an exception that is no write error (a bug),
or "wait": it says so in the file argv[2] and waits for the test's signal (SIGINT, SIGTERM; SIGKILL, which leaves
its temporary copy for the next export to remove). The rest of argv is the command line:
`python export_paused.py MODE READY export CKPT --format F --out OUT`."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from minilmd.cli import main
from minilmd.trainer.model import export


def _stopped(mode: str, ready: Path, write):
    def written_then_stopped(*args, **kwargs):
        write(*args, **kwargs)
        if mode == "raise":
            raise LookupError("a bug after the files were written, not a write error")
        ready.write_text("writing\n")
        time.sleep(3600)  # the signal comes here

    return written_then_stopped


if __name__ == "__main__":
    mode, ready, *argv = sys.argv[1:]
    torch.save = _stopped(mode, Path(ready), torch.save)  # minimind's .pth
    export._write_hf = _stopped(mode, Path(ready), export._write_hf)  # hf's directory
    sys.argv = ["minilmd", *argv]
    main()
