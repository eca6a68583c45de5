"""The shared-write audit's scanner (tests/test_shared_write_audit.py holds the reviews and the tests): which calls
create, rename, chmod or delete by path, under any spelling (tests/audit_calls.py), in source_tree.audited_files().
"""
from __future__ import annotations

import ast
import functools
import operator
import os
from collections import Counter

import audit_calls
import audit_sites
import source_tree

ROOT = source_tree.REPO
THE_HELPER = "minilmd/dirfd.py"
OS_CALLS = {"rename", "replace", "chmod", "unlink", "remove", "rmdir", "mkdir", "makedirs", "link", "symlink",
            "mkfifo", "mknod", "truncate", "removedirs", "renames", "lchmod", "chown", "lchown", "utime", "setxattr",
            "removexattr"}
SHUTIL_CALLS = {"rmtree", "move", "copyfile", "copy", "copy2", "copytree", "chown", "copymode", "copystat"}
OPENERS = {"codecs", "gzip", "bz2", "lzma", "tarfile"}
"""Modules whose open(path, mode) writes for a writing mode (tarfile's "w:gz", "a", "x" too); zipfile.ZipFile too."""
FILE_COMMANDS = {"rm", "mv", "cp", "ln", "chmod", "chown", "mkdir", "rmdir", "touch", "install", "tee", "truncate",
                 "rsync", "dd", "shred", "unlink"}
"""Programs that create, move, change or delete files by path: run as an argv or a shell string, each is a write."""
DIR_FD_HOMES = {"minilmd/dirfd.py", "minilmd/dirtree.py", "minilmd/place_rule.py"}
"""Where a call relative to a directory descriptor (dir_fd=) is the rule itself: dirfd's Dir, the bounded tree walk
under it, the place rule's walk. Anywhere else such a call is listed as "CALL@dir_fd" and reviewed like any other:
a descriptor walk of its own beside Dir is a second copy of the rule."""
PATH_CALLS = {"write_text", "write_bytes", "mkdir", "unlink", "rmdir", "chmod", "touch", "symlink_to",
              "hardlink_to", "lchmod", "tofile"}
FSSPEC_CALLS = {"pipe_file", "pipe", "rm_file", "mv", "move", "cp_file", "cp", "put_file", "upload", "get_file",
                "download", "mkdirs", "makedir", "delete"}
"""fsspec's filesystem methods that write by path (in a store, or on this machine for get_file/download), counted by
name on any object, as PATH_CALLS (its touch, mkdir, rmdir, write_text, write_bytes are there already)."""
FSSPEC_SHARED_CALLS = {"rm", "makedirs", "put", "get", "copy", "rename"}
"""fsspec's writing methods whose names other objects' methods share (the project's RemoteStore rm/makedirs/put/get,
read where they are defined; dirfd's Dir.rename, at a descriptor; dict.get, ndarray.copy): counted on a filesystem
by its name only (fs.rm, self.fs.rm, local_fs.put), lest every dict.get be a site."""
WRITER_CONSTRUCTORS = {"torch.utils.tensorboard.SummaryWriter": "SummaryWriter",
                       "torch.utils.tensorboard.writer.SummaryWriter": "SummaryWriter",
                       "tensorboardX.SummaryWriter": "SummaryWriter"}
"""Writers whose constructor is given a directory by path and writes there (TensorBoard's event files)."""
TEMPFILE_CALLS = {"mkstemp", "mkdtemp", "NamedTemporaryFile", "TemporaryDirectory", "TemporaryFile",
                  "SpooledTemporaryFile"}
NUMPY_CALLS = {"save", "savez", "savez_compressed", "savetxt"}
SAFETENSORS_CALLS = {"save_file"}
TORCH_CALLS = {"save"}
SHORT = {"numpy": "np", "safetensors.torch": "safetensors", "safetensors.numpy": "safetensors"}
ONE_ARG_CALLS = {"rename", "replace"}  # Path.rename(target); str.replace(a, b) takes two
FD_KEYWORDS = {"dir_fd", "src_dir_fd", "dst_dir_fd"}
WRITE_MODES = set("wxa+")


