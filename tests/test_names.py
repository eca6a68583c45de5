"""minilmd/names.py: every on-disk name in one place, step directories as pure functions, and no module spelling
a name itself."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import source_tree
from minilmd import names, tmpnames

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("step", [0, 7, 1234, 99_999_999, 123_456_789])
def test_step_name_and_step_of_are_inverse(step):
    name = names.step_name(step)
    assert names.step_of(name) == step and names.is_step_name(name) and names.step_or_none(name) == step
    assert names.step_of(Path("/some/root") / name) == step
    assert len(name) >= len("step-00000000")


def test_step_names_sort_in_step_order():
    steps = [3, 10, 200, 99_999_999]
    assert sorted(names.step_name(s) for s in reversed(steps)) == [names.step_name(s) for s in steps]


@pytest.mark.parametrize("name", ["step-123", "step-0000001x", "LATEST", ".tmp-step-00000001-42", "quarantine",
                                  "step-00000001.old", "", "step-00000001\n", "step-\u0660\u0660\u0660\u0660"
                                  "\u0660\u0660\u0660\u0661"])
def test_other_names_are_not_steps(name):
    assert not names.is_step_name(name) and names.step_or_none(name) is None
    with pytest.raises(ValueError, match="not a checkpoint directory name"):
        names.step_of(name)


def test_every_temporary_checkpoint_name_is_hidden_and_carries_its_owner():
    made = [tmpnames.save_tmp_name(12, 4242), tmpnames.fetch_tmp_name("step-00000012", 4242),
            tmpnames.sync_tmp_name("step-00000012", "host_a", 4242), tmpnames.deleting_name("step-00000012", 4242),
            tmpnames.replaced_name("step-00000012", 4242)]
    for name in made:
        assert name.startswith(names.TMP_PREFIX) and not names.is_step_name(name)
        assert tmpnames.root_tmp_maker(name) == (4242, None, ""), name  # pid-only names: the older form
    assert tmpnames.root_tmp_maker("step-00000012") is None and tmpnames.root_tmp_maker("LATEST") is None


def test_prepare_temporaries_carry_their_maker():
    """A prepare's temporary names say host, pid, start time and boot tag; an older minilmd's without the boot, and
    its `.out.tmp-PID` (pid only), are still read; an export's `.out.tmp-HOST-PID-TICKS-bootTAG` to the same path is
    no prepare's."""
    made = tmpnames.prepare_tmp_name("out", "h-1", 77, 900, "0123abcd")
    assert made == ".out.prepare-h-1-77-900-boot0123abcd"
    assert tmpnames.prepare_tmp_maker("out", made) == ("h-1", 77, 900, "0123abcd")
    assert tmpnames.prepare_tmp_maker("out", tmpnames.prepare_tmp_name("out", "h-1", 77, 900)) == ("h-1", 77, 900, "")
    aside = tmpnames.aside_name(tmpnames.prepare_tmp_name("out", "h", 78, 901, "89abcdef") + ".0123abcd")  # --force's
    assert tmpnames.prepare_tmp_maker("out", aside) == ("h", 78, 901, "89abcdef")
    assert tmpnames.prepare_tmp_maker("out", ".out.tmp-79") == (None, 79, None, "")
    assert tmpnames.prepare_tmp_maker("out", ".out.tmp-old-80") == (None, 80, None, "")
    assert tmpnames.prepare_tmp_maker("out", tmpnames.prepare_tmp_name("other", "h", 77, 900)) is None
    assert tmpnames.prepare_tmp_maker("out", tmpnames.export_tmp_name("out", "h", 77, 900)) is None
    assert tmpnames.prepare_tmp_maker("out", tmpnames.export_tmp_name("out", "h", 77, 900, "0123abcd")) is None
    assert tmpnames.prepare_tmp_maker("out", ".out.tmp-notapid") is None


@pytest.mark.parametrize("boot", ["", "0123abcd", "12345678"])  # a tag of digits alone too: never read as ticks
def test_export_temporaries_carry_their_maker_and_boot(boot):
    """An export's name reads back as made, the host's own `-` and digits kept apart from pid, ticks and boot."""
    made = tmpnames.export_tmp_name("out", "node-7-b", 77, 900, boot)
    assert tmpnames.export_tmp_maker("out", made) == ("node-7-b", 77, 900, boot)
    assert tmpnames.export_tmp_maker("out", tmpnames.aside_name(made + ".0123abcd")) == ("node-7-b", 77, 900, boot)
    assert tmpnames.prepare_tmp_maker("out", made) is None


@pytest.mark.parametrize("boot", ["", "0123abcd", "12345678"])
def test_a_syncs_remote_names_carry_their_maker_and_boot(boot):
    """sync_tmp_name and pointer_tmp_tag (its random end too) read back as made; an older minilmd's forms still."""
    copy = tmpnames.sync_tmp_name("step-00000012", "h", 77, 900, boot)
    assert tmpnames.remote_tmp_maker(copy, "h") == (77, 900, boot)
    assert tmpnames.remote_tmp_maker(tmpnames.fresh_tmp_name(copy, "0a1b2c3d"), "h") == (77, 900, boot)
    pointer = tmpnames.atomic_tmp_prefix(names.LATEST) + tmpnames.pointer_tmp_tag("h", 77, 900, boot) + "x1y2z3.tmp"
    assert tmpnames.remote_tmp_maker(pointer, "h") == (77, 900, boot)
    assert tmpnames.remote_tmp_maker(tmpnames.sync_tmp_name("step-00000012", "h", 77), "h") == (77, None, "")
    assert tmpnames.remote_tmp_maker(copy, "other") is None


