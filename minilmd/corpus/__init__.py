"""The corpus tooling, torch-free: the prepared-corpus format, tokenizers, sources, chat templates,
`minilmd prepare`, `minilmd corpus report/count` and the demo corpora."""