def _mode(call: ast.Call, position: int) -> str | None:
    mode = call.args[position] if len(call.args) > position else None
    for keyword in call.keywords:
        if keyword.arg == "mode":
            mode = keyword.value
    if isinstance(mode, ast.Constant) and isinstance(mode.value, str):
        return mode.value
    return None if mode is None else "?"  # a mode not spelled out: counted as a write, to be reviewed


WRITE_FLAGS = {"O_CREAT", "O_WRONLY", "O_RDWR", "O_TRUNC", "O_APPEND"}
WRITE_BITS = functools.reduce(operator.or_, (getattr(os, flag) for flag in WRITE_FLAGS))
WRITING_MODULES = {"os", "shutil", "tempfile", "numpy", "builtins", "io", *OPENERS}


class _Names:
    """What a module's names stand for: `import shutil as sh` makes sh "shutil", `from os import rename as r` makes
    r "os.rename"; and its module-level constants (flags = os.O_WRONLY | os.O_CREAT) for os.open's flags."""

    def __init__(self, module: ast.Module) -> None:
        self.aliases = audit_calls.assigned_aliases(module, WRITING_MODULES, {"open"})  # `o = open`: a writer renamed
        self.constants = {target.id: node.value for node in module.body if isinstance(node, ast.Assign)
                          for target in node.targets if isinstance(target, ast.Name)}
        self.strings = _fixed_strings(module)

    def strings_of(self, expr: ast.expr) -> set[str] | None:
        """The strings an argument can be: a literal's, a name's bound to string literals alone (`m = "w"`, in any
        function of the module), a string constant imported from a module of the project, either branch of `a if c
        else b`; set() for a literal of another kind (a buffering size); None when it cannot be read here."""
        if isinstance(expr, ast.Constant):
            return {expr.value} if isinstance(expr.value, str) else set()
        if isinstance(expr, ast.IfExp):
            body, orelse = self.strings_of(expr.body), self.strings_of(expr.orelse)
            return None if body is None or orelse is None else body | orelse
        if isinstance(expr, ast.Name) and expr.id in self.strings:
            return self.strings[expr.id]
        if isinstance(expr, ast.Name) and expr.id in self.aliases and \
                (imported := _imported_constant(self.aliases[expr.id])) is not None:
            value = imported.constants[self.aliases[expr.id].rpartition(".")[2]]
            return {value.value} if isinstance(value, ast.Constant) and isinstance(value.value, str) else None
        return None

    def qualified(self, expr: ast.expr) -> str | None:
        return audit_calls.qualified(expr, self.aliases)

    def creates(self, flags: ast.expr, seen: frozenset = frozenset()) -> bool:
        """Whether os.open's flags write (WRITE_FLAGS: O_CREAT, and O_WRONLY, O_RDWR, O_TRUNC or O_APPEND, which
        write into whatever stands at the path, a planted link's target too), through the module's constants."""
        if isinstance(flags, ast.Starred):
            return True  # flags unpacked from a sequence: not readable here, counted
        for node in ast.walk(flags):
            if isinstance(node, ast.Constant) and isinstance(node.value, int) and node.value & WRITE_BITS:
                return True  # os.open(p, 0o101): O_WRONLY | O_CREAT as a number
            if isinstance(node, (ast.Name, ast.Attribute)) and (
                    node.id if isinstance(node, ast.Name) else node.attr) in WRITE_FLAGS:
                return True
            if isinstance(node, ast.Name) and self.aliases.get(node.id, "").rpartition(".")[2] in WRITE_FLAGS:
                return True  # `w = os.O_WRONLY`, `from os import O_CREAT as C`: a flag under a name of its own
            if isinstance(node, ast.Name) and node.id in self.aliases and node.id not in seen and \
                    (imported := _imported_constant(self.aliases[node.id])) is not None:
                # by its name there: `from minilmd.untrusted import OPEN_FLAGS as OPEN_OLD` is untrusted's OPEN_FLAGS
                if imported.creates(imported.constants[self.aliases[node.id].rpartition(".")[2]], seen | {node.id}):
                    return True  # flags a module of the project defines (jsonlines.LOG_APPEND): followed there
            if isinstance(node, ast.Name) and node.id not in self.aliases and node.id not in seen:
                if node.id not in self.constants or self.creates(self.constants[node.id], seen | {node.id}):
                    return True  # flags in a local variable: counted as a create, to be reviewed
        return False


