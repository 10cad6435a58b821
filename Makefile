# opforge -- `make demo` runs the end-to-end demo, `make test` runs every test.
# Both bootstrap what they need: a Python environment outside the clone (tools/bootstrap.sh;
# set OPFORGE_PYTHON to use an interpreter that already has torch), then a CMake/Ninja build.
SHELL := /bin/bash
.DEFAULT_GOAL := demo
# When make started: `make test` ends with its time.
START := $(shell date +%s)

PY := $(shell tools/bootstrap.sh)
ifeq ($(PY),)
$(error tools/bootstrap.sh failed to provide a Python environment)
endif
PYEXE := $(shell command -v $(PY))
PYBIN := $(shell dirname "$(PYEXE)")
CMAKE := $(shell [ -x "$(PYBIN)/cmake" ] && echo "$(PYBIN)/cmake" || command -v cmake)
CTEST := $(shell [ -x "$(PYBIN)/ctest" ] && echo "$(PYBIN)/ctest" || command -v ctest)
NINJA := $(shell [ -x "$(PYBIN)/ninja" ] && echo "$(PYBIN)/ninja" || command -v ninja)
BUILD ?= build
export OPFORGE_BUILD_DIR := $(abspath $(BUILD))
export PYTHONPATH := $(CURDIR)/python$(if $(PYTHONPATH),:$(PYTHONPATH))
# CI's log shows the slowest tests and why tests were skipped.
PYTEST_ARGS ?= --durations=25 -rs
# The Python tests run in PYTEST_WORKERS processes (pytest-xdist), one test file per process at a
# time, so that each file's module fixtures (its op libraries, packages) are built once; at most 4
# by default, as each process holds torch (and JAX) in memory. Files are taken in collection order,
# files with slow tests first (tests/python/run_options.py). An interpreter without pytest-xdist
# (OPFORGE_PYTHON) runs them in one process.
PYTEST_WORKERS ?= $(shell n=$$(nproc); echo $$(( n < 4 ? n : 4 )))

# What the demo needs (the adapter, the runner and its op library) is built first, and alone by
# `make demo`; `make build` builds every example and the C++ unit tests as well.
DEMO_TARGETS := opforge_torch opforge-runner bias_gelu

.PHONY: build build-demo demo test test-cpp test-python clean

$(BUILD)/build.ninja:
	$(CMAKE) -S . -B $(BUILD) -G Ninja -DCMAKE_MAKE_PROGRAM=$(NINJA) -DPython3_EXECUTABLE=$(PYEXE)

build-demo: $(BUILD)/build.ninja
	$(CMAKE) --build $(BUILD) --target $(DEMO_TARGETS)

build: build-demo
	$(CMAKE) --build $(BUILD)

demo: build-demo
	$(PY) examples/models/minilm_demo.py

test-cpp: build
	$(CTEST) --test-dir $(BUILD) --output-on-failure

# The tests' caches outside the clone (Inductor's, the kernels', JAX's, Python's bytecode) are set
# and kept to their sizes by tests/python/conftest.py.
test-python: build
	@if $(PY) -c 'import xdist' 2>/dev/null; then parallel="-n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder"; \
	else echo "make test: pytest-xdist is not installed in $(PY): the Python tests run in one process"; fi; \
	echo "$(PY) -m pytest tests/python $$parallel $(PYTEST_ARGS)"; \
	$(PY) -m pytest tests/python $$parallel $(PYTEST_ARGS)

test: test-cpp test-python
	@echo "make test: passed in $$(( $$(date +%s) - $(START) )) s (environment, build, C++ and Python tests)"

clean:
	rm -rf $(BUILD) out
