"""Reading a file that another user, another run or another machine may have written: one reader, one rule.

Such a file may be a symlink to /dev/zero, a FIFO nobody writes, a directory, gigabytes, 60 KB of `[` (which makes
json.loads raise RecursionError), a JSON list where an object belongs, or simply someone else's. So:
- `read_bytes` looks before it opens (lstat: a regular file only, so that no FIFO, device or socket is ever
  opened), opens with O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC (minilmd/openflags.py), checks with fstat
  that it opened that same regular file, checks its owner (when the caller names the ones it accepts) before a byte
  is read, and reads at most max_bytes + 1 bytes whatever the size says;
- `loads` decodes UTF-8, bounds the nesting depth by a scan of the brackets outside strings before json.loads sees
  the text, and checks the parsed value's type; it also serves one line of a JSON-lines file;
- `read_json` is the two together;
- `copy_regular` copies such a file, opened as `read_bytes` opens one, of its listed size or at most a bound
  (or its first bytes, of one being appended to), hashing it too through `Hashing`;
  `sha256_regular` hashes one so;
- `dir_names` lists a directory such a user may fill, at most MAX_DIR_ENTRIES names read (scandir, lazily): one of
  millions of entries is refused after that many, not read whole into memory over minutes; `listed` is the same
  for a caller that handles an unreadable directory as an OSError (too many entries: TooManyEntries), `holds_any`
  asks whether one is empty, one entry read. tests/test_listing_audit.py holds every other listing to a review.
Every failure is one exception, `Unreadable`, whose `why` is a few words for a view ("a FIFO", "owned by uid 1001",
"over 1 MiB", "nested deeper than 64", "a list, not an object", "not JSON") and whose `kind` says the same for code
("not_regular", "owner", "too_big", ...: `Kind`), so that no caller decides by the words; a caller shows
"unreadable (why)", skips a bad line or quarantines a checkpoint, and never sees another exception from here.
`printable` escapes what such a file says before it reaches a terminal, `clipped` shortens it (saying so).
Torch-free, standard library only.
"""
from __future__ import annotations

import errno
import hashlib
import itertools
import json
import os
import re
import stat
from collections.abc import Collection
from typing import Any, Literal

from minilmd.fdread import read_past_bound
from minilmd.openflags import OPEN_FLAGS
from minilmd.perms import owner_in

DEFAULT_MAX_DEPTH = 64
MAX_LINE_DEPTH = 100
"""The deepest nesting of arrays and objects a corpus line may have (a conversation needs 3): deeper is a bad line
(minilmd/corpus/sources/jsonl.py, longdoc.py), never a RecursionError."""
MAX_DIR_ENTRIES = 10_000
"""The most entries `dir_names` reads of a directory: the ones minilmd looks into hold a handful."""

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))
_STRINGS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
"""What the depth scan drops first: a whole string (its brackets do not count; an unterminated one runs to the end)."""
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))
_AS_SQUARE = bytes.maketrans(b"{}", b"[]")
_BRACKET_RUNS = re.compile(rb"\[+|\]+")
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
"""What printable(lines=True) escapes: the C0 and C1 controls and DEL, less tab and newline, and the bidi
embeddings, overrides and isolates (which reorder what a terminal shows after them)."""


Kind = Literal["missing", "io", "link", "not_regular", "owner", "too_big", "wrong_size", "changed", "not_utf8",
               "too_deep", "not_json", "wrong_type", "invalid"]
"""What an Unreadable is, for a caller to decide by (its `why` is for people):
- missing: no such file (a reader may take it as "not yet"); io: there, but reading it failed (EIO, EACCES: its
  `os_error`; a failing mount may be retried);
- link: a symbolic link, never followed; not_regular: a directory, FIFO, socket or device, never opened;
- owner: not owned by an owner the reader accepts;
- too_big: over the reader's bound (or it grew past it while read; a directory: of more entries); wrong_size:
  another size than its listing says; changed: replaced between the look and the open, or changed while read (it
  may be being written now);
- not_utf8, too_deep, not_json, wrong_type: what the bytes say (loads);
- invalid: what a reader elsewhere refuses for its own reasons (a record that disagrees with its file name)."""


