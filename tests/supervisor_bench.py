"""Figures for the supervisor (not a test; nothing is asserted): `python tests/supervisor_bench.py [KILLS]`.

Runs the real trainer (tiny model, CPU) under `minilmd run` with KILLS injected SIGKILLs and prints:
- recovery: time from a child's death to its first resumed training step (metrics.jsonl), backoff excluded;
- the supervisor's RSS (sampled every 0.2 s, and its peak VmHWM);
- how long `minilmd status` takes (wall time of the whole command, several runs).
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from minilmd.config import load_config
from supervisor_helpers import env_for, start_supervisor, write_config
from trainer_corpus import real_text_prepared


def rss_kib(pid: int) -> tuple[int, int]:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def main(kills: int = 5) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="minilmd-bench-"))
    corpus = real_text_prepared(tmp / "corpus", n_docs=400, vocab_size=512)
    steps = 6 * (kills + 1)
    config = write_config(tmp, corpus, train={"max_steps": steps, "checkpoint_every": 3},
                          restart={"backoff_initial": "0s", "backoff_max": "0s", "no_progress_limit": 100})
    cfg = load_config(config)
    fault = ",".join(f"sigkill@{6 * (i + 1) - 1}" for i in range(kills))
    proc = start_supervisor(config, tmp / "sup.out", fake=False, MINILMD_FAULT=fault)
    samples, peak = [], 0
    while proc.poll() is None:
        try:
            rss, hwm = rss_kib(proc.pid)
            samples.append(rss)
            peak = max(peak, hwm)
        except (OSError, KeyError):
            pass
        time.sleep(0.2)
    assert proc.returncode == 0, (tmp / "sup.out").read_text()[-3000:]
    state = json.loads((cfg.run_dir / "state.json").read_text())
    metrics = [json.loads(x) for x in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    deaths = [json.loads(x) for x in (cfg.run_dir / "events.jsonl").read_text().splitlines()
              if '"child_exit"' in x and '"killed"' in x]
    recoveries = []
    for death, restart in zip(deaths, state["restarts"], strict=True):
        first = min((m["time"] for m in metrics if m["kind"] == "train" and m["time"] > death["time"]), default=None)
        if first is not None:
            recoveries.append(first - death["time"] - restart["delay_s"])
    timings = []
    for _ in range(5):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "minilmd.cli", "status", str(cfg.run_dir)], env=env_for(),
                       capture_output=True, check=True)
        timings.append(time.perf_counter() - t0)
    print(f"recovery (death -> first resumed step, backoff excluded), {len(recoveries)} deaths: "
          f"median {statistics.median(recoveries):.2f}s, min {min(recoveries):.2f}s, max {max(recoveries):.2f}s")
    print(f"supervisor RSS over the run: median {statistics.median(samples) / 1024:.1f} MiB, "
          f"peak (VmHWM) {peak / 1024:.1f} MiB")
    print(f"`minilmd status`: median {statistics.median(timings):.3f}s over {len(timings)} runs "
          f"(min {min(timings):.3f}s)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
