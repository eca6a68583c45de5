"""Each runtime requirement of minilmd (pyproject.toml) and the version this Python has: what a device machine's
image holds, read before the check runs (scripts/gpu-check-device). A missing one is named for its wheel to be
carried; one outside its range is only named, since the image cannot be changed there and it may well run."""
from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # minilmd's own requirement there
    import tomli as tomllib

from packaging.requirements import Requirement  # in the device image, and pulled in here by the test extra


def report(pyproject: Path) -> tuple[list[str], bool]:
    lines, missing = [], False
    for spec in tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["dependencies"]:
        req = Requirement(spec)
        if req.marker is not None and not req.marker.evaluate():
            continue
        try:
            found = version(req.name)
        except PackageNotFoundError:
            lines.append(f"{req.name:<16} {spec:<28} {'-':<14} MISSING: carry its wheel")
            missing = True
            continue
        verdict = "ok" if req.specifier.contains(found, prereleases=True) else "outside the range (runs as is)"
        lines.append(f"{req.name:<16} {spec:<28} {found:<14} {verdict}")
    return lines, missing


if __name__ == "__main__":
    lines, missing = report(Path(__file__).resolve().parents[1] / "pyproject.toml")
    print("\n".join(lines))
    import minilmd.daemon.supervisor
    import minilmd.trainer.loop.train
    from minilmd.protocol import COMMAND_FAILED

    # through the links: the checkout's folders that package-dir maps
    print(f"minilmd {Path(minilmd.__file__).resolve().parent}: daemon "
          f"{Path(minilmd.daemon.supervisor.__file__).resolve().parent}, "
          f"trainer {Path(minilmd.trainer.loop.train.__file__).resolve().parents[1]}")
    sys.exit(COMMAND_FAILED if missing else 0)
