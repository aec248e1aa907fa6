# Two commands a newcomer needs: `make train` (the embedded default run) and `make test`.
# Both bootstrap .venv, installing the CPU build of torch first so no CUDA wheels are pulled.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
TORCH   ?= torch==2.13.0
STAMP   := $(VENV)/.installed

.PHONY: setup train test bench lint plot clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[test,plot,math,tensorboard]"
	touch $(STAMP)

train: $(STAMP)
	$(BIN)/grpo train $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest -q $(ARGS)

bench: $(STAMP)
	$(BIN)/python scripts/bench.py $(ARGS)

plot: $(STAMP)
	$(BIN)/python scripts/plot_metrics.py $(RUN)

clean:
	rm -rf $(VENV) build dist *.egg-info