def _fixed_strings(module: ast.Module) -> dict[str, set[str]]:
    """{name: the string literals assigned to it} for each name the module binds to string literals alone: one also
    bound otherwise (a parameter, a loop's or a with's variable, `m += "b"`, any other value) is left out."""
    literal = {id(target) for node in audit_calls.nodes(module) if isinstance(node, (ast.Assign, ast.AnnAssign))
               and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
               for target in (node.targets if isinstance(node, ast.Assign) else [node.target])}
    other = {node.id for node in audit_calls.nodes(module)
             if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and id(node) not in literal}
    other |= {node.arg for node in audit_calls.nodes(module) if isinstance(node, ast.arg)}
    return {name: values for name, values in audit_calls.string_constants(module).items() if name not in other}


PACKAGE_DIRS = {"minilmd.daemon": "daemon", "minilmd.trainer": "trainer", "minilmd": "minilmd"}
"""pyproject.toml's package-dir: where a module of the project lies."""


def _imported_constant(qualified: str) -> _Names | None:
    """The names of the project module a constant is imported from (`minilmd.jsonlines.LOG_APPEND`),
    when that module defines it; None for anything else (os.O_CREAT, a function, another package's name)."""
    module, _, name = qualified.rpartition(".")
    for package, folder in PACKAGE_DIRS.items():
        if module == package or module.startswith(package + "."):
            path = ROOT / folder / (module[len(package) + 1:].replace(".", "/") or "__init__")
            path = path.with_suffix(".py")
            if path.is_file():
                names = _Names(source_tree.tree(path))
                return names if name in names.constants else None
            return None
    return None


def _open_flags(call: ast.Call) -> ast.expr | None:
    flags = call.args[1] if len(call.args) > 1 else next(
        (a for a in call.args if isinstance(a, ast.Starred)), None)
    return next((k.value for k in call.keywords if k.arg == "flags"), flags)


def _module_kind(name: str, call: ast.Call, names: _Names) -> str | None:
    """The kind of a call of an imported module's function, by its full name, else None."""
    module, _, function = name.rpartition(".")
    if module == "os" and function == "open":
        flags = _open_flags(call)
        return "os.open" if flags is not None and names.creates(flags) else None
    if module in ("builtins", "io", *OPENERS) and function == "open":
        return _kind_of_open(call, f"{module}.open" if module in OPENERS else "open")
    if name == "zipfile.ZipFile":
        return _kind_of_open(call, name, default="r")
    if name == "numpy.memmap":
        return _kind_of_open(call, "np.memmap", default="r+", writing=WRITE_MODES | {"readwrite", "write"})
    if name in WRITER_CONSTRUCTORS:
        return WRITER_CONSTRUCTORS[name]
    if function == "<getattr>" and module in WRITING_MODULES:
        return f"{module}.<getattr>"
    table = {"os": OS_CALLS, "shutil": SHUTIL_CALLS, "tempfile": TEMPFILE_CALLS, "numpy": NUMPY_CALLS,
             "safetensors.torch": SAFETENSORS_CALLS, "safetensors.numpy": SAFETENSORS_CALLS, "torch": TORCH_CALLS}
    if function in table.get(module, ()):
        return f"{SHORT.get(module, module)}.{function}"
    return None


