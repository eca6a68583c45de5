"""minilmd: a resilient long-run training daemon for small language models.

This package is the torch-free core that both processes import: the run protocol (exit statuses, file names),
the config, the checkpoint format and its strict validation, reading a prepared corpus, the model's expected
shapes, file I/O helpers and the command line. It never imports torch or `minilmd.trainer` at module level
(tests/test_layers.py walks the import graph); `minilmd.cli` reaches the trainer only inside command bodies.
"""

__version__ = "0.1.0"
