# Two entry points (README): `make demo` grades real lab-04 submissions, `make test` runs the suite.
# torch is installed first and explicitly: an unpinned `torch` pulls a multi-GB CUDA build.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
TORCH  ?= torch==2.13.0
JOBS   ?= 2

.PHONY: setup demo test test-fast clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[triton,dev]'
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(PY) scripts/demo.py

test: setup
	$(PY) -m pytest tests -n $(JOBS) --durations=15

test-fast: setup   ## framework tests only, no lab grader suites
	$(PY) -m pytest tests --ignore=tests/test_labs.py -n $(JOBS)

clean:
	rm -rf $(VENV) .pytest_cache
