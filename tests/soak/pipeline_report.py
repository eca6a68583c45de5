"""The pipeline soak's end: each stage's final checkpoint against the undisturbed pipeline's (step and every tensor
bit for bit), its scratch given back, and the summary (JSON and a table) with the verdict."""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from minilmd import checkpoint_dirs
from minilmd.names import EVENTS
from trainer_corpus import read_metrics


def tensors_equal(got: Path, want: Path) -> str | None:
    """None when every .safetensors file of the two checkpoint dirs holds the same tensors bit for bit."""
    import torch
    from safetensors.torch import load_file

    names = sorted(p.name for p in want.glob("*.safetensors"))
    if not names or names != sorted(p.name for p in got.glob("*.safetensors")):
        return f"weight files differ: {sorted(p.name for p in got.glob('*.safetensors'))} vs {names}"
    for name in names:
        a, b = load_file(str(got / name)), load_file(str(want / name))
        if a.keys() != b.keys():
            return f"{name}: tensor names differ"
        for key in a:
            if a[key].dtype != b[key].dtype or a[key].shape != b[key].shape or not torch.equal(a[key], b[key]):
                return f"{name}: tensor {key} differs"
    return None


def compare_final(stage, ref, remote: Path, ref_remote: Path) -> dict:
    """The checks of one stage against its undisturbed twin."""
    st, rst = stage.state(), ref.state()
    out = {"exit": stage.sup.returncode if stage.sup else None, "phase": st.get("phase"),
           "reference_exit": ref.sup.returncode if ref.sup else None, "reference_phase": rst.get("phase"),
           "supervisor_starts": stage.starts, "restarts": count_events(stage, "restart"),
           "scratch_left": [str(p) for p in (stage.cfg.scratch_dir, ref.cfg.scratch_dir) if p.exists()]}
    got, want = checkpoint_dirs.read_latest(remote), checkpoint_dirs.read_latest(ref_remote)
    out["final"], out["reference_final"] = got, want
    if got is None or want is None:
        out["weights"] = "no final checkpoint to compare"
    elif got != want:
        out["weights"] = f"final checkpoint {got}, undisturbed {want}"
    else:
        out["weights"] = tensors_equal(remote / got, ref_remote / want) or "identical"
    stops = [m["step"] for m in read_metrics(stage.cfg.run_dir, "early_stop")]
    out["early_stop_at"] = stops[-1] if stops else None
    return out


def count_events(stage, name: str) -> int:
    """Events of that name in the stage's events.jsonl (over all its supervisors)."""
    try:
        lines = (stage.cfg.run_dir / EVENTS).read_text(encoding="utf-8").splitlines()
    except OSError:
        return 0
    return sum(1 for line in lines if json.loads(line).get("event") == name)


def problems_of(soak, checks: dict) -> list[str]:
    problems = []
    for name, c in checks.items():
        if c["exit"] != 0 or c["phase"] != "done":
            problems.append(f"{name}: did not finish: exit {c['exit']}, phase {c['phase']}")
        if c["reference_exit"] != 0 or c["reference_phase"] != "done":
            problems.append(f"{name}: the undisturbed stage did not finish: exit {c['reference_exit']}, "
                            f"phase {c['reference_phase']}")
        if c["weights"] != "identical":
            problems.append(f"{name}: final weights: {c['weights']}")
        if c["scratch_left"]:
            problems.append(f"{name}: scratch not given back: {c['scratch_left']}")
    for f in soak.failures:
        problems.append(f"stage failure: {f['stage']} exit {f['exit']} ({f['phase']}): {f['why']} "
                        f"after {f['after_faults']}")
    unrecovered = [f"{f['kind']} on {f['stage']}@{f['step']}" for f in soak.faults if f["recovered_at"] is None]
    if unrecovered:
        problems.append(f"{len(unrecovered)} fault(s) never recovered: {unrecovered[:10]}")
    return problems


def report(soak, checks: dict, elapsed: float) -> int:
    by_kind: dict[str, list[dict]] = defaultdict(list)
    for f in soak.faults:
        by_kind[f["kind"]].append(f)
    failed_after: dict[str, int] = defaultdict(int)
    for failure in soak.failures:
        if failure["after_faults"] and not failure["cascade"]:  # a cascade is its predecessor's failure
            failed_after[failure["after_faults"][-1].split("@")[0]] += 1
    problems = problems_of(soak, checks)
    summary = {
        "minutes": soak.args.minutes, "seed": soak.args.seed, "wall_s": round(elapsed, 1), "work": str(soak.work),
        "faults": len(soak.faults),
        "faults_by_kind": {k: {"injected": len(v), "recovered": sum(f["recovered_at"] is not None for f in v),
                               "stage_failures_after": failed_after.get(k, 0),
                               "variants": sorted({f["variant"] for f in v if "variant" in f})}
                           for k, v in sorted(by_kind.items())},
        "stages": checks, "stage_failures": soak.failures, "notes": soak.notes,
        "result": "PASS" if not problems else "FAIL", "problems": problems,
    }
    print(json.dumps(summary, indent=1), flush=True)
    lines = [f"pipeline soak: {elapsed / 60:.1f} min, {len(soak.faults)} faults, seed {soak.args.seed}, {soak.work}",
             f"{'fault':<24} {'injected':>8} {'recovered':>9} {'failed a stage':>14} {'mean s':>7}"]
    for kind, fs in sorted(by_kind.items()):
        times = [f["recovered_at"] - f["time"] for f in fs if f["recovered_at"] is not None]
        mean = f"{sum(times) / len(times):7.1f}" if times else "      -"
        lines.append(f"{kind:<24} {len(fs):>8} {len(times):>9} {failed_after.get(kind, 0):>14} {mean}")
    lines.append(f"{'stage':<10} {'exit':>4} {'phase':<8} {'sup starts':>10} {'restarts':>8}  weights / scratch")
    for name, c in checks.items():
        lines.append(f"{name:<10} {str(c['exit']):>4} {str(c['phase']):<8} {c['supervisor_starts']:>10} "
                     f"{c['restarts']:>8}  {c['weights']} / {'left' if c['scratch_left'] else 'freed'}")
    lines += [f"note: {n}" for n in soak.notes]
    lines.append("RESULT: " + ("PASS" if not problems else "FAIL\n  " + "\n  ".join(problems)))
    print("\n".join(lines), flush=True)
    return 0 if not problems else 1
