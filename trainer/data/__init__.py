"""Corpus preparation: JSONL reading, the tokenizer, `prepare` (JSONL -> packed uint16 stream), the row samplers."""
