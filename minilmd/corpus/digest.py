"""The 64-bit digest of a document's bytes (blake2b, 8 bytes, little-endian): prepare's split rule and leak keys
(prepare/block.py) and the exact duplicates `corpus report` counts (analysis/scan.py) are the same hash."""
from __future__ import annotations

import hashlib


def digest64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")
