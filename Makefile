# The two set-up commands of the README. Each creates ./.venv unless a virtualenv is active.
# test-fast: the tests not marked slow (the unit tests, under a minute); `make test` and .ci/run run them all.
.PHONY: demo demo-sft test test-fast lint

demo:
	@py=$$(scripts/setup.sh test | tail -n1) && "$$py" -m minilmd.daemon.demo

# demo-sft: the demo's pretraining, then fine-tuning on a small real chat corpus (chatterbot-corpus), then a chat.
demo-sft:
	@py=$$(scripts/setup.sh test | tail -n1) && "$$py" -m minilmd.daemon.demo_sft

test:
	@py=$$(scripts/setup.sh test | tail -n1) && "$$py" -m pytest -q $(PYTEST_ARGS)

test-fast:
	@py=$$(scripts/setup.sh test | tail -n1) && "$$py" -m pytest -q -m "not slow" $(PYTEST_ARGS)

# ruff (lint; import order with `ruff check --fix`) and mypy over minilmd, daemon/ and trainer/ (scripts/typecheck.sh).
lint:
	@py=$$(scripts/setup.sh test | tail -n1) && "$$py" -m ruff check . && scripts/typecheck.sh "$$py"
