"""The soak is a script (`python tests/soak/soak.py --minutes 30`), not a test: keep pytest out of this directory,
so that `make test` never runs it."""
collect_ignore_glob = ["*"]
