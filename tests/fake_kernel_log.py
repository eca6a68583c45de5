"""A fake kernel log for the tests of the OOM evidence (daemon/child/oomevidence.py reads `dmesg`): a shell script
named dmesg first on PATH, and the kernel log's clock to stamp a record with."""
from __future__ import annotations

import os
from pathlib import Path

NOW = "$(cut -d' ' -f1 /proc/uptime)"
"""The kernel log's clock when the fake dmesg runs (after the child died): seconds since boot, as printk stamps."""


def fake_dmesg(tmp_path: Path, monkeypatch, body: str) -> None:
    """`dmesg` as a shell script that prints a kernel log (or refuses, as kernel.dmesg_restrict makes it)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "dmesg"
    script.write_text("#!/bin/sh\n" + body + "\n", encoding="utf-8")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
