"""scripts/gpu-check (a script without .py: loaded as a module, not run) and gpu_check_plan beside it, for the tests
of the device check's parts and time plan."""
from __future__ import annotations

import importlib.util
import sys
from importlib.machinery import SourceFileLoader
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load_scripts() -> tuple[ModuleType, ModuleType]:
    """(the gpu-check script as a module, gpu_check_plan), each part's name and function, timeouts and estimates."""
    loader = SourceFileLoader("gpu_check_script", str(SCRIPTS / "gpu-check"))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    check = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(SCRIPTS))
    try:
        loader.exec_module(check)
        import gpu_check_plan as plan
    finally:
        sys.path.remove(str(SCRIPTS))
    return check, plan
