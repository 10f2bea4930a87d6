# `make check` runs exactly what CI runs (.ci/run): install, then the whole test suite,
# which includes ruff lint and format checks.
.PHONY: install demo check lint format proto docs bench lock

# constraints.txt pins every package at the version the suite passed with (.ci/lock).
install:
	pip install -c constraints.txt torch==2.13.0 -e ".[test]"

demo:
	pip install -c constraints.txt torch==2.13.0 -e . && skyfed demo

check:
	bash .ci/run

# After adding a package to pyproject.toml: pin it, keeping every other pin. To move every
# package to the newest release pyproject.toml admits: bash .ci/lock --refresh.
lock:
	bash .ci/lock

lint:
	ruff check . && ruff format --check . && python -m pytest -q tests/test_types.py

format:
	ruff check --fix . && ruff format .

proto:
	python -m skyfed.proto.generate

# The generated references: configuration (the config dataclasses' field docstrings),
# metrics (the catalog), the CLI (the click commands), measured results (bench/results/).
docs:
	python -m skyfed.config.reference
	python -m skyfed.config.cliref
	python -m skyfed.metrics.reference
	python bench/results_index.py

bench:
	python bench/compression.py && python bench/convergence.py
