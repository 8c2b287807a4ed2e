# freight: `make demo` runs a real job end to end; `make test` runs the suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEMO := .demo
# checkov in its own venv: its HCL parser package clashes with python-hcl2's module of the same name
CHECKOV_VENV := $(VENV)-checkov

.PHONY: demo test test-all lint install install-dev checkov browser clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[dev]'
	touch $(VENV)/.installed $@

$(CHECKOV_VENV)/.installed:
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install -q checkov==3.3.30
	touch $@

# the dashboard's browser tests drive Debian's chromium (tests/browser.py); installed once, quietly
browser:
	@if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then \
		echo "installing chromium and chromium-driver for the dashboard's browser tests"; \
		apt-get update -qq >/dev/null && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; \
	fi

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev
checkov: $(CHECKOV_VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/python examples/demo.py --workdir $(DEMO)

test: $(VENV)/.installed-dev $(CHECKOV_VENV)/.installed browser
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -m "not slow" --durations=25

test-all: $(VENV)/.installed-dev $(CHECKOV_VENV)/.installed browser
	$(BIN)/python -m pytest -q

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) $(CHECKOV_VENV) $(DEMO) .pytest_cache .ruff_cache
