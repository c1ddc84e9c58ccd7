# The student repository's Makefile, written by `labs release`.
# torch is installed first and explicitly, the CPU build (docker/torch-cpu.txt): on PyPI a plain
# `torch` (or torch==2.13.0) is the multi-GB CUDA build.
# Every install goes through docker/requirements.lock, the lock the graders use too.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
LOCK   := docker/requirements.lock
TORCH  ?= -r docker/torch-cpu.txt

.PHONY: setup test clean

$(VENV)/.installed: pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c $(LOCK) $(TORCH)
	$(PY) -m pip install -q -c $(LOCK) -e '.[triton]'
	touch $@

setup: $(VENV)/.installed

test: setup   ## every lab's visible tests
	$(PY) -m pytest labs

clean:
	rm -rf $(VENV) .pytest_cache
