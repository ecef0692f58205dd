# sglang-marconi: two commands for a fresh machine.
#   make demo   install into .venv (if needed) and run the A/B on the bundled default
#   make test   install into .venv (if needed) and run the whole test suite
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.sglang-marconi-installed
TRACE ?= ../shared/traces/mooncake/synthetic_trace.jsonl

.PHONY: demo test install clean bench

install: $(STAMP)

$(STAMP): requirements/cpu.txt requirements/no-deps.txt setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q torch==2.14.1 torchvision==0.29.1
	$(PIP) install -q -r requirements/cpu.txt
	MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE \
	CAUSAL_CONV1D_SKIP_CUDA_BUILD=TRUE CAUSAL_CONV1D_FORCE_BUILD=TRUE \
	$(PIP) install -q --no-deps --no-build-isolation -r requirements/no-deps.txt
	$(PIP) install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m sglang_marconi demo --trace $(TRACE)

test: $(STAMP)
	$(PY) -m pytest -q tests

clean:
	rm -rf $(VENV) build *.egg-info
