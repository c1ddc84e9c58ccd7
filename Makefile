# Two entry points (README): `make demo` grades real lab-04 submissions, `make test` runs the suite.
# torch is installed first and explicitly, the CPU build (docker/torch-cpu.txt): on PyPI a plain
# `torch` (or torch==2.13.0) is the multi-GB CUDA build.
# Every install goes through docker/requirements.lock, the lock the grading images use too.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
LOCK   := docker/requirements.lock
TORCH  ?= -r docker/torch-cpu.txt
JOBS   ?= 2
# the venv's console scripts (labs, nbgrader, alembic) on PATH for the tests' subprocesses
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: setup demo test test-fast image image-gpu clean

$(VENV)/.installed: pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c $(LOCK) $(TORCH)
	$(PY) -m pip install -q -c $(LOCK) -e '.[triton,dev,nbgrader,server]'
	touch $@

setup: $(VENV)/.installed

# A student release (`labs release`) has no tests/ or scripts/demo.py: there `make test`
# runs the visible lab tests and `make demo` says what it needs.
demo: setup
ifneq ($(wildcard scripts/demo.py),)
	$(PY) scripts/demo.py
else
	@echo "make demo grades with the hidden graders: run it in the staff repository"
endif

test: setup
ifneq ($(wildcard tests),)
	$(VENV)/bin/lint-imports   # the harness's layers (pyproject.toml [tool.importlinter])
	$(PY) -m pytest tests -n $(JOBS) -m "not alone" --durations=15
	$(PY) -m pytest tests -n 0 -m alone -p no:randomly   # timing-stability proofs, with nothing beside them
else
	$(PY) -m pytest labs
endif

test-fast: setup   ## framework tests only, no lab grader suites
	$(PY) -m pytest tests --ignore=tests/test_labs.py -n $(JOBS)

image: setup   ## the CPU grading image (needs a Docker engine)
	$(VENV)/bin/labs image build

image-gpu: setup   ## the CUDA grading image: builds without a GPU (5.2 GB, about 4 min here: docker/README.md); not in CI
	$(VENV)/bin/labs image build --gpu

clean:
	rm -rf $(VENV) .pytest_cache
