"""The tensor shapes of a torch.save zip file (a MiniMind .pth), read without torch and without running a line of
its code, so that `run --check` compares init.from's .pth with the run's [model] as it does a checkpoint's (the
trainer alone loads it, with torch, after the user has walked away).

Such a .pth may be another user's file on a share, so it is hostile: the zip is read through a file object that
gives out at most MAX_DIRECTORY_BYTES for its directory, then MAX_PICKLE_BYTES for its data.pkl, whatever its
records say (or become while read); at most MAX_MEMBERS members; data.pkl (`<prefix>/data.pkl`, the prefix its
first member's) stored, never inflated (zipfile inflates a member's whole stream at once: a bomb), and no bigger
than MAX_PICKLE_BYTES by its listing and as read. data.pkl is unpickled by an Unpickler whose find_class hands out
inert stubs for a fixed list of names, those a state dict of tensors pickles (collections.OrderedDict,
torch._utils' tensor and parameter rebuilds, the torch storage classes and dtypes), and refuses any other ("not a
plain state dict: GLOBAL posix.system"); its persistent_load gives a stub storage, and no tensor byte is read.
Anything else (the legacy, non-zip torch.save format; a zip cut short) is NotReadHere, saying what it is: the
caller notes that the shapes were not checked (the trainer checks them at start).
Torch-free, standard library only.
"""
from __future__ import annotations

import io
import pickle
import zipfile
from typing import BinaryIO

from minilmd.untrusted import clipped, printable, size_text

MAX_DIRECTORY_BYTES = 4 << 20
"""The most bytes read of the zip's end records and directory: a member's entry is ~100 bytes (zipfile makes an
object of ~500 of each), and a small LM's .pth has a member a tensor, a few hundred."""
MAX_MEMBERS = 20_000
MAX_PICKLE_BYTES = 1 << 20
"""The largest data.pkl unpickled: ~200 bytes a tensor, so ~5,000 tensors (MiniMind's state dict has ~100, a 24-layer
model's ~300). An unpickler makes an object of each byte or two, 64 bytes and more: at 1 MiB, a hostile pickle
costs ~80 MB and a second at most, within --check's 5 s look at shared storage (minilmd/bounded.py)."""
LEGACY_MAGIC = b"\x80\x02\x8a\x0a"
"""How a .pth in torch's legacy (non-zip) format begins: a pickle of its magic number, a long."""

STORAGES = frozenset(f"{kind}Storage" for kind in (
    "Double", "Float", "Half", "BFloat16", "Long", "Int", "Short", "Char", "Byte", "Bool", "ComplexDouble",
    "ComplexFloat", "Untyped"))
DTYPES = frozenset(("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
                    "complex64", "complex128", "double", "float", "half", "long", "int", "short"))


class NotReadHere(ValueError):
    """A .pth whose shapes this reader does not read; the message says what it is, in a few words."""


class ResumeFile(ValueError):
    """MiniMind's `*_resume.pth` (trainer_utils.lm_checkpoint): a dict of 'model', 'optimizer', 'epoch', 'step', ...,
    not a state dict; init_model.resume_file says which file to use instead."""


RESUME_KEYS = ("model", "optimizer")
"""The entries that make a torch.save'd dict MiniMind's resume file (its 'model': the weights' state dict)."""


def is_minimind_resume(top: object) -> bool:
    """Whether what a .pth holds is MiniMind's resume file rather than a state dict (by the trainer with torch, here
    without)."""
    return isinstance(top, dict) and all(key in top for key in RESUME_KEYS) and isinstance(top["model"], dict)


class Shape(tuple):
    """A tensor of the state dict, as its shape only."""


class _Storage:
    """What a tensor's storage is unpickled as: nothing (its bytes are never read)."""
    __slots__ = ()


class _Named(str):
    """A storage class or dtype torch pickles by name: its name only."""


MAX_DIMS = 8
MAX_ELEMENTS = 1 << 40
"""A tensor's size read at most: 8 dimensions, each and their product under 2**40 elements (a model's tensor is
far smaller). A pickle's integers have no bound: a dimension of 5,001 digits made minimind_lora's f-string raise
(over Python's 4,300 digits) in `run --check`'s probe (hostile audit 8 F4)."""


def _dims(size) -> Shape:
    if not isinstance(size, tuple) or not all(type(d) is int and d >= 0 for d in size):
        raise NotReadHere("not a plain state dict: a tensor whose size is no tuple of sizes")
    elements = 1
    for d in size[:MAX_DIMS]:
        elements *= min(d, MAX_ELEMENTS)  # each factor bounded first: never a product of huge integers
    if len(size) > MAX_DIMS or elements >= MAX_ELEMENTS:
        raise NotReadHere(f"not a plain state dict: a tensor's size is over what a model's tensor can be (at most "
                          f"{MAX_DIMS} dimensions, under 2**40 elements)")
    return Shape(size)


def _tensor(storage, storage_offset, size, stride, *rest) -> Shape:
    """torch._utils._rebuild_tensor(_v2)'s stand-in (rest: requires_grad, backward_hooks, metadata)."""
    if not isinstance(storage, _Storage):
        raise NotReadHere("not a plain state dict: a tensor without a storage")
    return _dims(size)


def _parameter(data, requires_grad, backward_hooks, *state) -> Shape:
    """torch._utils._rebuild_parameter(_with_state)'s stand-in: the tensor it wraps."""
    if not isinstance(data, Shape):
        raise NotReadHere("not a plain state dict: a parameter of no tensor")
    return data


