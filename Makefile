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

# Tests in parallel processes (pytest-xdist), at most 4: each JAX process uses every core for its big ops,
# but most tests are bound by single-threaded compiles; on 2 cores 2 workers take ~8.5 min against ~12.
test: $(STAMP)
	$(PY) -m pytest -n auto --maxprocesses=4 --dist worksteal $(ARGS)

clean:
	rm -rf $(VENV) runs .pytest_cache