@pytest.mark.parametrize("name", [".out.tmp-h-77-900-boot0123abc", ".out.tmp-h-77-900-boot0123ABCD",
                                  ".out.tmp-h-77-900-0123abcd", ".out.tmp-h-77-900-boot0123abcd\n",
                                  ".out.tmp-h-77-900-boot0123abcdef"])
def test_a_name_whose_boot_does_not_parse_is_not_an_exports(name):
    assert tmpnames.export_tmp_maker("out", name) is None


def test_a_boot_tag_is_written_only_in_its_one_form():
    from minilmd.proc_info import BOOT_TAG_LEN, boot_tag

    assert len(boot_tag()) == BOOT_TAG_LEN and tmpnames.export_tmp_maker(
        "out", tmpnames.export_tmp_name("out", "h", 1, 2, boot_tag()))[3] == boot_tag()
    with pytest.raises(ValueError, match="boot tag"):
        tmpnames.sync_tmp_name("step-00000012", "h", 77, 900, "b366bf46-a766-47ad-82fa-66c0f6933a5a")


def test_attempt_logs():
    assert names.attempt_log_name(3) == "attempt-0003.log" and names.is_attempt_log("attempt-0003.log")
    assert not names.is_attempt_log("attempt-3.txt") and not names.is_attempt_log("attempt-0003.log\n")
    assert tmpnames.root_tmp_maker(".tmp-step-00000012-4242\n") is None  # a planted name with a newline is another one
    assert tmpnames.remote_tmp_owner(".tmp-step-00000012-h-\u0664\u0662", "h") is None


def _owned_names() -> list[str]:
    """Every string constant of names.py (each on-disk name, environment variable and fixed path it owns), and the
    literal start of each of its name patterns ("step-", "attempt-": names.py builds those names by function)."""
    module = source_tree.tree(REPO / "minilmd" / "names.py")
    found = {node.value.value for node in module.body if isinstance(node, (ast.Assign, ast.AnnAssign))
             and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)}
    for value in vars(names).values():
        if isinstance(value, re.Pattern):
            start = re.match(r"[A-Za-z0-9_.\-]*", value.pattern.replace("\\.", ".")).group()
            if len(start) > 3:
                found.add(start)
    return sorted(found)


OWNED = _owned_names()
"""The names names.py owns. A module re-derives one when a string literal of its code IS the name or a path built
from it (no spaces: "meta.json", "train/tokens.bin", f"step-{step:08d}"); sentences for humans may mention them,
and docstrings and comments are not code (the checker reads the syntax tree). A plain word (logs, corpus,
checkpoints, heartbeat) counts where it is used as a path: a part of a literal with a "/", or joined with `/`,
os.path.join, joinpath or Path(); elsewhere it is a word (a config section, a command's name)."""
NOT_YET: dict[str, str] = {}
"""Modules that still spell an owned name, each with why: {module: reason}. An entry for a module that spells none
fails (the exemption is no longer needed: remove it)."""
BOUNDARY = "A-Za-z0-9_.-"


def _pattern(name: str) -> re.Pattern:
    """`name` as a whole name within a literal: not a part of a longer one (".remote-made.json" is another file than
    "remote-made.json"); a prefix ("step-", ".tmp-", "MINILMD_") may run on."""
    tail = "" if name.endswith(("-", "_")) else f"(?![{BOUNDARY}])"
    return re.compile(f"(?<![{BOUNDARY}])" + re.escape(name) + tail)


def _one_pattern(owned: list[str]) -> re.Pattern:
    return re.compile("|".join(_pattern(name).pattern for name in sorted(owned, key=len, reverse=True)))


NAMES = _one_pattern([name for name in OWNED if not re.fullmatch(r"[A-Za-z]+", name)])
WORDS = _one_pattern([name for name in OWNED if re.fullmatch(r"[A-Za-z]+", name)])


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def _literal_body(node: ast.AST, source: str) -> str:
    """A string literal as written between its quotes (f-string fields included, prefixes and quotes not)."""
    text = ast.get_source_segment(source, node) or ""
    return re.sub(r"^[rbfuRBFU]*(\"\"\"|'''|\"|')|(\"\"\"|'''|\"|')$", "", text)


def _path_parts(tree: ast.AST) -> set[int]:
    """The literals used as a part of a path: an operand of `/`, an argument of os.path.join, joinpath or Path()."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            ids |= {id(node.left), id(node.right)}
        elif isinstance(node, ast.Call) and (node.func.attr if isinstance(node.func, ast.Attribute) else getattr(
                node.func, "id", None)) in ("join", "joinpath", "Path", "PurePath"):
            ids |= {id(arg) for arg in node.args}
    return ids


def _concatenated(node: ast.AST) -> str | None:
    """The text of string literals joined with `+` ("meta" + ".json"), None for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _concatenated(node.left), _concatenated(node.right)
        return left + right if left is not None and right is not None else None
    return None