class Unreadable(ValueError):
    """A file or line that is not what its reader accepts; `why` says what it is instead, in a few words, `kind`
    which of the refusals of `Kind` it is."""

    def __init__(self, why: str, path: str | os.PathLike | None = None, missing: bool = False,
                 os_error: OSError | None = None, kind: Kind | None = None, detail: str | None = None):
        self.why = why
        self.detail = detail
        """json's own words for text that is not JSON ("Expecting ',' delimiter: line 1 column 9 (char 8)"), for a
        reader that shows where it stops being JSON (loads_any); None for any other refusal."""
        self.path = None if path is None else str(path)
        self.kind: Kind = kind or ("missing" if missing else "io" if os_error is not None else "invalid")
        self.missing = self.kind == "missing"
        """The file does not exist (a reader may treat that as "not yet" rather than as a fault)."""
        self.os_error = os_error
        """The error of a file that is what the reader accepts but could not be read (EIO, EACCES): a reader that
        retries a failing mount may raise it again."""
        super().__init__(f"{printable(self.path)}: {why}" if self.path is not None else why)


def size_text(n: int) -> str:
    """1048576 -> "1 MiB", 65536 -> "64 KiB", 1034240 -> "1,010 KiB", 300 -> "300 bytes": three significant
    digits, a count of a thousand or more in full (".3g" wrote it "1.01e+03 KiB")."""
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= factor:
            value = n / factor
            return f"{value:,.0f} {unit}" if value >= 999.5 else f"{value:.3g} {unit}"  # .3g rounds 999.5 up
    return f"{n} bytes"


def file_kind(mode: int) -> str:
    for test, kind in _KINDS:
        if test(mode):
            return kind
    return "a regular file" if stat.S_ISREG(mode) else "not a regular file"


def mode_kind(mode: int) -> Kind:
    """The Unreadable kind of a file of this mode that is not a regular file: a link or something else."""
    return "link" if stat.S_ISLNK(mode) else "not_regular"


def _owner_problem(st: os.stat_result, owner: int | Collection[int] | None) -> str | None:
    if owner is None:
        return None
    accepted = (owner,) if isinstance(owner, int) else owner
    return None if owner_in(st, accepted) else f"owned by uid {st.st_uid}"


def read_bytes(path: str | os.PathLike, *, max_bytes: int, owner: int | Collection[int] | None = None,
               dir_fd: int | None = None) -> bytes:
    """The bytes of a regular file of at most max_bytes, owned by `owner` (a uid or some uids) when given; `path`
    relative to the directory `dir_fd` when given (open_regular)."""
    fd = open_regular(path, owner=owner, dir_fd=dir_fd)
    try:
        return read_open(fd, path, max_bytes=max_bytes)
    finally:
        os.close(fd)


def read_open(fd: int, path: str | os.PathLike, *, max_bytes: int) -> bytes:
    """The bytes of the regular file open at `fd` (the caller opened it by its own rule, and closes it), at most
    max_bytes, `path` naming it in an Unreadable: read_bytes' reading, for a reader that opened the file otherwise
    (minilmd/corpus/sources/local.py read_source, under the one link rule)."""
    try:
        if os.fstat(fd).st_size > max_bytes:
            raise Unreadable(f"over {size_text(max_bytes)}", path, kind="too_big")
        data = read_past_bound(fd, max_bytes)
        if len(data) > max_bytes:
            raise Unreadable(f"over {size_text(max_bytes)}", path, kind="too_big")  # it grew after the fstat
        return data
    except OSError as e:
        raise Unreadable(_os_why(e), path, os_error=e) from None


