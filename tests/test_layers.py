"""The layers hold by structure, and the map of them in docs/architecture.md cannot drift.

- `minilmd/` (the torch-free core) and `daemon/` (the supervisor) never import torch, nor anything of
  `minilmd.trainer`: checked on the import statements of every module (module level and inside functions), and
  at run time by importing every module with torch made unimportable. The one exception is the command line's
  trainer commands (`minilmd/cli/trainer.py`, `minilmd/cli/bench.py`), which import their implementation inside
  the command's body.
- The command line's modules import only typer, the stdlib and `minilmd.names` at module level, so that loading
  it (`minilmd status`) costs nothing else.
- The corpus commands (`prepare`, `corpus ...`, `tokenizer ...`, `demo-corpus`: `minilmd/cli/data.py`) never reach
  the trainer: neither that module nor anything it imports, transitively, names `minilmd.trainer`; and they run in a
  process where torch and `minilmd.trainer` are unimportable.
- "Where things live" in docs/architecture.md names every package and module there is, and no other.
- `trainer/` means "needs torch": every module of it (a package's __init__ aside) imports torch, or a module of
  ours that does, transitively; a torch-free one belongs in the core (minilmd/plan/ and the like).
- Folders in layers: FOLDER_LAYERS orders every folder of code bottom to top, and a folder imports only its own
  modules and those of folders below it (annotation-only and function-level imports count), so no two folders
  import each other, however indirectly.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from import_helpers import DYNAMIC, REPO, imports, modules_of

DOC = REPO / "docs" / "architecture.md"
TORCH_FREE = {"minilmd": REPO / "minilmd", "minilmd.daemon": REPO / "daemon"}
CODE_FOLDERS = {"minilmd": REPO / "minilmd", "daemon": REPO / "daemon", "trainer": REPO / "trainer"}
PULLS_IN_TORCH = ("torch", "safetensors.torch", "transformers", "peft", "accelerate", "minilmd.trainer")
"""Import names (and their submodules) that load torch, or the trainer that does."""
CLI = REPO / "minilmd" / "cli"
MAY_REACH_THE_TRAINER = {CLI / "trainer.py", CLI / "bench.py"}
"""The command-line modules of the trainer's commands: allowed to import `minilmd.trainer` inside a function body
(never at module level)."""
CORPUS_COMMANDS = ("minilmd.cli.data", "minilmd.cli.tokenizer")
"""The command-line modules of `prepare`, `corpus ...` and `tokenizer ...`: they never reach the trainer."""
CLI_MODULE_LEVEL = ("typer", "minilmd.cli", "minilmd.names", "minilmd.corpus.exits", "minilmd.corpus.cli_options")
"""What a command-line module may import at module level besides the stdlib (names.py: constants, `os` and `re`;
corpus/exits.py: how the commands end, typer, the stdlib and protocol.py's exit statuses only, in a package whose
__init__ imports nothing; corpus/cli_options.py, the shared options, typer only, there for the same reason)."""


def pulls_in_torch(name: str) -> bool:
    """An import that loads torch or the trainer, or one whose name is computed (import_module(name)): a torch-free
    layer cannot be shown to stay so through it."""
    return name == DYNAMIC or any(name == bad or name.startswith(bad + ".") for bad in PULLS_IN_TORCH)


def layer_violations() -> list[str]:
    problems = []
    for package, folder in TORCH_FREE.items():
        for module, path in modules_of(package, folder).items():
            for name, line, top in imports(path, module):
                if not pulls_in_torch(name):
                    continue
                lazy_trainer = not top and name.startswith("minilmd.trainer") and path in MAY_REACH_THE_TRAINER
                if not lazy_trainer:
                    where = "module level" if top else "inside a function"
                    problems.append(f"{path.relative_to(REPO)}:{line}: imports {name} ({where})")
    return sorted(set(problems))


def test_the_torch_free_layers_import_neither_torch_nor_the_trainer():
    problems = layer_violations()
    assert not problems, "the core and the supervisor must stay torch-free:\n" + "\n".join(problems)


def test_the_checker_sees_a_violation(tmp_path):
    """The rule can fail: a module that imports torch inside a function, or the trainer at module level."""
    fake = tmp_path / "bad.py"
    fake.write_text("import os\nfrom minilmd.trainer.loop import train\n\ndef f():\n    import torch.nn\n",
                    encoding="utf-8")
    found = [(n, line, top) for n, line, top in imports(fake, "minilmd.bad") if pulls_in_torch(n)]
    assert ("minilmd.trainer.loop.train", 2, True) in found
    assert ("torch.nn", 5, False) in found
    rel = tmp_path / "pkg" / "mod.py"
    rel.parent.mkdir()
    rel.write_text("from ..trainer import model\n", encoding="utf-8")
    assert ("minilmd.trainer.model", 1, True) in imports(rel, "minilmd.pkg.mod")


def test_an_import_by_a_function_call_is_seen(tmp_path):
    """importlib.import_module and __import__ import too: a literal name is read as an import statement's, a computed
    one is a violation of its own (nothing shows where it leads)."""
    fake = tmp_path / "bad.py"
    fake.write_text("import importlib\nfrom importlib import import_module as load\n"
                    "TORCH = importlib.import_module('torch')\n\n"
                    "def f(name='safetensors.torch'):\n    nn = __import__('torch.nn')\n"
                    "    train = load('minilmd.trainer.loop.train')\n    return importlib.import_module(name)\n",
                    encoding="utf-8")
    found = [(n, line, top) for n, line, top in imports(fake, "minilmd.bad") if pulls_in_torch(n)]
    assert found == [("torch", 3, True), ("torch.nn", 6, False), ("minilmd.trainer.loop.train", 7, False),
                     (DYNAMIC, 8, False)]


@pytest.mark.parametrize("package", sorted(TORCH_FREE))
def test_every_module_imports_with_torch_unimportable(package):
    """The run-time side of the rule: each module of the layer imports in a process where `import torch`
    fails (third-party modules that would load torch are caught too)."""
    modules = sorted(modules_of(package, TORCH_FREE[package]))
    code = ("import sys, importlib\n"
            "for name in ('torch', 'transformers', 'safetensors.torch'): sys.modules[name] = None\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            "assert not any(m == 'minilmd.trainer' or m.startswith('minilmd.trainer.') for m in sys.modules), "
            "[m for m in sys.modules if m.startswith('minilmd.trainer')]\n"
            "print('ok', len(%r))" % (modules,))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("ok"), done.stderr[-2000:]


# --- the command line -----------------------------------------------------------------------------------------

def every_module() -> dict[str, Path]:
    return {name: module for package, folder in (*TORCH_FREE.items(), ("minilmd.trainer", REPO / "trainer"))
            for name, module in modules_of(package, folder).items()}


def module_level_strays(path: Path, module: str) -> list[str]:
    """The module-level imports of a command-line module that are neither the stdlib nor CLI_MODULE_LEVEL."""
    def allowed(name: str) -> bool:
        return (name.split(".")[0] in sys.stdlib_module_names or name == "__future__"
                or any(name == ok or name.startswith(ok + ".") for ok in CLI_MODULE_LEVEL))

    return [f"{path.relative_to(path.parents[2])}:{line}: imports {name} at module level"
            for name, line, top in imports(path, module) if top and not allowed(name)]


def test_the_command_line_imports_only_typer_and_the_stdlib_at_module_level():
    modules = modules_of("minilmd.cli", CLI)
    assert {"minilmd.cli", "minilmd.cli.data", "minilmd.cli.tokenizer", "minilmd.cli.trainer"} <= set(modules), \
        sorted(modules)
    problems = [p for module, path in modules.items() for p in module_level_strays(path, module)]
    assert not problems, "import these inside the command's body:\n" + "\n".join(problems)


def test_the_module_level_rule_can_fail(tmp_path):
    """A core module imported at module level is named; typer, names.py, the stdlib and a function's imports are
    not."""
    fake = tmp_path / "minilmd" / "cli" / "fake.py"
    fake.parent.mkdir(parents=True)
    fake.write_text("import json\nimport typer\nfrom minilmd.names import STATE\nfrom minilmd.config import load\n\n"
                    "def f():\n    import numpy\n", encoding="utf-8")
    assert module_level_strays(fake, "minilmd.cli.fake") == [
        "minilmd/cli/fake.py:4: imports minilmd.config.load at module level",
        "minilmd/cli/fake.py:4: imports minilmd.config at module level"]


def trainer_reached_from(start: str, modules: dict[str, Path]) -> list[str]:
    """Every import that names `minilmd.trainer` (module level or inside a function) in `start` or in any module
    of `modules` it imports, transitively (the packages above an imported module too: they run first)."""
    found: list[str] = []
    seen, todo = {start}, [(start, start)]
    while todo:
        module, chain = todo.pop()
        for name, line, _ in imports(modules[module], module):
            if name == "minilmd.trainer" or name.startswith("minilmd.trainer."):
                found.append(f"{chain}: line {line} imports {name}")
                continue
            parts = name.split(".")
            for target in (".".join(parts[:n]) for n in range(1, len(parts) + 1)):
                if target in modules and target not in seen:
                    seen.add(target)
                    todo.append((target, f"{chain} -> {target}"))
    return sorted(found)


def test_the_corpus_commands_import_nothing_of_the_trainer():
    modules = every_module()
    assert set(CORPUS_COMMANDS) <= set(modules) and "minilmd.corpus.prepare.pipeline" in modules
    problems = [p for module in CORPUS_COMMANDS for p in trainer_reached_from(module, modules)]
    assert not problems, "prepare, corpus and tokenizer must not reach trainer/:\n" + "\n".join(problems)


def test_the_reach_rule_can_fail(tmp_path):
    """Through a function-level import and through the package above an imported module; a module that is not
    imported is not followed."""
    files = {"minilmd.cli.fake": "from minilmd.helper import go\nimport minilmd.pkg.mod\n",
             "minilmd.helper": "def go():\n    from minilmd.deep import x\n",
             "minilmd.deep": "import os\nfrom minilmd.trainer.loop import train\n",
             "minilmd.pkg": "from ..trainer import model\n",
             "minilmd.pkg.mod": "import json\n",
             "minilmd.unused": "import minilmd.trainer\n"}
    modules = {}
    for name, text in files.items():
        path = tmp_path / (name.replace(".", "_") + (".py" if name != "minilmd.pkg" else "/__init__.py"))
        path.parent.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
        modules[name] = path
    assert trainer_reached_from("minilmd.cli.fake", modules) == [
        "minilmd.cli.fake -> minilmd.helper -> minilmd.deep: line 2 imports minilmd.trainer.loop",
        "minilmd.cli.fake -> minilmd.helper -> minilmd.deep: line 2 imports minilmd.trainer.loop.train",
        "minilmd.cli.fake -> minilmd.pkg: line 1 imports minilmd.trainer",
        "minilmd.cli.fake -> minilmd.pkg: line 1 imports minilmd.trainer.model"]
    assert trainer_reached_from("minilmd.pkg.mod", modules) == []


UNIMPORTABLE_RUN = """
import json, sys
for name in json.loads(sys.argv[1]): sys.modules[name] = None  # `import torch` (or the trainer) now fails
from typer.testing import CliRunner
from minilmd.cli import app
done = []
for argv in json.loads(sys.argv[2]):
    r = CliRunner().invoke(app, argv)
    failure = None if r.exception is None or isinstance(r.exception, SystemExit) else repr(r.exception)
    done.append({"argv": argv, "exit": r.exit_code, "failure": failure, "output": r.output})
