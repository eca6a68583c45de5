"""Reading raw corpora: JSONL (local or fsspec, compressed) in blocks, and lines longer than a block."""