def _spells(text: str, in_a_path: bool) -> bool:
    return NAMES.search(text) is not None or ((in_a_path or "/" in text) and WORDS.search(text) is not None)


def _names_spelled(source: str, tree: ast.Module | None = None) -> list[str]:
    """String literals of the code (docstrings excepted) that are an owned name or a path built from one, and
    `[5:]` slices (a step cut out of its name by hand). `tree`: the source parsed already."""
    tree = ast.parse(source) if tree is None else tree
    skip = _docstrings(tree) | {id(d) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for d in ast.walk(n)
                                if d is not n}  # the parts of an f-string are checked as the whole f-string
    paths = _path_parts(tree)
    found = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        elif isinstance(node, ast.JoinedStr):
            text = "".join(v.value for v in node.values if isinstance(v, ast.Constant))
        elif isinstance(node, ast.BinOp) and (text := _concatenated(node)) is not None:  # "meta" + ".json"
            skip |= {id(part) for part in ast.walk(node) if part is not node}
            if _spells(text, id(node) in paths) and not re.search(r"\s", text):
                found.append(text)
            continue
        elif isinstance(node, ast.Slice) and isinstance(node.lower, ast.Constant) and node.lower.value == 5 \
                and node.upper is None and node.step is None:
            found.append("[5:]")
            continue
        else:
            continue
        if _spells(text, id(node) in paths):
            body = _literal_body(node, source) if isinstance(node, ast.JoinedStr) else text
            if not re.search(r"\s", body):
                found.append(body)
    return found


def spelled_names(exempt: dict[str, str] = NOT_YET, files: tuple[Path, ...] | None = None) -> list[str]:
    """Each owned name spelled outside names.py, tmpnames.py (its temporary names' grammar) and `exempt`, and each
    exemption whose module spells none."""
    offenders = []
    for path in source_tree.code_files() if files is None else files:
        rel = path.relative_to(REPO).as_posix()
        if rel in ("minilmd/names.py", "minilmd/tmpnames.py"):
            continue
        spelled = _names_spelled(source_tree.source(path), source_tree.tree(path))
        if rel in exempt:
            offenders += [] if spelled else [f"{rel}: exempt in NOT_YET, but spells no owned name: remove it"]
        else:
            offenders += [f"{rel}: {lit!r}" for lit in spelled]
    return offenders


def test_the_step_a_longer_name_begins_with():
    step = names.step_name(300)
    assert names.leading_step(names.quarantine_name(step, "20261206T154615", 2)) == 300
    assert names.leading_step(tmpnames.sync_tmp_name(step, "host-a", 77, 900).removeprefix(names.TMP_PREFIX)) == 300
    for other in (step, step + "x", "step-0000030-1", "LATEST", "", "init-host-77"):
        assert names.leading_step(other) is None, other


def test_no_module_spells_an_owned_name_or_slices_a_step_name():
    offenders = spelled_names()
    assert not offenders, "spell these through minilmd.names or minilmd.tmpnames:\n" + "\n".join(offenders)


def test_owned_is_every_name_of_names_py():
    """OWNED is read from names.py, not copied: the names the construction audit found missing are there."""
    assert {"heartbeat", "trainer.json", "stop-request.json", "owner.json", "tokenizer_config.json", "loss_mask.bin",
            "meta.json", "step-", "attempt-", ".tmp-"} <= set(OWNED)


def test_an_exemption_no_longer_needed_fails():
    files = (REPO / "minilmd" / "config.py", REPO / "minilmd" / "perms.py")
    assert spelled_names({"minilmd/config.py": "a reason"}, files) == [
        "minilmd/config.py: exempt in NOT_YET, but spells no owned name: remove it"]


def test_the_checker_sees_a_spelled_name():
    assert _names_spelled('path = root / "meta.json"') == ["meta.json"]
    assert _names_spelled('name = f"step-{step:08d}"') == ["step-{step:08d}"]
    assert _names_spelled("step = int(name[5:])") == ["[5:]"]
    assert _names_spelled('raise ValueError(f"no meta.json in {root}")') == []
    assert _names_spelled('cfg = Path(d) / "tokenizer_config.json"') == ["tokenizer_config.json"]
    assert _names_spelled('beat = run_dir / "heartbeat"') == ["heartbeat"]
    assert _names_spelled('meta = root / ("meta" + ".json")') == ["meta.json"]
    assert _names_spelled('p = os.path.join(root, "checkpoints")') == ["checkpoints"]
    assert _names_spelled('p = "checkpoints/LATEST"') == ["checkpoints/LATEST"]
    assert _names_spelled('section = cfg["init"]; cmd = "demo-corpus"; old = ".remote-made.json"') == []
    assert _names_spelled('def f():\n    """Reads meta.json."""\n    X = """\nsee meta.json\n"""\n') == []
