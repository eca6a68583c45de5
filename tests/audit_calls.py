"""What the audits of calls (test_one_way_to_signal, test_shared_write_audit, test_listing_audit,
test_one_way_to_start_python) need to see a call under any spelling: the full name a module's local name stands for,
and the program words of a command.

- `qualified_names(module)`: {local name: "os.kill"} for `import os as o` (o -> "os"), `from os import kill as k`
  (k -> "os.kill"), `from os import *` (every public name of os), with the C modules behind a stdlib module named
  as the module itself (`from posix import kill` is os.kill, `from _signal import pthread_kill` signal's).
- `assigned_aliases(module, watched)`: qualified_names and `ls = os.listdir`, `o = open`; `qualified(expr,
  aliases)`: the full name a call's function is reached by, getattr's too (the audits of writes and of listings).
- `dynamic_lookups(module, modules)`: `getattr(os, "kill")`, `getattr(os, name)` (any name not spelled out),
  `os.__dict__["kill"]`, `vars(os)[name]`: a function of a watched module fetched by a string.
- `command_words(node, constants)`: the program names of a command given as an argv (list or tuple) or a shell
  string (f-strings included): every word's basename (`/bin/kill` is kill), a local name assigned a string
  literal read as that string. A program first or after `env`, `sudo`, `;`: every word is returned, the audit
  asks whether any is one it watches.
- `spawned_commands(module)`: (line, words) of each command given to a process-starting call: subprocess's,
  os.system/popen/exec*/spawn*/posix_spawn*, asyncio's create_subprocess_exec/shell.
"""
from __future__ import annotations

import ast
import importlib
import re
import sys
from functools import cache

SYNONYMS = {"posix": "os", "nt": "os", "_signal": "signal", "_posixsubprocess": "subprocess", "_io": "io"}
"""C modules whose functions a stdlib module re-exports under its own name."""

SPAWNERS = {"subprocess.run", "subprocess.Popen", "subprocess.call", "subprocess.check_call",
            "subprocess.check_output", "subprocess.getoutput", "subprocess.getstatusoutput", "os.system", "os.popen",
            "asyncio.create_subprocess_exec", "asyncio.create_subprocess_shell", "os.posix_spawn",
            "os.posix_spawnp", *(f"os.exec{s}" for s in ("l", "le", "lp", "lpe", "v", "ve", "vp", "vpe")),
            *(f"os.spawn{s}" for s in ("l", "le", "lp", "lpe", "v", "ve", "vp", "vpe"))}
SPAWNER_METHODS = {"run", "Popen", "call", "check_call", "check_output", "getoutput", "getstatusoutput", "system",
                   "popen", "create_subprocess_exec", "create_subprocess_shell"}
"""The same calls reached through an object this module cannot name (`self.runner.run(argv)`): read too."""


@cache
def nodes(module: ast.Module) -> tuple[ast.AST, ...]:
    """Every node of the tree, walked once (the audits each read every node of every file several times)."""
    return tuple(ast.walk(module))


def canonical(module: str) -> str:
    head, dot, rest = module.partition(".")
    return SYNONYMS.get(head, head) + dot + rest


@cache
def _public_names(module: str) -> tuple[str, ...]:
    """What `from MODULE import *` binds (its __all__, else its names without a leading underscore), for a module of
    the standard library (the ones the audits watch); nothing is imported for any other (torch's would take
    seconds)."""
    if module.split(".")[0] not in sys.stdlib_module_names:
        return ()
    try:
        imported = importlib.import_module(module)
    except Exception:  # noqa: BLE001 - a module this interpreter lacks: its star import binds nothing known
        return ()
    names = getattr(imported, "__all__", None)
    return tuple(names if names is not None else (n for n in dir(imported) if not n.startswith("_")))


@cache
def qualified_names(module: ast.Module) -> dict[str, str]:
    """{local name: the dotted name it stands for}, from every import statement of the module (functions' too).
    Cached by the tree (source_tree parses each file of the repository once): do not change what it returns."""
    names: dict[str, str] = {}
    for node in nodes(module):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = canonical(alias.name)
                else:
                    head = alias.name.split(".")[0]
                    names[head] = canonical(head)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                if alias.name == "*":
                    names.update({n: f"{canonical(node.module)}.{n}" for n in _public_names(node.module)})
                else:
                    names[alias.asname or alias.name] = f"{canonical(node.module)}.{alias.name}"
    return names


def dotted(expr: ast.expr, names: dict[str, str]) -> str | None:
    """The full dotted name of `expr` (`o.kill` -> "os.kill") when its first part is an imported name, else None."""
    if isinstance(expr, ast.Name):
        return names.get(expr.id)
    if isinstance(expr, ast.Attribute):
        base = dotted(expr.value, names)
        return f"{base}.{expr.attr}" if base else None
    return None


def dynamic_lookups(module: ast.Module, watched: set[str], names: dict[str, str] | None = None
                    ) -> list[tuple[int, str, str | None]]:
    """(line, module, name or None when not spelled out) of each function of a `watched` module fetched by a string:
    getattr(os, "kill"), getattr(os, name), os.__dict__["kill"], vars(os)[name]."""
    names = qualified_names(module) if names is None else names
    return [(node.lineno, *found) for node in nodes(module) if (found := dynamic_lookup(node, watched, names))]


