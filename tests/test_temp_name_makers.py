"""Every temporary and set-aside name is made by tmpnames.py or names.py, and each maker's names, as the code that
makes them spells them out on disk (Dir.make_temp's and create_new's random ends, an aside's `.old`), are recognised
by the matcher its clean-up asks: prepare_tmp_maker, export_tmp_maker, remote_tmp_owner, root_tmp_maker.

Before, prepare's aside was built by hand (`tmp_name + ".old"`: `.OUT.prepare-H-P-T.XXXXXXXX.old`) while
names.prepare_aside_name made `.OUT.prepare-H-P-T.old` and its length check `.OUT.prepare-H-P-T.old.XXXXXXXX`, a name
nobody made and prepare_tmp_maker did not know (house9 item 6)."""
from __future__ import annotations

import ast
import os
import re

import pytest

import source_tree
from minilmd import names, tmpnames
from minilmd.dirfd import Dir

HOST, PID, TICKS, BOOT = "node-1", 4242, 90210, "0123abcd"


@pytest.fixture
def here(tmp_path):
    with Dir(os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY), tmp_path) as d:
        yield d


def _made_dir(here: Dir, prefix: str) -> str:
    made, name = here.make_temp(prefix)
    made.close()
    return name


def _made_file(here: Dir, prefix: str) -> str:
    fd, name = here.create_new(prefix, ".tmp")
    os.close(fd)
    return name


def test_a_prepares_temporary_and_its_aside_name_their_maker(here):
    prefix = tmpnames.prepare_tmp_name("out", HOST, PID, TICKS, BOOT)
    tmp = _made_dir(here, prefix)
    for name in (prefix, tmp, tmpnames.aside_name(tmp)):
        assert tmpnames.prepare_tmp_maker("out", name) == (HOST, PID, TICKS, BOOT), name
        assert tmpnames.export_tmp_maker("out", name) is None, name  # an export to the same --out never takes it
    assert tmpnames.prepare_tmp_maker("out", names.prepare_kept_prefix("out") + ".0123abcd") is None  # the user's


def test_an_exports_temporary_and_its_aside_name_their_maker(here):
    prefix = tmpnames.export_tmp_name("out", HOST, PID, TICKS, BOOT)
    tmp = _made_dir(here, prefix)
    for name in (prefix, tmp, tmpnames.aside_name(tmp)):
        assert tmpnames.export_tmp_maker("out", name) == (HOST, PID, TICKS, BOOT), name
        assert tmpnames.prepare_tmp_maker("out", name) is None, name


@pytest.mark.parametrize(("ticks", "boot"), [(TICKS, BOOT), (TICKS, ""), (None, "")])  # older minilmd's names: no
# boot recorded, nor a start time
def test_a_syncs_temporary_names_on_a_remote_name_this_hosts_pid_start_time_and_boot(here, ticks, boot):
    tag = tmpnames.pointer_tmp_tag(HOST, PID, ticks, boot)
    copies = [tmpnames.sync_tmp_name(names.step_name(12), HOST, PID, ticks, boot),
              tmpnames.sync_tmp_name("init", HOST, PID, ticks, boot)]
    made = [*copies, *(tmpnames.fresh_tmp_name(c, token) for c in copies for token in ("0123abcd", "01234567")),
            *(_made_file(here, tmpnames.atomic_tmp_prefix(f) + tag) for f in (names.LATEST, names.BEST,
                                                                            names.REMOTE_OWNER)),
            _made_file(here, tmpnames.atomic_tmp_prefix(names.LATEST) + tag + "owner")]  # remote_write's claim probe
    with here.replacing(names.LATEST, 0o644, tag):  # Dir.write_atomic's own temporary, while it is written
        made += [n for n in os.listdir(here.path) if n.startswith(tmpnames.atomic_tmp_prefix(names.LATEST))
                 and n not in made]
    assert len(made) == 11
    for name in made:
        assert tmpnames.remote_tmp_maker(name, HOST) == (PID, ticks, boot), name
        assert tmpnames.remote_tmp_owner(name, HOST) == PID, name
        assert tmpnames.remote_tmp_owner(name, "other_host") is None, name


@pytest.mark.parametrize("ticks, boot", [(TICKS, BOOT), (None, ""), (TICKS, ""), (None, BOOT)])
def test_a_checkpoint_roots_temporaries_name_their_maker(ticks, boot):
    """pid, start ticks and boot; the pid alone (the older form) where either is missing."""
    step = names.step_name(12)
    whole = ticks is not None and boot
    for make in (tmpnames.save_tmp_name, tmpnames.fetch_tmp_name, tmpnames.deleting_name, tmpnames.replaced_name):
        name = make(12 if make is tmpnames.save_tmp_name else step, PID, ticks, boot)
        assert tmpnames.root_tmp_maker(name) == ((PID, ticks, boot) if whole else (PID, None, "")), name
        assert tmpnames.root_tmp_maker(name + "\n") is None and tmpnames.root_tmp_maker(name + "x") is None, name


NAME_MAKERS = ("minilmd/tmpnames.py", "minilmd/names.py")
"""The homes of names: what is in progress, and what is set aside or kept (kept_name, quarantine_name)."""
HAND_BUILT_REVIEWED = {
    "daemon/jobs/remote_made.py": "scratch_record: `.<root>.remote-made.json`, a record kept, never a temporary name",
}
"""Files that build a dotted name by hand, and why it is no temporary or set-aside name."""
TEMPORARY_ENDS = (".old", ".tmp", ".part")


def _hand_built(tree: ast.Module) -> list[int]:
    """Lines of an f-string that starts a hidden name (`f".{name}..."`), or of a string built with `+` or an f-string
    that ends like a temporary (.old, .tmp, .part): NAME_MAKERS' to make."""
    specs = {id(n.format_spec) for n in ast.walk(tree) if isinstance(n, ast.FormattedValue) and n.format_spec}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr) and id(node) not in specs:
            parts = node.values
            first = parts[0].value if isinstance(parts[0], ast.Constant) else ""
            hidden = len(parts) > 1 and re.fullmatch(r"\.[\w.-]*", first) and isinstance(parts[1], ast.FormattedValue)
            ends = isinstance(parts[-1], ast.Constant) and parts[-1].value.endswith(TEMPORARY_ENDS)
            if hidden or ends:
                found.append(node.lineno)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and any(
                isinstance(side, ast.Constant) and isinstance(side.value, str) and side.value.endswith(TEMPORARY_ENDS)
                for side in (node.left, node.right)):
            found.append(node.lineno)
    return found


def test_no_temporary_name_is_built_by_hand_outside_the_name_makers():
    found = [f"{source_tree.relative(path)}:{line}" for path in source_tree.audited_files()
             if source_tree.relative(path) not in (*NAME_MAKERS, *HAND_BUILT_REVIEWED)
             for line in _hand_built(source_tree.tree(path))]
    assert not found, "temporary and set-aside names are made by tmpnames.py or names.py:\n" + "\n".join(found)


def test_the_scan_sees_a_name_built_by_hand():
    tree = ast.parse('a = tmp + ".old"\nb = f".{name}.{tag}"\nc = f"{x:.1f} s"\nd = f"{t}-{k}.tmp"\ne = f". ({d})"\n')
    assert _hand_built(tree) == [1, 2, 4]