def read_stream(f, path: str, *, max_bytes: int, what: str = "") -> bytes:
    """At most max_bytes of a file object opened elsewhere (an fsspec store's: no fstat to ask first), max_bytes + 1
    read and more refused (Unreadable, too_big): a hostile or broken server's endless body is never held whole.
    `what` ends the refusal's words ("the most a corpus's meta.json may be")."""
    data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise Unreadable(f"over {size_text(max_bytes)}{', ' + what if what else ''}", path, kind="too_big")
    return data


def copy_regular(path: str | os.PathLike, out, *, size: int | None = None, max_bytes: int | None = None,
                 first: int | None = None, chunk: int = 8 << 20, dir_fd: int | None = None,
                 owner: int | Collection[int] | None = None) -> int:
    """Copy a regular file, opened as `read_bytes` opens one, into the binary file object `out` (a file of this
    process, or one that also hashes it: `Hashing`; it may say after each block that the copy goes on): exactly
    `size` bytes when its listing gives one, else at most max_bytes (with both, a listed size over max_bytes is
    refused: a listing is as untrusted as the file); the bytes copied. The size is checked before a byte is read
    and again as it is read (it may change under us). With `first` instead, its first `first` bytes, never more,
    of a file that may be longer (one being appended to: its listing comes after) or shorter: the caller compares
    what was copied with its listing. Raises Unreadable for the source, OSError for `out`. With `dir_fd`, path is
    a name in that open directory (open_regular); with `owner`, a file of that owner (or those) only."""
    fd = open_regular(path, owner=owner, dir_fd=dir_fd)
    try:
        if first is not None:
            return _copy_blocks(fd, path, out, first, chunk)
        have = os.fstat(fd).st_size
        limit = size if size is not None else max_bytes if max_bytes is not None else have
        if max_bytes is not None and limit > max_bytes:
            raise Unreadable(f"over {size_text(max_bytes)}", path, kind="too_big")
        if size is not None and have != size:
            raise Unreadable(f"{have} bytes, listed as {size}", path, kind="wrong_size")
        if have > limit:
            raise Unreadable(f"over {size_text(limit)}", path, kind="too_big")
        got = _copy_blocks(fd, path, out, limit + 1, chunk)  # one byte more: to see it grow
        if got > limit or (size is not None and got != size):
            raise Unreadable("changed while being read", path, kind="changed")
        return got
    finally:
        os.close(fd)


def _copy_blocks(fd: int, path: str | os.PathLike, out, up_to: int, chunk: int) -> int:
    """Copy from fd into out until up_to bytes or the file's end, in blocks of at most `chunk`; the bytes copied."""
    got = 0
    while got < up_to:
        try:
            block = os.read(fd, min(chunk, up_to - got))
        except OSError as e:
            raise Unreadable(_os_why(e), path, os_error=e) from None
        if not block:
            break
        out.write(block)
        got += len(block)
    return got


def sha256_regular(path: str | os.PathLike, *, size: int | None = None, max_bytes: int | None = None) -> str:
    """The sha256 of a regular file opened and read as `copy_regular` reads one (its listed `size`, or at most
    max_bytes); raises Unreadable only."""
    sink = Hashing()
    copy_regular(path, sink, size=size, max_bytes=max_bytes)
    return sink.sha256.hexdigest()


