"""`minilmd` held inside one function of its own process, for tests of a Ctrl-C that lands there:

    HELD_AT=MODULE:FUNCTION HELD_DIR=DIR python tests/held_cli.py ARGS...   (in place of `minilmd ARGS...`)

Each call of MODULE.FUNCTION first creates DIR/reached and waits until DIR/go exists, then runs as it would: the
test signals the command there, whatever the machine's speed. Only this process is patched (not its workers).
"""
from __future__ import annotations

import importlib
import os
import time
from pathlib import Path


def hold_in(module_name: str, function: str, where: Path) -> None:
    module = importlib.import_module(module_name)
    real = getattr(module, function)

    def held(*args, **kwargs):
        (where / "reached").touch()
        while not (where / "go").exists():
            time.sleep(0.05)
        return real(*args, **kwargs)

    setattr(module, function, held)


if __name__ == "__main__":
    from minilmd.cli import main

    module_name, function = os.environ["HELD_AT"].split(":")
    hold_in(module_name, function, Path(os.environ["HELD_DIR"]))
    main()
