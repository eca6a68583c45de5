"""minilmd: a resilient long-run training daemon for small language models.

This package is the torch-free core that both processes import: the run protocol (exit statuses, special ids,
fault kinds: protocol.py), every on-disk name (names.py), the config, the checkpoint format and its strict
validation, reading a prepared corpus, the model's expected shapes, file I/O helpers (fsio.py: publish_dir, the
file-table verifier, log tails), the duration format (fmt.py) and the command line. It never imports torch or
`minilmd.trainer` at module level; `minilmd.cli` reaches the trainer only inside command bodies.
"""

__version__ = "0.1.0"