class _OrderedDict(dict):
    """collections.OrderedDict's stand-in: a dict (a state dict's `_metadata` lands in its __dict__)."""


_REBUILDS = {"_rebuild_tensor": _tensor, "_rebuild_tensor_v2": _tensor, "_rebuild_parameter": _parameter,
             "_rebuild_parameter_with_state": _parameter}


class _StateDictUnpickler(pickle.Unpickler):
    """Unpickles a state dict's data.pkl into {name: Shape}; every global is a stub of ours or refused."""

    def find_class(self, module: str, name: str):
        if module == "collections" and name == "OrderedDict":
            return _OrderedDict
        if module == "torch._utils" and name in _REBUILDS:
            return _REBUILDS[name]
        if module == "torch" and (name in STORAGES or name in DTYPES):
            return _Named(name)
        raise NotReadHere(f"not a plain state dict: GLOBAL {clipped(printable(f'{module}.{name}'), 120)}")

    def persistent_load(self, pid):
        if isinstance(pid, tuple) and pid[:1] == ("storage",):
            return _Storage()
        raise NotReadHere("not a plain state dict: a persistent id other than a storage")


class _Bounded:
    """The .pth's file object for zipfile, reading no more than `left` bytes (the caller sets it for each part)."""

    def __init__(self, f: BinaryIO):
        self.f, self.left = f, 0

    def read(self, n: int | None = -1) -> bytes:
        if n is None or n < 0:  # to the end: zipfile's read of the end records (64 KiB at most, in a zip)
            n = self.left + 1
        elif n > self.left:
            raise self.over()
        data = self.f.read(n)
        if len(data) > self.left:
            raise self.over()
        self.left -= len(data)
        return data

    @staticmethod
    def over() -> NotReadHere:
        return NotReadHere(f"its zip directory or data.pkl is over what this reader reads "
                           f"({size_text(MAX_DIRECTORY_BYTES)}, {size_text(MAX_PICKLE_BYTES)})")

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.f.seek(offset, whence)

    def tell(self) -> int:
        return self.f.tell()

    def seekable(self) -> bool:
        return True


def pth_shapes(f: BinaryIO) -> dict[str, tuple[int, ...]]:
    """{tensor name: shape} of the state dict a torch.save zip file holds (`f`: binary, seekable, at any position);
    NotReadHere for a file that is not one, or not one this reader reads (the module's docstring)."""
    return _shapes(_data_pkl(f))


def _data_pkl(f: BinaryIO) -> bytes:
    """The archive's data.pkl, read bounded."""
    f.seek(0)
    head = f.read(len(LEGACY_MAGIC))
    bounded = _Bounded(f)
    bounded.left = MAX_DIRECTORY_BYTES
    try:
        with zipfile.ZipFile(bounded) as archive:  # zipfile reads only through it: bounded
            members = archive.infolist()
            if len(members) > MAX_MEMBERS:
                raise NotReadHere(f"a zip of over {MAX_MEMBERS:,} members")
            prefix = members[0].filename.split("/", 1)[0] if members and "/" in members[0].filename else ""
            info = next((m for m in members if m.filename == f"{prefix}/data.pkl"), None)
            if not prefix or info is None:
                raise NotReadHere("a zip archive, but not torch.save's (no <prefix>/data.pkl)")
            listed = max(info.file_size, info.compress_size)
            if listed > MAX_PICKLE_BYTES:
                raise NotReadHere(f"its data.pkl is {size_text(listed)}, over {size_text(MAX_PICKLE_BYTES)}")
            if info.compress_type != zipfile.ZIP_STORED:  # never inflated (the module's docstring)
                raise NotReadHere("its data.pkl is compressed (torch.save stores it as it is)")
            bounded.left = MAX_PICKLE_BYTES + (1 << 20)  # and its local header, however it lies
            data = archive.read(info)  # stored: its listed compressed size, read as it is
    except NotReadHere:
        raise
    except zipfile.BadZipFile as e:
        if head.startswith(LEGACY_MAGIC):
            raise NotReadHere("torch.save's legacy format (not a zip archive)") from None
        raise NotReadHere(f"not a zip archive, or one cut short or damaged ({_said(e)})") from None
    except Exception as e:  # noqa: BLE001 - a hostile zip fails in many ways: each is "not read here"
        raise NotReadHere(f"a zip archive this reader cannot read ({type(e).__name__}: {_said(e)})") from None
    if len(data) > MAX_PICKLE_BYTES:
        raise NotReadHere(f"its data.pkl is over {size_text(MAX_PICKLE_BYTES)}")
    return data


def _shapes(data: bytes) -> dict[str, tuple[int, ...]]:
    """data.pkl unpickled with nothing but stubs: {name: shape} of a dict of tensors, else NotReadHere."""
    try:
        state = _StateDictUnpickler(io.BytesIO(data)).load()
    except NotReadHere:
        raise
    except Exception as e:  # noqa: BLE001 - a hostile pickle fails in many ways (RecursionError, MemoryError too)
        raise NotReadHere(f"not a readable pickle ({type(e).__name__}: {_said(e)})") from None
    if is_minimind_resume(state):
        raise ResumeFile("MiniMind's resume file")
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, Shape) for k, v in state.items()):
        raise NotReadHere("not a plain state dict: not a dict of tensors by name")
    return {k: tuple(v) for k, v in state.items()}


def _said(e: Exception) -> str:
    return clipped(printable(str(e)), 200)
