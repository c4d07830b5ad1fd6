VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
export HF_HUB_OFFLINE := 1

.PHONY: install test-install demo test docs serve-prod-like lint format

# uv installs (the one rented machines install with, pinned in requirements.txt): pip took 77 s
# of a fresh clone's `make test` on 2 cores, uv 36 s with the same versions and the bytecode
# compiled as pip does. uv reads no pip configuration, so pip's find-links (where a machine keeps
# wheels such as torch's CPU build) are handed on.
UV_FIND_LINKS ?= $(or $(PIP_FIND_LINKS),$(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null))
UV_INSTALL = UV_FIND_LINKS="$(UV_FIND_LINKS)" $(VENV)/bin/uv pip install -q --compile-bytecode \
  --python $(VENV)/bin/python
UV_PIN = $(shell grep '^uv==' requirements.txt)

$(VENV)/.installed: requirements.txt pyproject.toml
	# Without pip at first (ensurepip takes 3.5 s): uv put in by this Python's pip where that pip
	# can install into another Python (--python, pip 22.3+), else by the venv's own; uv puts pip in.
	$(PYTHON) -m venv --without-pip $(VENV)
	$(PYTHON) -m pip --python $(VENV)/bin/python install -q "$(UV_PIN)" \
	  || { $(VENV)/bin/python -m ensurepip >/dev/null && $(VENV)/bin/python -m pip install -q "$(UV_PIN)"; }
	$(UV_INSTALL) --upgrade pip  # the control plane's `pip download` fills the wheelhouse
	# torch first, pinned: the CPU build; an unpinned torch pulled in by trl would be a CUDA one.
	$(UV_INSTALL) torch==2.13.0
	$(UV_INSTALL) -r requirements.txt -e ".[sdk,worker,test]"
	# Its dependencies are in the test extra (pyproject.toml says why it comes without them).
	$(UV_INSTALL) --no-deps tinker-cookbook==0.6.1
	# Run as root, local workers keep customer code in a bubblewrap sandbox (worker/sandbox.py).
	if [ "$$(id -u)" = 0 ] && ! command -v bwrap >/dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap; fi
	touch $@

install: $(VENV)/.installed

# The IAM policy evaluator tests/volumes/test_scoped_policy.py runs (node; versions pinned by the
# lock file), into a git-ignored node_modules beside it.
IAM_EVAL := tests/volumes/iam
$(IAM_EVAL)/node_modules/.installed: $(IAM_EVAL)/package.json $(IAM_EVAL)/package-lock.json
	if [ "$$(id -u)" = 0 ] && ! command -v npm >/dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm; fi
	npm ci --prefix $(IAM_EVAL) --ignore-scripts --no-audit --no-fund --loglevel=error
	touch $@

test-install: install $(IAM_EVAL)/node_modules/.installed

demo: install
	$(PY) manage.py quickstart

# Two lanes (CONTRIBUTING.md, "Test"): the real trainings one at a time on one of the TEST_WORKERS
# xdist workers, the rest on the others; the 15 slowest tests, each lane's seconds and the total.
TEST_WORKERS ?= 3
test: test-install
	VENV=$(VENV) scripts/with-services.sh $(VENV)/bin/pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --durations=15 $(PYTEST_ARGS)

# The docs site from docs/ into site/ (git-ignored); --strict: a broken link or a page missing from
# the navigation fails it. make test builds it too (tests/docs/test_site.py).
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# PostgreSQL, Redis, moto as the S3 store, gunicorn and two qclusters; Ctrl-C stops them.
serve-prod-like: install
	VENV=$(VENV) scripts/with-services.sh $(PY) scripts/prod_like.py

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .
