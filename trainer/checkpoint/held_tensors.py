"""Tensors made over a safetensors file held in memory, without copying its bytes: a resume's load
(save.load_carrying) makes the model's and the optimizer's tensors over the very buffers checkpoint_load.for_loading
hashed and checked, so that what is loaded is what was checked at no more host memory than the files' size (the
tensors are those bytes; safetensors.torch.load(bytes) copied them, holding the file twice).

The layout is the one parser's (minilmd/safetensors_scan.py in_memory: bounded, checked, the tensors tiling the data);
this module only maps its dtypes to torch's. A tensor whose place in the buffer is not aligned to its element size
(safetensors aligns the data's start to 8 bytes, not each tensor: a file of mixed dtypes may put an F32 after an odd
run of bytes) is copied out instead: torch.frombuffer would make an unaligned tensor.
"""
from __future__ import annotations

import sys

import torch

from minilmd.safetensors_scan import InMemory

_TORCH_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                 "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
                 "BOOL": torch.bool}


def tensors_of(held: InMemory) -> dict[str, torch.Tensor]:
    """{name: tensor} of a safetensors file held in memory, each a view of `held.data` (which the tensors keep alive;
    writable: an optimizer updates its state in place), a copy only where the view would be unaligned."""
    if sys.byteorder != "little":  # safetensors is little-endian; a view would read it byte-swapped
        raise NotImplementedError("loading a checkpoint on a big-endian host")
    data, start = held.data, held.data_start
    base = torch.frombuffer(data, dtype=torch.uint8).data_ptr() if data else 0
    tensors = {}
    for name, entry in held.entries.items():
        dtype, shape = _TORCH_DTYPES[entry["dtype"]], entry["shape"]
        begin, end = (start + at for at in entry["data_offsets"])
        itemsize = dtype.itemsize
        if begin == end:
            tensor = torch.empty(shape, dtype=dtype)
        elif (base + begin) % itemsize:
            tensor = torch.frombuffer(bytearray(memoryview(data)[begin:end]), dtype=dtype)
        else:
            tensor = torch.frombuffer(data, dtype=dtype, count=(end - begin) // itemsize, offset=begin)
        tensors[name] = tensor.reshape(shape)
    return tensors