def dynamic_lookup(node: ast.AST, watched: set[str], names: dict[str, str]) -> tuple[str, str | None] | None:
    """(module, name or None) when `node` fetches a function of a `watched` module by a string (dynamic_lookups)."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" \
            and len(node.args) > 1 and (of := dotted(node.args[0], names)) in watched:
        return of, _literal(node.args[1])
    if isinstance(node, ast.Subscript):
        value = node.value
        if isinstance(value, ast.Attribute) and value.attr == "__dict__":
            of = dotted(value.value, names)
        elif isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "vars" \
                and value.args:
            of = dotted(value.args[0], names)
        else:
            return None
        if of in watched:
            return of, _literal(node.slice)
    return None


def assigned_aliases(module: ast.Module, watched: set[str], builtins: set[str] = frozenset()) -> dict[str, str]:
    """qualified_names plus each local name assigned a watched module's function (`ls = os.listdir`: ls ->
    "os.listdir") or one of `builtins` (`o = open`: o -> "open"), in any function of the module."""
    aliases = dict(qualified_names(module))
    for node in nodes(module):
        if isinstance(node, ast.Assign) and isinstance(node.value, (ast.Name, ast.Attribute)):
            value = node.value
            name = value.id if isinstance(value, ast.Name) and value.id in builtins else dotted(value, aliases)
            if name and (name in builtins or name.rpartition(".")[0] in watched):
                aliases.update({t.id: name for t in node.targets if isinstance(t, ast.Name)})
    return aliases


def qualified(expr: ast.expr, aliases: dict[str, str]) -> str | None:
    """The dotted name an imported module's function is reached by ("os.rename"), `getattr(os, "unlink")` read as
    "os.unlink" (a name not spelled out as "os.<getattr>"), or None for anything else (a method of an object, a
    local name); a bare name that is not imported stays itself ("open")."""
    if isinstance(expr, ast.Name):
        return aliases.get(expr.id, expr.id)
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "getattr" \
            and len(expr.args) > 1 and (of := dotted(expr.args[0], aliases)):
        name = expr.args[1]
        return f"{of}.{name.value if isinstance(name, ast.Constant) else '<getattr>'}"
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, (ast.Name, ast.Attribute)):
        if isinstance(expr.value, ast.Name) and expr.value.id not in aliases:
            return None  # a method of a local object: p.mkdir()
        base = qualified(expr.value, aliases)
        return f"{base}.{expr.attr}" if base else None
    return None


def _literal(node: ast.expr) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


@cache
def string_constants(module: ast.Module) -> dict[str, set[str]]:
    """{name: every string literal assigned to it anywhere in the module} (`cmd = "pkill"`)."""
    found: dict[str, set[str]] = {}
    for node in nodes(module):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, str):
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                if isinstance(target, ast.Name):
                    found.setdefault(target.id, set()).add(node.value.value)
    return found


WORD = re.compile(r"[^\s;&|()`'\"<>]+")


def _words(text: str) -> list[str]:
    return [w.rsplit("/", 1)[-1] for w in WORD.findall(text)]


def command_words(node: ast.expr, constants: dict[str, set[str]]) -> list[str]:
    """The basenames of the words of a command: an argv's literal elements (and names assigned a literal), a shell
    string's words, an f-string's literal parts' words."""
    if isinstance(node, (ast.List, ast.Tuple)):
        return [w for elt in node.elts for w in command_words(elt, constants)]
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return _words(node.value)
    if isinstance(node, ast.JoinedStr):
        return _words(" ".join(v.value if isinstance(v, ast.Constant) else " " for v in node.values))
    if isinstance(node, ast.Name):
        return [w for text in sorted(constants.get(node.id, ())) for w in _words(text)]
    if isinstance(node, ast.Starred):
        return command_words(node.value, constants)
    if isinstance(node, ast.BinOp):  # ["kill"] + args, "kill " + pid
        return command_words(node.left, constants) + command_words(node.right, constants)
    return []


def spawner(call: ast.Call, names: dict[str, str]) -> str | None:
    name = dotted(call.func, names)
    if name in SPAWNERS:
        return name
    if name is None and isinstance(call.func, ast.Attribute) and call.func.attr in SPAWNER_METHODS:
        return call.func.attr
    return None


def command_of(call: ast.Call, names: dict[str, str], constants: dict[str, set[str]]) -> list[str]:
    """The command words of a call that starts a process (SPAWNERS), else []: all its positional arguments and
    args=, whatever their order (os.spawnlp(mode, file, *args), os.execv(path, argv))."""
    if not spawner(call, names):
        return []
    given = [*call.args, *(k.value for k in call.keywords if k.arg in ("args", "cmd", "program", "path"))]
    return [w for arg in given for w in command_words(arg, constants)]


@cache
def spawned_commands(module: ast.Module) -> list[tuple[int, list[str]]]:
    """(line, command words) of each command given to a call that starts a process (command_of)."""
    names, constants = qualified_names(module), string_constants(module)
    return [(node.lineno, words) for node in nodes(module)
            if isinstance(node, ast.Call) and (words := command_of(node, names, constants))]
