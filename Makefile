# `make demo` and `make test` set everything up themselves (a .venv with the CPU torch wheel first).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed

.PHONY: install test test-long test-install test-slurm test-gpu test-wheels wheels demo demo-variants demo-cpu bench clean

install: $(STAMP)

# Re-runs only when the package metadata or the pins change.
$(STAMP): pyproject.toml constraints.txt litgpt_vocagnolm_recipes.pth tests/transformers.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -c constraints.txt torch==2.13.0
	$(PIP) install --quiet -c constraints.txt -e ".[test]"
	$(PIP) install --quiet --upgrade --no-deps --target $(VENV)/transformers -r tests/transformers.txt
	touch $(STAMP)

# For make test-install: this package beside the versions LitGPT's extras pick (resolved, nothing installed; a conflict
# stops here), then those versions, for tests/test_install.py.
EXTRA_STAMP := $(VENV)/.litgpt-extra-installed
$(EXTRA_STAMP): $(STAMP) tests/litgpt-extra.txt
	for attempt in 1 2 3; do \
		$(PIP) install --quiet --dry-run --ignore-installed torch==2.13.0 -e ".[test]" -r tests/litgpt-extra.txt \
			&& break; \
		test $$attempt -lt 3 || exit 1; echo "resolving again (a registry hiccup fails as a conflict does)"; \
	done
# Emptied first: --target keeps a package the list no longer names.
	rm -rf $(VENV)/litgpt-extra
	$(PIP) install --quiet --no-deps --target $(VENV)/litgpt-extra -r tests/litgpt-extra.txt
	touch $(EXTRA_STAMP)

# The formatter and the linter check first (pyproject.toml, [tool.ruff]); they change nothing. The tests run in two
# workers (pytest-xdist), each a test file at a time (its module fixtures once) on one thread: the suite's processes
# wait on imports and on each other much of the time, and two workers keep both cores of a small machine busy. The 15
# slowest steps are listed last, to see where the suite's minutes go.
test: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m "$(TIER_TEST)" -n 2 --dist loadfile --durations 15; \
		status=$$?; $(TOOK) test 600; exit $$status

# What a tier took since make started (the install included) beside its budget in seconds (docs/testing.md).
START := $(shell date +%s)
TOOK = took() { s=$$(( $$(date +%s) - $(START) )); echo "make $$1: $$((s / 60)) min $$((s % 60)) s, the install included (budget: $$(($$2 / 60)) min on 2 cores)"; }; took

# The tiers beside `make test` (docs/testing.md: what each holds, why, and its budget). test-long: what a test of
# `make test` shows, again on 3 or 4 processes or over many more steps. test-install: the built wheel installed into
# fresh environments, as a user installs it; it needs the package index.
TIER_TEST := not slurm and not gpu and not wheels and not install and not long
test-long: install
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m "long" -n 2 --dist loadfile --durations 15; \
		status=$$?; $(TOOK) test-long 300; exit $$status

test-install: $(EXTRA_STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m "install" -n 2 --dist loadfile --durations 15; \
		status=$$?; $(TOOK) test-install 600; exit $$status

# Jobs submitted to a real two-node Slurm on this machine, which the script installs (as root) and starts, and stops
# after. Where it cannot start, the tests skip, except under CI=true, where they fail.
test-slurm: install
	eval "$$(bash tests/slurm/local-cluster.sh start)"; \
		$(PY) -m pytest -q -m slurm tests/slurm; status=$$?; \
		bash tests/slurm/local-cluster.sh stop; $(TOOK) test-slurm 1200; exit $$status

# The whole chain on one GPU at the paper's widths (tests/test_gpu.py: under 8 minutes of an H100); where torch sees no
# GPU its test skips. With WHEELS=DIR (`make wheels` beforehand, on a machine with the package registry) it first
# installs this package from DIR with no index, into python3's own site-packages (not --target: the package's .pth
# hook, which `litgpt pretrain --recipe` needs, runs only from a site-packages folder; PIP_BREAK_SYSTEM_PACKAGES lets
# pip write into a system Python that PEP 668 marks as externally managed); without WHEELS it runs in .venv.
CHAIN_LOG ?= out/test-gpu/chain.log
test-gpu: $(if $(WHEELS),,install)
	$(if $(WHEELS),PIP_BREAK_SYSTEM_PACKAGES=1 $(PYTHON) -m pip install --no-index --find-links $(WHEELS) litgpt-vocagnolm)
	VOCAGNOLM_CHAIN_LOG=$(CHAIN_LOG) $(if $(WHEELS),$(PYTHON),$(PY)) -m pytest -q -m gpu tests/test_gpu.py; \
		status=$$?; echo "The chain's log: $(CHAIN_LOG)"; exit $$status

# For `make test-gpu WHEELS=DIR` on a machine with no internet: this package's wheel and what pip would install beside
# it on that machine's image (tests/gpu-image.txt lists its packages; tests/gpu_image.py resolves against them, for its
# Python, WHEELS_PYTHON, on x86_64 Linux), at the versions of tests/gpu-wheels.txt where it pins them: downloaded, or
# built for a release with no wheel. Last, the same resolution from DIR alone, with no index, must find all of it.
WHEELS_PYTHON ?= 3.12
WHEELS_DIR = $(or $(WHEELS),wheels)
PLATFORMS := $(foreach p,manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64,--platform $(p))
wheels: install
	$(PIP) wheel --quiet --no-deps --no-build-isolation --wheel-dir $(WHEELS_DIR) .
	grep "no wheel" tests/gpu-wheels.txt | $(PIP) wheel --quiet --no-deps --wheel-dir $(WHEELS_DIR) -r /dev/stdin
	$(PY) tests/gpu_image.py $(WHEELS_DIR) $(WHEELS_PYTHON) > $(WHEELS_DIR)/image-lacks.txt
	$(PIP) download --quiet --no-deps --only-binary=:all: --python-version $(WHEELS_PYTHON) --implementation cp \
		$(PLATFORMS) --find-links $(WHEELS_DIR) --dest $(WHEELS_DIR) -r $(WHEELS_DIR)/image-lacks.txt
	$(PY) tests/gpu_image.py $(WHEELS_DIR) $(WHEELS_PYTHON) --no-index > /dev/null

# `make wheels`, then `make test-gpu WHEELS=DIR` with no index in a stand-in of the GPU machine's image: it installs
# and the GPU test skips (tests/test_gpu_wheels.py). Needs the package registry; minutes.
test-wheels: install
	$(PY) -m pytest -q -m wheels tests/test_gpu_wheels.py; status=$$?; $(TOOK) test-wheels 300; exit $$status

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
# Run again, it trains again from the start: --overwrite true deletes the previous run's checkpoints in out/demo-cpu.
demo-cpu: install
	test -f out/demo-cpu/data/manifest.json || $(VENV)/bin/vocagnolm prepare \
		--student tests/fixtures/tokenizers/tinyllama-1.1b --teacher tests/fixtures/tokenizers/qwen2.5 \
		--input data/gsm8k/train.jsonl --text_key question,answer --output out/demo-cpu/data --max_seq_length 128
	$(VENV)/bin/litgpt pretrain --recipe vocagnolm --config demo-cpu --overwrite true

# Each benchmark at its defaults; `make bench ARGS=--smoke` runs each at its smallest sizes, as `make test` does.
bench: install
	@for f in benchmarks/bench_*.py; do echo "== $$f"; $(PY) $$f $(ARGS) || exit 1; done

clean:
	rm -rf $(VENV) out .pytest_cache
