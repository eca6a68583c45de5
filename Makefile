# The two set-up commands of the README. Each creates ./.venv unless a virtualenv is active. The demos install
# minilmd with its demo extra (the corpora, matplotlib), the test targets and lint with the test extra.
# test-fast: the tests not marked slow (the unit tests, about 2 minutes on 2 cores); `make test` and .ci/run run them
# all.
.PHONY: demo demo-sft demo-dpo test test-fast lint

demo:
	@py=$$(scripts/setup.sh demo | tail -n1) && "$$py" -m minilmd.daemon.demo

# Each demo in a directory of its own (demo-run/, demo-sft-run/, demo-dpo-run/): one never removes another's.
# demo-sft: the demo's pretraining, then fine-tuning on a small real chat corpus (chatterbot-corpus), then a chat.
demo-sft:
	@py=$$(scripts/setup.sh demo | tail -n1) && "$$py" -m minilmd.daemon.demo_sft

# demo-dpo: demo-sft, then DPO (the fourth stage) on preference pairs from the same chat corpus, then a chat.
demo-dpo:
	@py=$$(scripts/setup.sh demo | tail -n1) && "$$py" -m minilmd.daemon.demo_dpo

# `make test` runs on TEST_WORKERS pytest-xdist processes, `make test-fast` on FAST_WORKERS: many slow tests wait on
# child processes, timeouts, Slurm's minute and faults rather than compute, so more workers than the 2 cores of the
# test machine fill the cores those waits leave idle. Measured at stop 62, the whole suite on 2 cores: 1151 s with 3
# workers, 991 s with 4, 958 s with 5 (150 CPU-s more spent than 4); vmstat said 28 % of the CPU idle in the slow
# tier alone with 3 workers, 15 % and 6 % over the whole suite with 4 and 5. The unit tests, CPU-bound: 105 and
# 107 s with 3 workers, 114 and 115 s with 4 (a worker's collection is about 14 CPU-s). TEST_WORKERS=0
# (FAST_WORKERS=0) runs them in this one process, serially.
TEST_WORKERS ?= 4
FAST_WORKERS ?= 3
# Tests handed out a few at a time, in the order tests/conftest.py sorts them (the slow tier first, the longest
# first), to the worker that has finished; the tests conftest.SAME_WORKER groups all go to one worker (a module
# fixture of minutes, set up once). The default --dist load gave each worker a third of the slow tier in one block.
DIST = --dist loadgroup --no-loadscope-reorder
# Bytecode caches on for the tests, whatever the environment says (PYTHONDONTWRITEBYTECODE is set on some
# machines): without them every `minilmd` subprocess a test starts compiles the package again (0.58 s of CPU against
# 0.12 s measured for `import minilmd.cli.views, minilmd.daemon.supervisor`), and every worker rewrites the asserts
# of every test module at each run. The caches go to __pycache__/, which git ignores.
PYTEST = env -u PYTHONDONTWRITEBYTECODE "$$py" -m pytest

test:
	@py=$$(scripts/setup.sh test | tail -n1) && $(PYTEST) -q -n $(TEST_WORKERS) $(DIST) $(PYTEST_ARGS)

test-fast:
	@py=$$(scripts/setup.sh test | tail -n1) && $(PYTEST) -q -n $(FAST_WORKERS) $(DIST) -m "not slow" $(PYTEST_ARGS)

# ruff (lint; import order with `ruff check --fix`) and mypy over minilmd, daemon/ and trainer/ (scripts/typecheck.sh).
lint:
	@py=$$(scripts/setup.sh test | tail -n1) && "$$py" -m ruff check . && scripts/typecheck.sh "$$py"
