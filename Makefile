PYTHON ?= python3
PYTEST_ARGS ?=
SMOKE_ARGS ?=

ZOO_ARGS ?=
ZOO_TASKS_ARGS ?=
# optimum-onnx's unreleased main branch (T4main, T5main): the newest snapshot in the workplace's shared/vendor
# (see its README.md); empty in a clone without one, whose T4main/T5main targets then skip with one line.
OPTIMUM_ONNX_MAIN := $(abspath $(firstword $(shell ls -t $(CURDIR)/../shared/vendor/optimum-onnx-main-*.tar.gz 2>/dev/null)))

.PHONY: bench-big lane-t4 lane-t5 zoo zoo-tasks env-genai anchor env-t3 env-t4 env-t5 env-t4main test-t3 test-t4main test test-t4 test-t5 test-all smoke smoke-env-t4 smoke-t4 smoke-t5 smoke-t4main smoke-t5main wheel demo bench docs clean matrix

env-t3: .venv-t3/.done
env-t4: .venv-t4/.done
env-t5: .venv-t5/.done

.venv-t3/.done: .ci/t3.txt pyproject.toml
	$(PYTHON) -m venv .venv-t3
	.venv-t3/bin/pip install -q -r .ci/t3.txt
	.venv-t3/bin/pip install -q --no-deps -e .
	touch $@

.venv-t4/.done: .ci/t4.txt pyproject.toml
	$(PYTHON) -m venv .venv-t4
	.venv-t4/bin/pip install -q -r .ci/t4.txt
	.venv-t4/bin/pip install -q --no-deps -e .
	.venv-t4/bin/pip check
	touch $@

# T5: the newest stack (.ci/newest.txt). The machine's pip config caps torch below the newest release: lifted for
# this install only (PIP_CONSTRAINT=/dev/null).
.venv-t5/.done: .ci/newest.txt pyproject.toml
	$(PYTHON) -m venv .venv-t5
	PIP_CONSTRAINT=/dev/null .venv-t5/bin/pip install -q -r .ci/newest.txt
	.venv-t5/bin/pip install -q --no-deps optimum-executorch==1.1.0
	.venv-t5/bin/pip install -q --no-deps optimum-onnx==0.1.0
	.venv-t5/bin/pip install -q --no-deps -e .
	touch $@

# T4main for development: T4 with optimum-onnx main over 0.1.0, the package editable (`make test-t4main` runs the
# whole suite there, on demand; CI runs the smoke set in T4main: smoke-t4main below).
ifeq ($(OPTIMUM_ONNX_MAIN),)
env-t4main test-t4main:
	@echo "$@: skipped: ../shared/vendor/optimum-onnx-main-*.tar.gz not found (optimum-onnx main snapshot)"
else
env-t4main: .venv-t4main/.done

.venv-t4main/.done: .ci/t4.txt pyproject.toml $(OPTIMUM_ONNX_MAIN)
	$(PYTHON) -m venv .venv-t4main
	.venv-t4main/bin/pip install -q -r .ci/t4.txt
	.venv-t4main/bin/pip install -q --no-deps -e .
	.venv-t4main/bin/pip install -q --no-deps --force-reinstall "$(OPTIMUM_ONNX_MAIN)"
	touch $@

test-t4main: env-t4main
	HF_HUB_OFFLINE=1 .venv-t4main/bin/python -m pytest $(PYTEST_ARGS) tests --ignore=tests/smoke
endif

test-t4: env-t4
	HF_HUB_OFFLINE=1 .venv-t4/bin/python -m pytest $(PYTEST_ARGS) tests --ignore=tests/smoke

test-t3: env-t3
	HF_HUB_OFFLINE=1 .venv-t3/bin/python -m pytest $(PYTEST_ARGS) tests/test_flatten.py tests/test_caches.py tests/test_cache_roundtrip.py

test-t5: env-t5
	HF_HUB_OFFLINE=1 .venv-t5/bin/python -m pytest $(PYTEST_ARGS) tests --ignore=tests/smoke

