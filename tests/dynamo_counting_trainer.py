"""`minilmd train` itself, in this process, that prints torch dynamo's counters as it exits: for a real-supervisor
test to count the graphs its real trainer compiled (tests/test_bucketed_compile_run.py).

    MINILMD_TRAINER_CMD="python tests/dynamo_counting_trainer.py" minilmd run CONFIG

The last line of the attempt's log is then `dynamo counters {"stats": {"unique_graphs": N, ...}, ...}`.
"""
from __future__ import annotations

import atexit
import json

COUNTERS_LINE = "dynamo counters "


def print_counters() -> None:
    from torch._dynamo.utils import counters

    print(COUNTERS_LINE + json.dumps({group: dict(values) for group, values in counters.items()}, default=str),
          flush=True)


if __name__ == "__main__":
    atexit.register(print_counters)  # after the trainer's own exit path (typer ends it with SystemExit)
    from minilmd.cli import main

    main()