def sha256_open(fd: int, path: str | os.PathLike, *, first: int | None = None, chunk: int = 8 << 20) -> str:
    """The sha256 of the regular file open at `fd` (one the caller opened as open_regular opens one, or made:
    what its name leads to now is never read), from its start: its first `first` bytes (fewer where it ends
    sooner), else the size fstat gives. Read through a read-only descriptor of its own, opened through the
    kernel's /proc/self/fd link to that very open file (no name looked up), so a write-only `fd` is hashed too and
    its offset, which the caller may use next, is left as it is. Unreadable for a descriptor that is no regular
    file; a read's OSError (EIO) as it comes: the file is already judged, only its storage can fail."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise Unreadable(file_kind(st.st_mode), path, kind=mode_kind(st.st_mode))
    own = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        if (os.fstat(own).st_dev, os.fstat(own).st_ino) != (st.st_dev, st.st_ino):
            raise Unreadable("changed while being read", path, kind="changed")  # fd closed and reused meanwhile
        sha256, at, end = hashlib.sha256(), 0, st.st_size if first is None else first
        while at < end and (block := os.pread(own, min(chunk, end - at), at)):
            sha256.update(block)
            at += len(block)
        return sha256.hexdigest()
    finally:
        os.close(own)


class Hashing:
    """A file object for copy_regular: hashes what it is given, and keeps it too in `keep` when given one."""

    def __init__(self, keep=None):
        self.sha256, self.keep = hashlib.sha256(), keep

    def write(self, block: bytes) -> None:
        self.sha256.update(block)
        if self.keep is not None:
            self.keep.write(block)


def open_regular(path: str | os.PathLike, *, owner: int | Collection[int] | None = None,
                 dir_fd: int | None = None) -> int:
    """A descriptor of a regular file, opened as `read_bytes` opens one (looked at first, no link followed, never
    blocked, the same file checked after the open, its owner when given), for a reader that reads only a bounded
    part of it (the tail of a log or of metrics.jsonl). With `dir_fd`, path is a name in that open directory: a
    reader that walked to it without following a link (a remote's directories) looks up no path again, so no
    directory on the way can be swapped for a link meanwhile. The caller closes it. Raises Unreadable only."""
    try:
        before = os.lstat(path, dir_fd=dir_fd)
    except FileNotFoundError:
        raise Unreadable("missing", path, missing=True) from None
    except OSError as e:
        raise Unreadable(_os_why(e), path, os_error=e) from None
    if not stat.S_ISREG(before.st_mode):
        raise Unreadable(file_kind(before.st_mode), path, kind=mode_kind(before.st_mode))
    problem = _owner_problem(before, owner)
    if problem:
        raise Unreadable(problem, path, kind="owner")
    try:
        fd = os.open(path, OPEN_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        raise Unreadable("missing", path, missing=True) from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise Unreadable("a symbolic link", path, kind="link") from None
        raise Unreadable(_os_why(e), path, os_error=e) from None
    try:
        st = os.fstat(fd)
    except OSError as e:  # pragma: no cover - fstat of a descriptor just opened
        os.close(fd)
        raise Unreadable(_os_why(e), path, os_error=e) from None
    if (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino) or not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise Unreadable("replaced while being opened", path, kind="changed")
    return fd


def dir_names(folder: str | os.PathLike | int, *, max_entries: int = MAX_DIR_ENTRIES) -> list[str]:
    """The names in the directory `folder` (a path, or an open directory's descriptor), of at most max_entries
    entries: past that Unreadable (kind "too_big", "holds over N entries"), never a listing cut short and taken for
    whole; the entries are read lazily, so a directory of millions costs max_entries + 1 of them. Unreadable
    (missing, io) when it cannot be listed; nothing is opened or followed but `folder` itself."""
    try:
        with os.scandir(folder if isinstance(folder, int) else os.fspath(folder)) as entries:
            names = [entry.name for entry in itertools.islice(entries, max_entries + 1)]
    except FileNotFoundError as e:
        raise Unreadable("missing", _named(folder), os_error=e, kind="missing") from None
    except OSError as e:
        raise Unreadable(_os_why(e), _named(folder), os_error=e) from None
    if len(names) > max_entries:
        raise Unreadable(f"holds over {max_entries:,} entries", _named(folder), kind="too_big")
    return names


class TooManyEntries(OSError):
    """A directory of more entries than its lister reads (`listed`): refused like one that cannot be read."""


def listed(folder: str | os.PathLike | int, *, max_entries: int = MAX_DIR_ENTRIES) -> list[str]:
    """`dir_names` for a caller that takes a directory it cannot list as os.listdir's OSError (a root on a failing
    mount: "nothing found", "try again", "cannot be examined"): the very OSError the listing raised
    (FileNotFoundError, NotADirectoryError, EIO...), and TooManyEntries (EOVERFLOW, "holds over N entries") for one
    of more than max_entries entries, which that caller then handles as it handles an unreadable one."""
    try:
        return dir_names(folder, max_entries=max_entries)
    except Unreadable as e:
        if e.os_error is not None:
            raise e.os_error from None
        raise TooManyEntries(errno.EOVERFLOW, e.why, os.fspath(_named(folder))) from None


def holds_any(folder: str | os.PathLike | int) -> bool:
    """Whether a directory holds any entry at all, one entry read at most; OSError as `listed`'s."""
    try:
        listed(folder, max_entries=0)
    except TooManyEntries:
        return True
    return False


def _named(folder: str | os.PathLike | int) -> str | os.PathLike:
    return f"directory descriptor {folder}" if isinstance(folder, int) else folder


def _os_why(e: OSError) -> str:
    if e.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    return f"cannot be read: {e.strerror or e}"


def too_deep(text: str, max_depth: int) -> bool:
    """Whether [ and { nest deeper than max_depth outside strings (unbalanced text too: json.loads judges it
    after). Text with no more brackets than max_depth is not scanned. Linear and cheap whatever the text (a Python
    step per bracket took 39 s on 63 MiB of {}): the regex engine drops the strings, bytes.translate all but the
    brackets ({ and } read as [ and ]); while innermost pairs "[]" are many (an 8th of what is left), a C-speed
    replace drops them all, one level a pass; then few are left, and so are the runs of [ or of ] between them (at
    most two a pair), which one Python step each counts."""
    if text.count("[") + text.count("{") <= max_depth:
        return False
    outside = _STRINGS.sub(b"", text.encode("utf-8", "surrogatepass"))
    brackets = outside.translate(_AS_SQUARE, _NOT_BRACKETS)
    passes = 0
    while brackets.count(b"[]") * 8 > len(brackets):
        brackets = brackets.replace(b"[]", b"")
        passes += 1
        if passes > max_depth:
            return True
    level = passes  # each pass took one level off every nesting
    for run in _BRACKET_RUNS.finditer(brackets):
        width = run.end() - run.start()
        level = level + width if brackets[run.start()] == ord("[") else max(level - width, passes)
        if level > max_depth:
            return True
    return False


def is_count(v: Any) -> bool:
    """A JSON value that is a count: an int (not a bool) of 0 or more."""
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def kind_of(value) -> str:
    """What a parsed JSON value is, in the words of a refusal: "an object", "a list", "a string", ..."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, (int, float)):
        return "a number"
    return "null" if value is None else type(value).__name__


def _expected(value, expect: type | tuple[type, ...] | None) -> bool:
    if expect is None:
        return True
    wanted = expect if isinstance(expect, tuple) else (expect,)
    if isinstance(value, bool) and bool not in wanted:
        return False  # True is an int to isinstance, never a number to a reader
    return isinstance(value, wanted)


def _wanted_text(expect: type | tuple[type, ...]) -> str:
    samples = {dict: {}, list: [], str: "", int: 0, float: 0.0, bool: True, type(None): None}
    wanted = expect if isinstance(expect, tuple) else (expect,)
    return " or ".join(dict.fromkeys(kind_of(samples.get(t)) if t in samples else t.__name__ for t in wanted))


def loads(data: bytes | str, *, max_depth: int = DEFAULT_MAX_DEPTH, expect: type | tuple[type, ...] | None = dict,
          path: str | os.PathLike | None = None):
    """One JSON document (a whole file, or one line of a JSON-lines file) of at most max_depth levels, of type
    `expect` (None: any). Raises Unreadable only."""
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise Unreadable("not UTF-8", path, kind="not_utf8") from None
    else:
        text = data
    if too_deep(text, max_depth):
        raise Unreadable(f"nested deeper than {max_depth}", path, kind="too_deep")
    try:
        value = json.loads(text)
    except RecursionError:  # pragma: no cover - only a caller's max_depth beyond the interpreter's stack
        raise Unreadable(f"nested deeper than this reader can follow (max_depth {max_depth})", path,
                         kind="too_deep") from None
    except ValueError as e:  # JSONDecodeError, and an integer of more digits than int() accepts
        raise Unreadable("not JSON", path, kind="not_json", detail=str(e)) from None
    if not _expected(value, expect):
        raise Unreadable(f"{kind_of(value)}, not {_wanted_text(expect)}", path,  # type: ignore[arg-type]
                         kind="wrong_type")
    return value


def loads_any(data: bytes | str, *, max_depth: int = DEFAULT_MAX_DEPTH):
    """`loads` of any JSON value (the caller judges its type), for a reader that says what is wrong in json's own
    words (a corpus's bad line, a meta.json refused: where the text stops being JSON) or loads' (nested deeper than
    max_depth, not UTF-8): a ValueError saying so, as json.loads raises one. The one parse there is: tests/
    test_json_audit.py lists every other json.load(s)."""
    try:
        return loads(data, max_depth=max_depth, expect=None)
    except Unreadable as e:
        raise ValueError(e.detail or e.why) from None


def read_json(path: str | os.PathLike, *, max_bytes: int, max_depth: int = DEFAULT_MAX_DEPTH,
              expect: type | tuple[type, ...] | None = dict, owner: int | Collection[int] | None = None,
              dir_fd: int | None = None):
    """read_bytes then loads: the JSON value of a file another user, run or machine may have written (`path` a
    name in the open directory `dir_fd` when given)."""
    return loads(read_bytes(path, max_bytes=max_bytes, owner=owner, dir_fd=dir_fd), max_depth=max_depth,
                 expect=expect, path=path)


def printable(text: str | os.PathLike | None, lines: bool = False) -> str:
    """text with every control or format character (newline, ESC, DEL, C1, bidi overrides, ...) written as an
    escape (\\n, \\x1b, \\u202e), so that a name from someone else's file cannot move the cursor, recolour or
    reorder a terminal; letters of every script stay as they are. `lines`: text meant to be read as text (a model's
    reply, what a tokenizer's decoder made of it, a message of several lines): its newlines and tabs stay, and only
    the C0 and C1 controls (ESC, CR, DEL, CSI...: what a terminal obeys, OSC 52 writing the clipboard) and the bidi
    overrides are escaped, its spaces and joiners of every script left as they are. This is what every line minilmd
    prints goes through at the end (minilmd/terminal.py), so a C0 control is written \\xNN (\\x1b), DEL, a C1
    control or anything else \\uNNNN: JSON reads that as the same character, and json.dumps writes every C0 control
    escaped itself, so a JSON document (`status --json`, `corpus report --json`) escaped here is still the same
    JSON."""
    text = "" if text is None else str(os.fspath(text))
    if text.isprintable():
        return text
    if lines:
        return _CONTROLS.sub(lambda m: _escape(m.group()), text)
    return "".join(ch if ch.isprintable() or ch == " " else _escape(ch) for ch in text)


def clipped(text: str | bytes, max_len: int) -> str:
    """text as shown when someone else wrote it (a path read from another run's file, a log line): whole when it
    is at most max_len characters (bytes, for bytes: decoded, a bad sequence replaced), else its first max_len and
    a marker saying how many were left out, so that a planted megabyte never reaches a terminal whole. Not
    escaped: printable() it."""
    over = len(text) - max_len
    head = text[:max_len] if over > 0 else text
    shown = head.decode(errors="replace") if isinstance(head, bytes) else head
    if over > 0:
        shown += f" [... {over:,} more {'bytes' if isinstance(text, bytes) else 'characters'} left out]"
    return shown


def _escape(ch: str) -> str:
    if ch in "\n\r\t":
        return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}[ch]
    code = ord(ch)
    if code < 0x20:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
