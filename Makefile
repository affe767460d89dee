# `make run`: set up .venv (if needed) and run the default experiment on the embedded MNIST data.
# `make test`: set up .venv (if needed) and run the test suite but its CI-only tests (`make test-ci`: those;
# `make test-fast`: all but the slow tests).
# `make setup GPU=cuda12`: the same .venv with JAX's CUDA 12 build (JAX's own `cuda12` extra, at the jax version
# of requirements.txt); later commands use it without being told again. `make clean setup` goes back to CPU.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
GPU_EXTRAS := cuda12 cuda13

# The GPU build a venv was made with is kept in it ($(VENV)/.gpu): `make run` after `make setup GPU=cuda12` needs no
# GPU= again. Only the command line sets it (an environment variable GPU means other things on many clusters).
ifneq ($(origin GPU),command line)
GPU := $(shell cat $(VENV)/.gpu 2>/dev/null)
endif
ifneq ($(filter-out $(GPU_EXTRAS),$(GPU)),)
$(error GPU=$(GPU) is invalid; allowed: $(GPU_EXTRAS) (JAX's CUDA builds), or none for the CPU build)
endif
JAX_VERSION := $(shell sed -n 's/^jax==\([^ #]*\).*/\1/p' requirements.txt)
# One stamp per build: a CPU venv keeps the stamp it always had (no reinstall), a GPU one has its own.
STAMP := $(VENV)/.installed$(if $(GPU),-$(GPU))

.PHONY: run test test-ci test-fast test-avx2 setup clean results results-report

$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt$(if $(GPU), "jax[$(GPU)]==$(JAX_VERSION)")
	$(PY) -m pip install --quiet --no-deps -e .
	$(if $(GPU),echo $(GPU) > $(VENV)/.gpu)
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(PY) launch.py --config=configs/default.py $(ARGS)

# The suite in parallel processes (pytest-xdist), at most 4: most tests are bound by single-threaded compiles, so one
# worker per core (docs/testing.md has the times). All but the tests marked `ci`, which `test-ci` runs: those that
# need a set-up outside the suite's processes (a Ray cluster, a wheel in a new venv, a Jupyter kernel) or repeat a
# stop-and-resume case at more moments. CI runs both.
test: $(STAMP)
	$(PY) -m pytest -n auto --maxprocesses=4 --dist worksteal -m "not ci" $(ARGS)

test-ci: $(STAMP)
	$(PY) -m pytest -n auto --maxprocesses=4 --dist worksteal -m ci $(ARGS)

# The edit-test loop: everything but the tests marked slow (all of tests/e2e/: whole runs, launch.py subprocesses,
# sweeps, the notebook; and the module tests of 2 s or more, marked by hand; docs/testing.md has the times).
# It keeps its compiled programs in .pytest_cache/fedpsa-jax between runs (tests/conftest.py), so a rerun
# compiles only what an edit changed, and its bytecode in .pytest_cache/pycache, also where PYTHONDONTWRITEBYTECODE
# is set: otherwise every worker rewrites the asserts of every test module again (about 6 s of each run).
test-fast: $(STAMP)
	FEDPSA_TEST_CACHE=$${FEDPSA_TEST_CACHE:-.pytest_cache/fedpsa-jax} PYTHONDONTWRITEBYTECODE= \
		PYTHONPYCACHEPREFIX=$(CURDIR)/.pytest_cache/pycache \
		$(PY) -m pytest -n auto --maxprocesses=4 --dist worksteal -m "not slow" $(ARGS)

# The numerics-heavy files again with XLA:CPU held to AVX2 (other vector widths and summation orders than an
# AVX-512 machine's): a tolerance fitted to one CPU's bits fails here before it lands. CI runs it after `test`.
# At the compiler optimisation users get (`test` compiles at level 0 for speed; see tests/conftest.py).
NUMERICS_TESTS := tests/test_numerics.py tests/test_models.py tests/test_fisher.py tests/test_sensitivity.py tests/test_local.py \
	tests/sim/test_executor.py tests/strategies/test_base.py tests/strategies/test_fedpsa.py tests/strategies/test_fedbuff.py \
	tests/strategies/test_fedasync.py tests/strategies/test_fedavg.py
test-avx2: $(STAMP)
	FEDPSA_TEST_FULL_OPT=1 XLA_FLAGS="$(XLA_FLAGS) --xla_cpu_max_isa=AVX2" $(PY) -m pytest -n auto --maxprocesses=4 --dist worksteal \
		$(NUMERICS_TESTS) $(ARGS)

# docs/results.md's sweeps (hours to days of a 2-core CPU; rerun to resume: finished members are skipped), then
# their reports. Each sweep keeps its finished members' records (config, summary, metrics and events compressed; no
# checkpoints) in results/<sweep>/ (--records), a sweep directory small enough to commit: the reports are drawn from
# there, and on a fresh clone a sweep starts from them. mnist_full needs the full MNIST prepared in DATA (README, "Data").
# RESULTS: where the runs themselves (with checkpoints) go; EXECUTOR=ray: members as Ray tasks.
RESULTS ?= runs/results
EXECUTOR ?= local
DATA ?= $(HOME)/tensorflow_datasets
RESULT_SWEEPS := table1_mnist_5k fedpsa_parts shape_step horizon mnist_full step_tuning
results: $(STAMP)
	for s in $(RESULT_SWEEPS); do \
		arg=$$(test $$s = mnist_full && echo ":data.data_dir=$(DATA)"); \
		$(PY) launch.py --mode=sweep --executor=$(EXECUTOR) --config=configs/results/$$s.py$$arg \
			--workdir=$(RESULTS)/$$s --records=results/$$s || exit 1; \
	done
	$(MAKE) results-report

# The reports alone, from the records in results/<sweep>/ into results/<sweep>/report/ (of finished or partly
# finished sweeps: a member not recorded shows as n/a), drawn with the layout of today's configs/results/*.py.
results-report: $(STAMP)
	for s in $(RESULT_SWEEPS); do \
		test -f results/$$s/sweep.json || { echo "results/$$s: no records, skipped"; continue; }; \
		rm -rf results/$$s/report && \
		$(PY) launch.py --mode=report --workdir=results/$$s --config=configs/results/$$s.py || exit 1; \
	done

clean:
	rm -rf $(VENV) runs .pytest_cache
