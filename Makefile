# The two set-up commands of the README. Each creates ./.venv unless a virtualenv is active.
.PHONY: demo test

demo:
	@py=$$(scripts/setup.sh test | tail -n1) && "$$py" -m minilmd.daemon.demo

test:
	@py=$$(scripts/setup.sh test | tail -n1) && "$$py" -m pytest -q $(PYTEST_ARGS)
