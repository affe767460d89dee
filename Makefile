# `make run`: set up .venv (if needed) and run the default experiment on the embedded MNIST data.
# `make test`: set up .venv (if needed) and run the test suite.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test setup clean

$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -e .
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(PY) launch.py --config=configs/default.py $(ARGS)

test: $(STAMP)
	$(PY) -m pytest $(ARGS)

clean:
	rm -rf $(VENV) runs .pytest_cache
