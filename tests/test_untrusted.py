"""minilmd/untrusted.py: the one reader for files another user, run or machine may have written.

Whatever the file is (random bytes, 60 KB of `[`, a sparse gigabyte, a FIFO nobody writes, a directory, a device,
a socket, a symlink to /dev/zero, someone else's), the reader returns a valid value of the expected type or raises
Unreadable with a short why, never anything else, never blocks and never reads more than it allows.
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minilmd import untrusted
from minilmd.untrusted import Unreadable

KIB = 1024

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
    max_leaves=40)


def nesting(value) -> int:
    if isinstance(value, list):
        return 1 + max((nesting(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((nesting(v) for v in value.values()), default=0)
    return 0


def outcome(call):
    """("ok", value) or ("unreadable", why); any other exception fails the test."""
    try:
        return "ok", call()
    except Unreadable as e:
        assert e.why and len(e.why) < 80, e.why
        return "unreadable", e.why


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2 * KIB))
def test_random_bytes_are_a_value_or_unreadable(data):
    kind, value = outcome(lambda: untrusted.loads(data, expect=None))
    if kind == "ok":
        assert json.dumps(value) == json.dumps(json.loads(data.decode("utf-8")))  # NaN: equal as text only


@settings(max_examples=150, deadline=None)
@given(json_values, st.integers(min_value=0, max_value=8))
def test_a_json_value_is_read_exactly_when_it_nests_no_deeper_than_allowed(value, max_depth):
    kind, got = outcome(lambda: untrusted.loads(json.dumps(value), max_depth=max_depth, expect=None))
    if nesting(value) <= max_depth:
        assert (kind, got) == ("ok", value)
    else:
        assert (kind, got) == ("unreadable", f"nested deeper than {max_depth}")


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet='[]{}":,\\ a1', max_size=300))
def test_bracket_and_quote_soup_never_escapes(text):
    outcome(lambda: untrusted.loads(text, max_depth=4, expect=None))


@settings(max_examples=50, deadline=None)
@given(st.integers(min_value=65, max_value=200_000), st.sampled_from(["[", '{"a":', '[{"k":', '"[', "[\"\\\"\","]))
def test_deep_nesting_is_refused_before_json_sees_it(levels, opener):
    text = opener * levels
    kind, why = outcome(lambda: untrusted.loads(text))
    assert kind == "unreadable"
    assert why in ("nested deeper than 64", "not JSON"), why
    if opener in ("[", '{"a":'):
        assert why == "nested deeper than 64"


def test_brackets_inside_strings_do_not_count():
    value = {"text": "[" * 10_000 + "{" * 10_000, "escaped": "\\\"[[[[" * 100}
    assert untrusted.loads(json.dumps(value)) == value


@pytest.mark.parametrize(("text", "expect", "why"), [
    ("[1, 2]", dict, "a list, not an object"),
    ('{"a": 1}', list, "an object, not a list"),
    ("true", (int, float), "true or false, not a number"),
    ('"x"', dict, "a string, not an object"),
    ("null", dict, "null, not an object"),
])
def test_the_parsed_type_is_checked(text, expect, why):
    assert outcome(lambda: untrusted.loads(text, expect=expect)) == ("unreadable", why)


def test_a_huge_integer_is_not_json_rather_than_a_traceback():
    assert outcome(lambda: untrusted.loads("9" * 10_000, expect=None)) == ("unreadable", "not JSON")


# --- files -----------------------------------------------------------------------------------------------------

@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=4 * KIB))
def test_any_file_content_is_an_object_or_unreadable(tmp_path, data):
    path = tmp_path / "state.json"
    path.write_bytes(data)
    kind, value = outcome(lambda: untrusted.read_json(path, max_bytes=2 * KIB))
    if kind == "ok":
        assert isinstance(value, dict) and len(data) <= 2 * KIB
    elif len(data) > 2 * KIB:
        assert value == "over 2 KiB"


def test_sixty_kilobytes_of_brackets_in_a_file(tmp_path):
    path = tmp_path / "entry.json"
    path.write_text("[" * 60_000)
    assert outcome(lambda: untrusted.read_json(path, max_bytes=64 * KIB)) == ("unreadable", "nested deeper than 64")


def test_a_sparse_gigabyte_is_refused_by_its_size_without_being_read(tmp_path):
    path = tmp_path / "huge.json"
    with open(path, "wb") as f:
        f.truncate(1 << 30)
    assert outcome(lambda: untrusted.read_json(path, max_bytes=1 << 20)) == ("unreadable", "over 1 MiB")


def test_a_file_longer_than_its_size_says_is_read_no_further_than_the_cap():
    # /proc files say 0 bytes and hold more: the cap holds on what is read, not on what fstat said
    assert outcome(lambda: untrusted.read_bytes("/proc/self/status", max_bytes=10)) == ("unreadable",
                                                                                         "over 10 bytes")


def test_a_fifo_nobody_writes_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "state.json"
    os.mkfifo(fifo)
    result = []
    reader = threading.Thread(target=lambda: result.append(outcome(lambda: untrusted.read_json(fifo,
                                                                                               max_bytes=KIB))))
    reader.start()
    reader.join(timeout=30)
    if reader.is_alive():  # unblock it so that the test ends, then fail
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("reading a FIFO blocked")
    assert result == [("unreadable", "a FIFO")]


def test_every_other_kind_of_file_is_refused(tmp_path):
    (tmp_path / "dir").mkdir()
    (tmp_path / "zero").symlink_to("/dev/zero")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(tmp_path / "sock"))
        cases = {"dir": "a directory", "zero": "a symbolic link", "dangling": "a symbolic link",
                 "sock": "a socket"}
        for name, why in cases.items():
            assert outcome(lambda n=name: untrusted.read_json(tmp_path / n, max_bytes=KIB)) == ("unreadable", why)
    finally:
        sock.close()
    assert outcome(lambda: untrusted.read_json("/dev/zero", max_bytes=KIB)) == ("unreadable", "a character device")
    with pytest.raises(Unreadable) as missing:
        untrusted.read_json(tmp_path / "absent.json", max_bytes=KIB)
    assert missing.value.missing and missing.value.why == "missing"


def test_the_owner_is_checked_before_the_content_is_parsed(tmp_path):
    from second_user import second_user

    uid, gid = second_user()
    path = tmp_path / "entry.json"
    path.write_text("[" * 60_000)  # what parsing it would say is never reached
    os.chown(path, uid, gid)
    assert outcome(lambda: untrusted.read_json(path, max_bytes=64 * KIB, owner=os.geteuid())) == \
        ("unreadable", f"owned by uid {uid}")
    path.write_text('{"ok": 1}')
    assert untrusted.read_json(path, max_bytes=KIB, owner=(os.geteuid(), uid)) == {"ok": 1}


def test_the_message_names_the_file_with_its_control_characters_escaped(tmp_path):
    path = tmp_path / "evil\x1b[2Jname.json"
    path.write_text("[]")
    with pytest.raises(Unreadable) as e:
        untrusted.read_json(path, max_bytes=KIB)
    assert "\x1b" not in str(e.value) and "evil\\x1b[2Jname.json: a list, not an object" in str(e.value)


@given(st.text())
def test_printable_leaves_no_control_character(text):
    shown = untrusted.printable(text)
    assert all(ch.isprintable() or ch == " " for ch in shown)
    if text.isprintable():
        assert shown == text


def test_printable_keeps_every_script_and_escapes_what_moves_a_terminal():
    assert untrusted.printable("训练 run-1") == "训练 run-1"
    assert untrusted.printable("a\nb\x1b[31m\x7f\u202e") == "a\\nb\\x1b[31m\\u007f\\u202e"
    assert untrusted.loads("1.5", expect=float) == 1.5


STATE_KEYS = ["phase", "progress", "supervisor", "sync", "remote_checkpoint", "gpu_wait", "devices", "restarts",
              "last_error", "step", "loss", "pid", "since", "last_ok", "time", "state", "start_ticks"]
state_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.sampled_from(STATE_KEYS), children,
                                                                      max_size=4),
    max_leaves=20)


@pytest.mark.slow
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.sampled_from(STATE_KEYS), state_values, max_size=8))
def test_the_overview_shows_any_state_json_object_without_a_traceback(tmp_path, state):
    """`status --all` of a run whose state.json holds any value of any type where a number or a dict belongs."""
    from minilmd.daemon.host.registry import Entry
    from minilmd.daemon.views import overview

    (tmp_path / "state.json").write_text(json.dumps(state))
    row = overview.row(Entry("r", tmp_path, "", os.geteuid(), tmp_path / "r.json"), 1e9)
    assert len(overview.table([row])) == 2
    json.dumps(row)


def test_copy_regular_refuses_a_listed_size_over_its_bound(tmp_path):
    """A listing (a record, a manifest) is as untrusted as the file it lists: a size over max_bytes was copied
    whole, max_bytes ignored whenever a size was given."""
    import io

    from minilmd.untrusted import copy_regular

    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    with pytest.raises(Unreadable, match="over 10 bytes"):
        copy_regular(path, io.BytesIO(), size=100, max_bytes=10)
    out = io.BytesIO()
    assert copy_regular(path, out, size=100, max_bytes=100) == 100 and out.getvalue() == b"x" * 100


def test_copy_regular_of_the_first_bytes_reads_no_more_whatever_the_file_is(tmp_path):
    """`first`: the listed prefix of a file being appended to (initstage's probe split): never more than it read of
    a longer file, fewer of a shorter one (its caller compares), and a FIFO or a link never opened."""
    import io

    from minilmd.untrusted import Hashing, copy_regular

    path = tmp_path / "split.bin"
    path.write_bytes(b"x" * 100 + b"appended")
    sink = Hashing(io.BytesIO())
    assert copy_regular(path, sink, first=100, chunk=7) == 100 and sink.keep.getvalue() == b"x" * 100
    assert sink.sha256.hexdigest() == hashlib.sha256(b"x" * 100).hexdigest()
    out = io.BytesIO()
    assert copy_regular(path, out, first=1000) == 108 and out.getvalue() == path.read_bytes()
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "zero").symlink_to("/dev/zero")
    kinds = []
    for name in ("fifo", "zero"):
        with pytest.raises(Unreadable) as refused:
            copy_regular(tmp_path / name, io.BytesIO(), first=100)
        kinds.append(refused.value.kind)
    assert kinds == ["not_regular", "link"]


def test_dir_names_lists_no_more_than_its_bound_and_never_a_cut_listing_as_whole(tmp_path):
    folder = tmp_path / "filled"  # a directory another user may fill: millions of names cost a bound's worth
    folder.mkdir()
    for i in range(3):
        (folder / f"f{i}").touch()
    os.symlink("/dev/zero", folder / "link")  # listed, never followed or opened
    os.mkfifo(folder / "fifo")
    assert sorted(untrusted.dir_names(folder, max_entries=5)) == ["f0", "f1", "f2", "fifo", "link"]
    with pytest.raises(Unreadable, match=r"filled: holds over 4 entries") as refused:
        untrusted.dir_names(folder, max_entries=4)
    assert refused.value.kind == "too_big"
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(Unreadable, match="holds over 4 entries"):
            untrusted.dir_names(fd, max_entries=4)
    finally:
        os.close(fd)
    with pytest.raises(Unreadable) as missing:
        untrusted.dir_names(tmp_path / "nowhere")
    assert missing.value.missing