def _kind_of_open(call: ast.Call, kind: str = "open", default: str | None = None,
                  writing: set[str] = WRITE_MODES) -> str | None:
    mode = _mode(call, 1) or default
    if mode is None:
        return None
    return kind if mode == "?" or mode in writing or WRITE_MODES & set(mode.split(":")[0]) else None


def _kind(call: ast.Call, names: _Names) -> str | None:
    """What a call is when it writes by path ("os.rename", ".mkdir", "open", ...), else None."""
    fn = call.func
    name = names.qualified(fn)
    if name == "open":
        return _kind_of_open(call)
    if name and "." in name:
        return _module_kind(name, call, names)
    if not isinstance(fn, ast.Attribute) or name:
        return None
    if fn.attr in PATH_CALLS or fn.attr in FSSPEC_CALLS or (fn.attr in FSSPEC_SHARED_CALLS and _a_filesystem(fn.value)):
        return f".{fn.attr}"
    if fn.attr in ONE_ARG_CALLS and ((len(call.args) == 1 and not call.keywords)
                                     or (not call.args and [k.arg for k in call.keywords] == ["target"])):
        return f".{fn.attr}"
    if fn.attr == "open":
        return "open" if _method_open_may_write(call, names) else None
    return None


def _a_filesystem(expr: ast.expr) -> bool:
    """Whether a call's object is named as an fsspec filesystem: fs, local_fs, self.fs, opened.fs."""
    name = expr.id if isinstance(expr, ast.Name) else expr.attr if isinstance(expr, ast.Attribute) else ""
    return name == "fs" or name.endswith("_fs")


def _method_open_may_write(call: ast.Call, names: _Names) -> bool:
    """Path.open(mode), fs.open(path, mode): whether a mode among the first two arguments or mode= writes, read
    through names (_Names.strings_of: `m = "w"; Path(p).open(m)` writes); or, when no mode can be read there,
    whether the argument in the mode's place (mode=, else the second, else the only one) cannot be read either: a
    mode from a parameter or a call is counted, to be reviewed, while a path read as a string (fs.open(path,
    TRAINER_STATE)) is not a mode."""
    keyword = next((k.value for k in call.keywords if k.arg == "mode"), None)
    given = [*call.args[:2], *([keyword] if keyword is not None else [])]
    modes = {m for arg in given for m in names.strings_of(arg) or () if m and set(m) <= set("rwxab+t")}
    if modes:
        return any(WRITE_MODES & set(m) for m in modes)
    in_place = keyword if keyword is not None else call.args[1] if len(call.args) > 1 else \
        call.args[0] if call.args else None
    return in_place is not None and names.strings_of(in_place) is None


def _by_descriptor(call: ast.Call) -> bool:
    """Given a directory descriptor (dir_fd=fd, not dir_fd=None): relative to it, not by path."""
    return any(k.arg in FD_KEYWORDS and not (isinstance(k.value, ast.Constant) and k.value.value is None)
               for k in call.keywords)


class _Sites(audit_sites.Scoped):
    def __init__(self, module: ast.Module, descriptors_are_the_rule: bool = False) -> None:
        super().__init__()
        self.names = _Names(module)
        self.descriptors_are_the_rule = descriptors_are_the_rule
        self.constants = audit_calls.string_constants(module)
        self.visit(module)

    def visit_Call(self, node: ast.Call) -> None:
        kind = None if self.own_method(node.func) else _kind(node, self.names)
        if kind and _by_descriptor(node):
            kind = None if self.descriptors_are_the_rule else f"{kind}@dir_fd"
        if FILE_COMMANDS & set(audit_calls.command_of(node, self.names.aliases, self.constants)):
            kind = "a file command"  # rm, mv, cp... run as a program
        if kind:
            self.count(kind)
        self.generic_visit(node)


@functools.cache
def sites() -> dict[str, Counter]:
    """{module: Counter((function, call))} of every by-path write in the project, the helper aside."""
    return audit_sites.sites(lambda name, module: _Sites(module, name in DIR_FD_HOMES).found, skip=THE_HELPER)
