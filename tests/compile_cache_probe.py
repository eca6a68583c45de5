"""`minilmd ...` itself, in this process, with torch.compile's backend replaced by one that asks torch, at the moment
it compiles, where inductor would read and write its caches, says so, and then runs the graph eagerly: for a
real-process test to see the caches of the real trainer or bench without minutes of inductor's C++ builds on 2 CPUs
(tests/test_compile_cache_attack.py).

    python tests/compile_cache_probe.py train CONFIG

prints, at each compile, `compile caches {"cache_dir": ..., "default_cache_dir": ..., "header_dir": ...,
"triton_cache_dir": ..., "tempdir": ...}`: torch's own answers (torch/_inductor/runtime/cache_dir_utils.py; the
directory of inductor's precompiled headers, named when it was imported; Python's temporary directory).
"""
from __future__ import annotations

import json
import tempfile

import torch

PROBE_LINE = "compile caches "


def recording_backend(gm, example_inputs):
    from torch._inductor import codecache
    from torch._inductor.runtime import cache_dir_utils

    seen = {"cache_dir": cache_dir_utils.cache_dir(), "default_cache_dir": cache_dir_utils.default_cache_dir(),
            "header_dir": codecache._HEADER_DIR, "triton_cache_dir": cache_dir_utils.triton_cache_dir(0),
            "tempdir": tempfile.gettempdir()}
    print(PROBE_LINE + json.dumps(seen), flush=True)
    return gm.forward


real_compile = torch.compile


def compile_recording(model=None, **kwargs):
    kwargs["backend"] = recording_backend
    return real_compile(model, **kwargs)


if __name__ == "__main__":
    torch.compile = compile_recording
    from minilmd.cli import main

    main()
