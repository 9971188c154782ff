# The two commands of the README quick start are `make demo` and `make test`; both create or reuse the
# virtualenv first. CI (.ci/run) runs `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.capc-installed

.PHONY: demo test lint typecheck unit bench clean-venv

$(STAMP): pyproject.toml scripts/bootstrap.sh
	./scripts/bootstrap.sh $(VENV)
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/capc demo

test: $(STAMP) lint typecheck unit

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

typecheck: $(STAMP)
	$(PY) -m mypy

unit: $(STAMP)
	$(PY) -m pytest

clean-venv:
	rm -rf $(VENV)