print(json.dumps(done))
"""


def run_without_the_trainer(*commands: list[str]) -> list[dict]:
    """Each command through the CLI, in one process where torch and `minilmd.trainer` cannot be imported."""
    done = subprocess.run([sys.executable, "-c", UNIMPORTABLE_RUN, json.dumps(PULLS_IN_TORCH), json.dumps(commands)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_the_corpus_commands_run_with_torch_and_the_trainer_unimportable(tmp_path):
    src = tmp_path / "c.jsonl"
    src.write_text("".join(json.dumps({"text": f"第{i}行 some text, number {i} 的文字"}, ensure_ascii=False) + "\n"
                           for i in range(40)), encoding="utf-8")
    tok, out = tmp_path / "tokenizer.json", tmp_path / "prepared"
    results = run_without_the_trainer(
        ["tokenizer", "train", str(src), "--vocab-size", "300", "--out", str(tok)],
        ["prepare", str(src), "--tokenizer", str(tok), "--out", str(out), "--val-fraction", "0.5", "--workers", "0"],
        ["corpus", "report", str(out), "--workers", "0", "--json"])
    for r in results:
        assert (r["exit"], r["failure"]) == (0, None), r
    assert json.loads(results[2]["output"])["documents"] == 40


def test_the_unimportable_run_sees_a_command_that_reaches_the_trainer(tmp_path):
    """The run-time rule can fail: `chat` imports the trainer in its body, and that import fails there."""
    [r] = run_without_the_trainer(["chat", str(tmp_path)])
    assert r["exit"] != 0 and "ModuleNotFoundError" in r["failure"] and "minilmd.trainer" in r["failure"], r


def test_train_says_a_bad_config_before_it_imports_torch(tmp_path):
    """`minilmd train` judges its config before it imports the trainer (torch: seconds of CPU at every start): a
    mistyped key is said, exit 2, with torch and the trainer unimportable."""
    config = tmp_path / "run.toml"
    config.write_text("[run]\nname = 'x'\n[trian]\nmax_steps = 3\n", encoding="utf-8")
    [missing, mistyped] = run_without_the_trainer(["train", str(tmp_path / "nowhere.toml")], ["train", str(config)])
    for r in (missing, mistyped):
        assert (r["exit"], r["failure"]) == (2, None), r
    assert "trian" in mistyped["output"], mistyped


# --- "Where things live" ---------------------------------------------------------------------------------------

TREE_LINE = re.compile(r"^(?P<indent> *)(?P<name>[\w.]+/?)(?:\s{2,}(?P<what>\S.*))?$")


def documented_paths() -> dict[str, str]:
    """{path relative to the repo: its description} from the code block of the section "Where things live"."""
    text = DOC.read_text(encoding="utf-8")
    m = re.search(r"^## Where things live\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert m, f"{DOC.name} has no section '## Where things live'"
    block = re.search(r"^```text\n(.*?)^```", m.group(1), re.S | re.M)
    assert block, "the section 'Where things live' has no ```text block"
    paths: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    for line in block.group(1).splitlines():
        if not line.strip():
            continue
        lm = TREE_LINE.match(line)
        assert lm, f"not a tree line: {line!r}"
        indent, name = len(lm.group("indent")), lm.group("name")
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = "/".join([p for _, p in stack] + [name.rstrip("/")])
        assert lm.group("what"), f"{path}: no description"
        paths[path + ("/" if name.endswith("/") else "")] = lm.group("what")
        if name.endswith("/"):
            stack.append((indent, name.rstrip("/")))
    return paths


def actual_paths() -> set[str]:
    found = set()
    for top, folder in CODE_FOLDERS.items():
        found.add(top + "/")
        for path in folder.rglob("*.py"):
            rel = path.relative_to(REPO)
            if path.name == "__init__.py":
                found.add(str(rel.parent) + "/")
            else:
                found.add(str(rel))
    return found


def skeleton(paths: set[str]) -> str:
    """The tree as the doc should have it (descriptions to write by hand), printed on a drift."""
    lines = []
    for p in sorted(paths, key=lambda s: s.rstrip("/").split("/")):
        depth = p.rstrip("/").count("/")
        name = p.rstrip("/").split("/")[-1] + ("/" if p.endswith("/") else "")
        lines.append(f"{'  ' * depth}{name:<{30 - 2 * depth}}  ...")
    return "\n".join(lines)


def test_where_things_live_names_every_module():
    documented, actual = set(documented_paths()), actual_paths()
    missing, stale = sorted(actual - documented), sorted(documented - actual)
    assert not missing and not stale, (f"not in 'Where things live': {missing}; there but gone: {stale}. "
                                       f"The tree as it is:\n{skeleton(actual)}")


def imports_of_test_modules(folder: Path) -> list[str]:
    """Each import of a test module (test_*.py) by another module of the tests folder: what two test modules
    share lives in a helpers module (tests/conftest.py lists them)."""
    return sorted(f"{path.relative_to(folder.parent)}:{line}: imports {name}"
                  for module, path in modules_of("", folder).items()
                  for name, line, _top in imports(path, module)
                  if name.rpartition(".")[2].startswith("test_"))


def test_no_test_module_imports_another():
    assert imports_of_test_modules(REPO / "tests") == []


def test_the_test_module_rule_can_fail(tmp_path):
    (tmp_path / "test_a.py").write_text("def helper():\n    return 1\n")
    (tmp_path / "test_b.py").write_text("from test_a import helper\n\n\ndef test_b():\n    assert helper()\n")
    assert imports_of_test_modules(tmp_path) == [f"{tmp_path.name}/test_b.py:1: imports test_a"]


# --- trainer/ needs torch ----------------------------------------------------------------------------------------

NEEDS_TORCH = ("torch", "safetensors.torch", "transformers", "peft", "accelerate")


def torch_free_modules(package: str, modules: dict[str, Path]) -> list[str]:
    """The modules of `package` (its packages' __init__ aside) that neither import torch (or what loads it) nor
    import, transitively, a module of `modules` that does."""
    needs: dict[str, bool] = {}

    def reaches_torch(module: str, path: tuple[str, ...] = ()) -> bool:
        if module not in needs:
            needs[module] = False  # a module on the current path: its answer comes from the other imports
            for name, _, _ in imports(modules[module], module):
                parts = name.split(".")
                ours = [".".join(parts[:n]) for n in range(1, len(parts) + 1) if ".".join(parts[:n]) in modules]
                if any(name == t or name.startswith(t + ".") for t in NEEDS_TORCH) or any(
                        target not in path and reaches_torch(target, (*path, module)) for target in ours):
                    needs[module] = True
                    break
        return needs[module]

    return sorted(m for m, path in modules.items()
                  if m.startswith(package + ".") and path.name != "__init__.py" and not reaches_torch(m))


def test_every_trainer_module_needs_torch():
    free = torch_free_modules("minilmd.trainer", every_module())
    assert not free, ("torch-free modules in trainer/ (move them into the core, e.g. minilmd/plan/): "
                      + ", ".join(free))


def test_the_needs_torch_rule_can_fail(tmp_path):
    """A module importing only the stdlib and the core is found; one that reaches torch through a module of ours
    (inside a function) is not, nor is a package's __init__."""
    files = {"minilmd.trainer": "", "minilmd.trainer.plain": "import json\nfrom minilmd.names import STATE\n",
             "minilmd.trainer.uses": "def f():\n    from minilmd.trainer.model import m\n",
             "minilmd.trainer.model.m": "import torch.nn\n", "minilmd.names": "import os\n"}
    modules = {}
    for name, text in files.items():
        path = tmp_path / (name + ("/__init__.py" if name == "minilmd.trainer" else ".py"))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        modules[name] = path
    assert torch_free_modules("minilmd.trainer", modules) == ["minilmd.trainer.plain"]


# --- folders in layers -------------------------------------------------------------------------------------------

FOLDER_LAYERS = (
    "minilmd",                  # the core's base: names, config, checkpoint format, meta.json, file I/O
    "minilmd/corpus/sources",   # raw corpora read
    "minilmd/corpus",           # a prepared corpus read, tokenizers, chat templates
    "minilmd/corpus/analysis",  # what a corpus holds
    "minilmd/corpus/prepare",   # writing one (its report from the analysis)
    "minilmd/corpus/bench",
    "minilmd/plan",             # what a run will do: rows, budget, schedule, FLOPs
    "daemon/base",              # the daemon's bottom: phases and transitions, state.json, the worker thread
    "daemon/host", "daemon/child", "daemon/jobs", "daemon/phases", "daemon/slurm", "daemon", "daemon/views",
    "trainer", "trainer/checkpoint", "trainer/model", "trainer/loop", "trainer/bench",
    "minilmd/cli",              # the command line reaches everything, inside its commands' bodies
)
"""Every folder of code, bottom to top: a folder imports only itself and the folders before it."""


def folder_of(path: Path, root: Path) -> str:
    return str(path.parent.relative_to(root))


def module_imports(modules: dict[str, Path], root: Path) -> dict[tuple[str, str], dict[str, str]]:
    """{(folder, folder it imports): {module of the second folder imported: the first import line that does}} over
    every import of every module, annotation-only (`if TYPE_CHECKING:`) and function-level ones included."""
    found: dict[tuple[str, str], dict[str, str]] = {}
    for module, path in sorted(modules.items()):
        listed = imports(path, module)
        for name, line, _ in listed:
            if any(other in modules and other.startswith(name + ".") for other, at, _ in listed if at == line):
                continue  # `from package import module`: the module is what is imported, not the package's body
            parts = name.split(".")
            ours = [".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in modules]
            if ours:
                pair = (folder_of(path, root), folder_of(modules[ours[0]], root))
                if pair[0] != pair[1]:
                    found.setdefault(pair, {}).setdefault(ours[0], f"{path.relative_to(root)}:{line} imports {name}")
    return found


def folder_imports(modules: dict[str, Path], root: Path) -> dict[tuple[str, str], str]:
    """{(folder, folder it imports): the first import line that does}, as module_imports."""
    return {pair: next(iter(targets.values())) for pair, targets in module_imports(modules, root).items()}


def upward_imports(found: dict[tuple[str, str], str], layers: tuple[str, ...]) -> dict[tuple[str, str], str]:
    """The imports of a folder from a folder at or above it in `layers` (or in no layer): each one half of a
    folder cycle, or a cycle's beginning."""
    rank = {folder: i for i, folder in enumerate(layers)}
    return {pair: where for pair, where in found.items()
            if pair[0] not in rank or pair[1] not in rank or rank[pair[1]] > rank[pair[0]]}


def test_every_folder_of_code_is_in_one_layer():
    folders = {folder_of(path, REPO) for path in every_module().values()}
    assert sorted(folders) == sorted(FOLDER_LAYERS) and len(set(FOLDER_LAYERS)) == len(FOLDER_LAYERS)


def test_no_folder_imports_one_above_it():
    """No folder cycle anywhere, the daemon's included: its root held both the loop's top and the bottom its
    subfolders build on until the bottom moved to daemon/base/ (issue 43)."""
    found = folder_imports(every_module(), REPO)
    upward = upward_imports(found, FOLDER_LAYERS)
    assert not upward, "imports of a folder above (a folder cycle, or one begun):\n" + "\n".join(
        f"{a} -> {b}: {where}" for (a, b), where in sorted(upward.items()))


def test_the_layers_fail_on_a_folder_cycle(tmp_path):
    """Two folders that import each other, one only for an annotation, the other inside a function: whichever
    order the layers list them in, one of the two imports is upward."""
    files = {"core/x.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from core.sub.y import Y\n",
             "core/sub/y.py": "class Y:\n    def f(self):\n        from core.x import X\n",
             "core/__init__.py": "", "core/sub/__init__.py": ""}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    found = folder_imports(modules_of("core", tmp_path / "core"), tmp_path)
    assert set(found) == {("core", "core/sub"), ("core/sub", "core")}, found
    assert set(upward_imports(found, ("core", "core/sub"))) == {("core", "core/sub")}
    assert set(upward_imports(found, ("core/sub", "core"))) == {("core/sub", "core")}


def test_the_architecture_intro_names_the_top_folders_in_their_layer_order():
    """docs/architecture.md's first paragraph (the layout sentence) drifted once, describing a tree without
    minilmd/corpus: every top folder and the core's two packages stand in it, bottom to top as in FOLDER_LAYERS."""
    intro = DOC.read_text(encoding="utf-8").split("\n\n")[1]
    named = ["minilmd", "minilmd/corpus", "minilmd/plan", "daemon", "trainer"]
    assert [f for f in FOLDER_LAYERS if f in named] == named  # the order this test reads the intro in
    at = [intro.find(f"`{folder}/`") for folder in named]
    assert -1 not in at, f"architecture.md's intro does not name {[f for f, i in zip(named, at, strict=True) if i < 0]}"
    assert at == sorted(at), "architecture.md's intro names the top folders out of their layer order"
