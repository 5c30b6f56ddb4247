# `make demo` and `make test` set everything up themselves (a .venv with the CPU torch wheel first).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed

.PHONY: install test demo bench clean

install: $(STAMP)

# Re-runs only when the package metadata or the pins change.
$(STAMP): pyproject.toml constraints.txt litgpt_vocagnolm_recipes.pth
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -c constraints.txt torch==2.13.0
	$(PIP) install --quiet -c constraints.txt -e ".[test]"
	touch $(STAMP)

test: install
	$(PY) -m pytest -q

demo: install
	$(VENV)/bin/vocagnolm pretrain --config recipes/demo-cpu.yaml

bench: install
	@for f in benchmarks/bench_*.py; do echo "== $$f"; $(PY) $$f || exit 1; done

clean:
	rm -rf $(VENV) out .pytest_cache
