"""minilmd: a resilient long-run training daemon for small language models."""

__version__ = "0.1.0"
