"""Which exceptions are a CUDA out-of-memory: one pure function over the exception and its causes, one table.

torch raises `torch.OutOfMemoryError` only from its caching allocator. The same condition reaches the trainer in
other shapes, and each must lead to the same exit status (76, protocol.EXIT_CUDA_OOM: wait for the GPU or halve
the micro-batch) rather than to a crash (1, retried as is until the run gives up with 79):
- the CUDA context cannot be created because another job took the card after admission: a RuntimeError (in torch
  >= 2.8 its subclass torch.AcceleratorError) "CUDA error: out of memory" from the first CUDA call;
- cuBLAS cannot allocate its workspace: "CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate(handle)"; cuDNN
  likewise "CUDNN_STATUS_ALLOC_FAILED";
- NCCL cannot allocate its buffers: torch.distributed.DistBackendError "... ncclSystemError ... Last error:
  Failed to CUDA calloc 6291456 bytes" or "... ncclUnhandledCudaError ... 'out of memory'".
A bare ncclSystemError is not counted: NCCL reports failed socket and shared-memory calls under the same code, and
halving the micro-batch would not help those. Plain CPU allocation failures ("DefaultCPUAllocator: not enough
memory") are not CUDA OOMs either: that is the host, which the kernel's OOM killer and the restart rules handle.
"""
from __future__ import annotations

CUDA_OOM_MESSAGES: tuple[tuple[str, str], ...] = (
    ("CUDA out of memory", "allocator"),             # torch.OutOfMemoryError's own text
    ("CUDA error: out of memory", "cuda"),           # context creation, or any CUDA runtime call
    ("cudaErrorMemoryAllocation", "cuda"),
    ("CUDA driver error: out of memory", "cuda"),
    ("CUBLAS_STATUS_ALLOC_FAILED", "cublas"),
    ("CUDNN_STATUS_ALLOC_FAILED", "cudnn"),
    ("Failed to CUDA calloc", "nccl"),
    ("Failed to CUDA malloc", "nccl"),
    ("Failed to cuMem", "nccl"),                     # NCCL's cuMem* allocation path (NCCL >= 2.19)
)
"""(text in the exception's message, where it came from): a message holding the text is a CUDA OOM."""

NCCL_OOM_HINT = "out of memory"
"""In a DistBackendError, or a message naming NCCL, this says it was memory (NCCL's "Cuda failure 2 'out of
memory'"). Not "malloc": every ncclSystemError's text says "System call (e.g. socket, malloc) ... failed"."""


def cuda_oom_source(exc: BaseException) -> str | None:
    """Where a CUDA out-of-memory came from ("allocator", "cuda", "cublas", "cudnn", "nccl"), or None if `exc`
    (or any exception in its __cause__/__context__ chain) is not one."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        source = _source_of(current)
        if source:
            return source
        current = current.__cause__ or current.__context__
    return None


def _source_of(exc: BaseException) -> str | None:
    if type(exc).__name__ == "OutOfMemoryError" and isinstance(exc, RuntimeError):
        return "allocator"  # torch.OutOfMemoryError (matched by name: this module does not import torch)
    if not isinstance(exc, RuntimeError):  # torch raises all of these as RuntimeError subclasses
        return None
    message = str(exc)
    for text, source in CUDA_OOM_MESSAGES:
        if text in message:
            return source
    nccl = type(exc).__name__ == "DistBackendError" or "nccl" in message.lower()
    if nccl and NCCL_OOM_HINT in message.lower():
        return "nccl"
    return None


def first_line(exc: BaseException) -> str:
    """The exception's first non-empty line, for fault.json and the log (torch's messages run to many lines)."""
    for line in str(exc).splitlines():
        if line.strip():
            return line.strip()
    return "CUDA out of memory"
