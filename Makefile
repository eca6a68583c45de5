# The two set-up commands of the README. Each creates ./.venv unless a virtualenv is active.
.PHONY: demo test lint

demo:
	@py=$$(scripts/setup.sh test | tail -n1) && "$$py" -m minilmd.daemon.demo

test:
	@py=$$(scripts/setup.sh test | tail -n1) && "$$py" -m pytest -q $(PYTEST_ARGS)

# ruff (lint; import order with `ruff check --fix`) and mypy over minilmd, daemon/ and trainer/ (scripts/typecheck.sh).
lint:
	@py=$$(scripts/setup.sh test | tail -n1) && "$$py" -m ruff check . && scripts/typecheck.sh "$$py"
