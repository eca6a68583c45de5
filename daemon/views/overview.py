"""`minilmd status` with no run directory (or `--all`): one line per run of this machine that the user may see,
from the registry (daemon/host/registry.py); `minilmd forget RUN`.

Each row: name, phase (with "not running" when its supervisor is gone before the end, "vanished" when its run
directory is gone, "unreadable" when its state.json cannot be read), step/total, loss, tok/s, ETA, the GPUs held or
how long it has waited for them, the last successful sync's age, restarts. `--json` gives the same rows as a list.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from minilmd import names
from minilmd.daemon.host import registry
from minilmd.daemon.runstate import read_state
from minilmd.daemon.statesections import StateJson
from minilmd.fmt import fmt_duration

COLUMNS = ("run", "phase", "step", "loss", "tok/s", "eta", "gpu", "sync", "restarts", "run_dir")
FINAL = ("done", "failed")


def row(entry: registry.Entry, t: float) -> dict:
    """One run's line as data (what --json prints, and what the table shows)."""
    from minilmd.daemon.views.status import supervisor_alive

    base = {"run": entry.name, "run_dir": str(entry.run_dir), "uid": entry.uid, "registered": entry.registered}
    if not entry.run_dir.is_dir():
        return {**base, "phase": "vanished", "running": False}
    if not os.access(entry.run_dir / names.STATE, os.R_OK) and (entry.run_dir / names.STATE).exists():
        return {**base, "phase": "unreadable", "running": False}
    raw = read_state(entry.run_dir)
    if raw is None:
        return {**base, "phase": "not started", "running": False}
    state = StateJson.from_dict(raw)  # a wrongly typed field reads as its default
    progress, sync = state.progress, state.sync
    alive = supervisor_alive(state)
    last_ok = sync.last_ok or (state.remote_checkpoint.time if state.remote_checkpoint else None)
    waited_since = state.gpu_wait.since if state.gpu_wait else None
    return {
        **base,
        "phase": state.phase,
        "running": alive,
        "step": progress.step,
        "total_steps": progress.total_steps,
        "loss": progress.loss,
        "val_loss": progress.val_loss,
        "tok_s": progress.tok_s,
        "eta_s": progress.eta_s if alive else None,
        "devices": state.devices,
        "gpu_waited_s": t - waited_since if state.phase == "waiting_gpu" and waited_since else None,
        "sync_state": sync.state,
        "last_sync_age_s": t - last_ok if last_ok else None,
        "restarts": len(state.restarts),
        "last_error": state.last_error,
    }


def _cells(r: dict) -> list[str]:
    phase = str(r.get("phase"))
    if r.get("phase") not in FINAL + ("vanished", "unreadable", "not started") and not r.get("running"):
        phase += " (not running)"
    step = "-" if r.get("step") is None else f"{r['step']:,}" + (f"/{r['total_steps']:,}" if r.get("total_steps")
                                                                  else "")
    if r.get("devices"):
        gpu = "held " + ",".join(str(d) for d in r["devices"])
    elif r.get("gpu_waited_s") is not None:
        gpu = f"waiting {fmt_duration(r['gpu_waited_s'])}"
    else:
        gpu = "-"
    if r.get("sync_state") == "off":
        sync = "off"
    else:
        sync = f"{fmt_duration(r['last_sync_age_s'])} ago" if r.get("last_sync_age_s") is not None else "-"
        if r.get("sync_state") in ("failed", "stalled", "unavailable"):
            sync += f" ({r['sync_state']})"
    return [r["run"], phase, step, f"{r['loss']:.4f}" if r.get("loss") is not None else "-",
            f"{r['tok_s']:,.0f}" if r.get("tok_s") else "-", fmt_duration(r.get("eta_s")), gpu, sync,
            str(r.get("restarts", "-")), r["run_dir"]]


def table(rows: list[dict]) -> list[str]:
    cells = [[c.upper() for c in COLUMNS]] + [_cells(r) for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    return ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in cells]


def status_all(as_json: bool = False, out=None) -> int:
    out = out or sys.stdout
    t = time.time()
    rows = [row(e, t) for e in registry.entries()]
    if as_json:
        print(json.dumps(rows, indent=2, sort_keys=True), file=out)
        return 0
    if not rows:
        print(f"no runs registered for you on this machine (registry: {registry.user_dir()}; a supervisor "
              f"registers its run when it starts)", file=out)
        return 0
    print("\n".join(table(rows)), file=out)
    vanished = [r["run"] for r in rows if r["phase"] == "vanished"]
    if vanished:
        print(f"run directories gone: {', '.join(vanished)}: `minilmd forget NAME` removes them from this list",
              file=out)
    return 0


def forget(target: str, out=None) -> int:
    """Exit 0 when something was forgotten, 1 when no entry of yours matched."""
    out = out or sys.stdout
    removed = registry.forget(target)
    if not removed:
        print(f"minilmd forget: no registered run of yours named {target!r} (see `minilmd status --all`)",
              file=sys.stderr)
        return 1
    for path in removed:
        print(f"forgot {target}: removed {path}", file=out)
    still = Path(target)
    if still.is_dir() and (still / names.STATE).exists():
        print(f"  {target} still exists: it is listed again when its supervisor starts", file=out)
    return 0