# The smoke set runs from the built wheel, installed as users install it, in fresh environments
# (tests/smoke: no test there imports optimum_dynamo; the start-up hook is what activates it). Without the
# executorch extra: the shape most users have.
wheel: $(if $(WHEEL_BUILT),,env-t4)
	$(if $(WHEEL_BUILT),@ls dist/*.whl,rm -rf dist)
	$(if $(WHEEL_BUILT),,.venv-t4/bin/python -m build -q -o dist . >/dev/null)

# $(call smoke_env,NAME,REQUIREMENTS,WHEEL,ONNX): a fresh .venv-smoke-NAME with REQUIREMENTS (without
# sentence-transformers, mistral-common, torchaudio and the executorch extra), the wheel as WHEEL says (T4: with its
# optimum-onnx extra, then `pip check`), the optimum-onnx ONNX installed --no-deps over whatever is there (T5).
define smoke_env
	rm -rf .venv-smoke-$(1) && $(PYTHON) -m venv .venv-smoke-$(1)
	grep -v -E '^(executorch|accelerate|torchvision|torchaudio|sentence-transformers|mistral-common)' $(2) > .venv-smoke-$(1)/requirements.txt
	PIP_CONSTRAINT=/dev/null .venv-smoke-$(1)/bin/pip install -q -r .venv-smoke-$(1)/requirements.txt
	PIP_CONSTRAINT=/dev/null .venv-smoke-$(1)/bin/pip install -q $(3)
	$(if $(findstring optimum-onnx,$(3)),.venv-smoke-$(1)/bin/pip check)
	$(if $(4),.venv-smoke-$(1)/bin/pip install -q --no-deps --force-reinstall $(4))
endef

# $(call smoke,NAME,...): the environment (unless SMOKE_ENV_BUILT names it: built beforehand), then the smoke set.
define smoke
	$(if $(filter $(1),$(SMOKE_ENV_BUILT)),,$(call smoke_env,$(1),$(2),$(3),$(4)))
	$(call smoke_run,$(1))
endef

# $(call smoke_main,NAME): T4main, T5main: the same environment with optimum-onnx's unreleased main branch installed
# over its optimum-onnx (--no-deps: its metadata asks for optimum from git and transformers < 4.58), the smoke set
# again; then the environment is removed (CI's disk). Without the snapshot: one line.
define smoke_main
	$(if $(OPTIMUM_ONNX_MAIN),.venv-smoke-$(1)/bin/pip install -q --no-deps --force-reinstall "$(OPTIMUM_ONNX_MAIN)",\
	  @echo "$(1)main: skipped: ../shared/vendor/optimum-onnx-main-*.tar.gz not found (optimum-onnx main snapshot)")
	$(if $(OPTIMUM_ONNX_MAIN),$(call smoke_run,$(1)))
	$(if $(CI),rm -rf .venv-smoke-$(1))
endef

smoke_run = cd tests/smoke && SMOKE_WHEEL="$$(ls ../../dist/*.whl)" ../../.venv-smoke-$(1)/bin/python -m pytest $(SMOKE_ARGS) .

smoke-env-t4: wheel
	$(call smoke_env,t4,.ci/t4.txt,"$$(ls dist/*.whl)[optimum-onnx]",)

smoke-t4: wheel
	$(call smoke,t4,.ci/t4.txt,"$$(ls dist/*.whl)[optimum-onnx]",)

smoke-t5: wheel
	$(call smoke,t5,.ci/newest.txt,dist/*.whl,optimum-onnx==0.1.0)

smoke-t4main: smoke-t4
	$(call smoke_main,t4)

smoke-t5main: smoke-t5
	$(call smoke_main,t5)

smoke: smoke-t4main smoke-t5main

# The environments are independent: built, then run side by side as two lanes (2 cores; a suite is mostly one busy
# Python process plus its children), each its suite then its smoke sets, so T4's smoke sets run while T5's suite
# (the longer) still runs. The wheel is built once, before (WHEEL_BUILT: the lanes reuse it). One OpenMP thread per
# lane: two suites on 2 cores ran 4-6% faster than with torch's default of two threads each. --output-sync
# prints each lane's output whole when it ends.
test:
	$(MAKE) -j2 env-t4 env-t5
	$(MAKE) wheel
	$(MAKE) -j2 --output-sync=target lane-t4 lane-t5 WHEEL_BUILT=1

# T4's smoke environment is built while its suite runs (pip unpacking from its cache, about a minute off the lane);
# T5's cannot be (the disk holds three environments at once: .venv-t5 is removed first).
# In the background of the recipe's shell: the lanes hold both of make's job slots.
lane-t4:
	$(MAKE) smoke-env-t4 > dist/smoke-env-t4.log 2>&1 & built=$$!; \
	OMP_NUM_THREADS=1 $(MAKE) test-t4; tests=$$?; \
	wait $$built; env=$$?; cat dist/smoke-env-t4.log; [ $$tests -eq 0 ] && [ $$env -eq 0 ]
	OMP_NUM_THREADS=1 $(MAKE) smoke-t4main SMOKE_ENV_BUILT=t4

lane-t5:
	OMP_NUM_THREADS=1 $(MAKE) test-t5
	$(if $(CI),rm -rf .venv-t5)  # CI's disk: at most three environments at once
	OMP_NUM_THREADS=1 $(MAKE) smoke-t5main

test-all:
	$(MAKE) test PYTEST_ARGS="$(PYTEST_ARGS) --runslow"
	$(MAKE) test-t3

# On demand, not in CI: side-by-side export/runtime ratios (benchmarks/run.py --help); several minutes.
bench: env-t4
	HF_HUB_OFFLINE=1 .venv-t4/bin/python benchmarks/run.py $(BENCH_ARGS)

# On demand, not in CI: the benchmark's anchor, onnxruntime-genai's model builder (it needs transformers 5; its
# own onnxruntime) over the benchmark's 56M llama checkpoint: fp32 and int4 graphs in $(BENCH_WORK)/genai-*, then
# `make bench BENCH_ARGS="--work $(BENCH_WORK) --anchor llama56m:genai=$(BENCH_WORK)/genai-fp32"`.
BENCH_WORK ?= /tmp/bench-work
env-genai: .venv-genai/.done

.venv-genai/.done:
	$(PYTHON) -m venv .venv-genai
	.venv-genai/bin/pip install -q torch==2.13.0 transformers==5.23.0 onnxruntime-genai==0.18.0 onnx_ir onnxscript
	touch $@

anchor: env-t4 env-genai
	HF_HUB_OFFLINE=1 .venv-t4/bin/python benchmarks/run.py --models llama56m --work $(BENCH_WORK) --checkpoints-only
	for p in fp32 int4; do HF_HUB_OFFLINE=1 .venv-genai/bin/python -m onnxruntime_genai.models.builder \
	  -i $(BENCH_WORK)/checkpoints/llama56m -o $(BENCH_WORK)/genai-$$p -p $$p -e cpu; done

# On demand, not in CI, as root (it makes a cgroup-v1 memory group): an 8B-shaped bf16 checkpoint written shard by
# shard to $(BIG_WORK) (15 GB; kept for the next run), then exports inside a memory cap (benchmarks/big.py --help).
BIG_WORK ?= /tmp/optimum-dynamo-big
bench-big: env-t4 env-genai
	HF_HUB_OFFLINE=1 .venv-t4/bin/python benchmarks/big.py --work $(BIG_WORK) --anchor .venv-genai/bin/python $(BIG_ARGS)

# On demand, not in CI (hours on 2 cores): every model type of transformers' own causal-LM, seq2seq, speech and
# image-text-to-text mappings, both environments side by side, then the table in docs/status.md (tests/zoo.py --help).
zoo: env-t4 env-t5
	mkdir -p .zoo
	for v in t4 t5; do ( for k in causal seq2seq speech vlm; do HF_HUB_OFFLINE=1 .venv-$$v/bin/python tests/zoo.py \
	  --kind $$k --json .zoo/$$v-$$k.json $(ZOO_ARGS) > .zoo/$$v-$$k.log 2>&1; done ) & done; wait
	.venv-t5/bin/python tests/zoo.py --table .zoo/t4-*.json .zoo/t5-*.json --docs docs/status.md

# On demand, not in CI: the same for the tasks that do not generate (tests/zoo_tasks.py --help; the whole of
# feature-extraction's mapping is 600 types: ZOO_TASKS_ARGS="--task fill-mask ..." picks tasks). The rows are kept
# in tests/zoo-results (committed: a run adds to them, as no run covers every task in one go).
zoo-tasks: env-t4 env-t5
	mkdir -p .zoo
	for v in t4 t5; do HF_HUB_OFFLINE=1 .venv-$$v/bin/python tests/zoo_tasks.py --json tests/zoo-results/$$v-tasks.json \
	  $(ZOO_TASKS_ARGS) > .zoo/$$v-tasks.log 2>&1 & done; wait
	.venv-t5/bin/python tests/zoo_tasks.py --table tests/zoo-results/t4-tasks.json tests/zoo-results/t5-tasks.json \
	  --docs docs/status.md

# On demand, not in CI (about 10 minutes a row on 2 cores; torch 2.15 is a 5.7 GB CUDA build, one base venv per
# torch version): the version matrix, per row the wheel's smoke set, the decoder sweep's default subset, seq2seq
# and VLM exports, then the table in docs/compatibility.md (tests/matrix.py --help; MATRIX_ARGS="--rows 5.24.0").
MATRIX_ARGS ?=
matrix: wheel
	HF_HUB_OFFLINE=1 $(PYTHON) tests/matrix.py $(MATRIX_ARGS)

demo: env-t4
	HF_HUB_OFFLINE=1 .venv-t4/bin/python tests/demo.py

docs:
	$(PYTHON) -m venv .venv-docs
	.venv-docs/bin/pip install -q mkdocs
	.venv-docs/bin/mkdocs build --strict

clean:
	rm -rf .venv-t3 .venv-t4 .venv-t5 .venv-genai .venv-t4main .venv-smoke-t4 .venv-smoke-t5 .venv-docs build dist *.egg-info
