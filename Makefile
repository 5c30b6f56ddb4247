# `make demo` and `make test` set everything up themselves (a .venv with the CPU torch wheel first).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed

.PHONY: install test test-slurm demo demo-variants demo-cpu bench clean

install: $(STAMP)

# Re-runs only when the package metadata or the pins change.
$(STAMP): pyproject.toml constraints.txt litgpt_vocagnolm_recipes.pth tests/transformers.txt tests/litgpt-extra.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -c constraints.txt torch==2.13.0
	$(PIP) install --quiet -c constraints.txt -e ".[test]"
	$(PIP) install --quiet --upgrade --no-deps --target $(VENV)/transformers -r tests/transformers.txt
# This package beside LitGPT's extras in one `pip install` (resolved, nothing installed; a conflict stops here),
# then what that install brings which LitGPT and this package import, for tests/test_install.py.
	for attempt in 1 2 3; do \
		$(PIP) install --quiet --dry-run --ignore-installed -c tests/litgpt-extra.txt torch==2.13.0 -e ".[test]" \
			"litgpt[extra]" && break; \
		test $$attempt -lt 3 || exit 1; echo "resolving again (a registry hiccup fails as a conflict does)"; \
	done
	$(PIP) install --quiet --upgrade --no-deps --target $(VENV)/litgpt-extra -r tests/litgpt-extra.txt
	touch $(STAMP)

# The formatter and the linter check first (pyproject.toml, [tool.ruff]); they change nothing.
test: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pytest -q -m "not slurm"

# Jobs submitted to a real two-node Slurm on this machine, which the script installs (as root) and starts, and stops
# after. Where it cannot start, the tests skip, except under CI=true, where they fail.
test-slurm: install
	eval "$$(bash tests/slurm/local-cluster.sh start)"; \
		$(PY) -m pytest -q -m slurm tests/slurm; status=$$?; \
		bash tests/slurm/local-cluster.sh stop; exit $$status

demo: install
	$(VENV)/bin/vocagnolm demo

# The cases docs/demo.md reports beside the demo, each the demo with one setting changed: clean text, three times the
# students' budget, a teacher trained ten times shorter (weaker than the students).
demo-variants: install
	$(VENV)/bin/vocagnolm demo --out_dir out/demo-clean --noise 0 --methods '[ce, random, vocagnolm]' \
		--seeded_methods '[ce, random, vocagnolm]'
	$(VENV)/bin/vocagnolm demo --out_dir out/demo-3x-budget --sizes.student_tokens 614400 --methods '[ce, vocagnolm]'
	$(VENV)/bin/vocagnolm demo --out_dir out/demo-weak-teacher --sizes.teacher_tokens 20480 --methods '[ce, vocagnolm]'

# The tiny recipe alone (plain cross-entropy, TinyLlama's tokenizer): the path CLI -> data -> Fabric -> checkpoint.
demo-cpu: install
	test -f out/demo-cpu/data/manifest.json || $(VENV)/bin/vocagnolm prepare \
		--student tests/fixtures/tokenizers/tinyllama-1.1b --teacher tests/fixtures/tokenizers/qwen2.5 \
		--input data/gsm8k/train.jsonl --text_key question,answer --output out/demo-cpu/data --max_seq_length 128
	$(VENV)/bin/litgpt pretrain --recipe vocagnolm --config recipes/demo-cpu.yaml

# Each benchmark at its defaults; `make bench ARGS=--smoke` runs each at its smallest sizes, as `make test` does.
bench: install
	@for f in benchmarks/bench_*.py; do echo "== $$f"; $(PY) $$f $(ARGS) || exit 1; done

clean:
	rm -rf $(VENV) out .pytest_cache
