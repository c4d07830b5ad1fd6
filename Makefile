VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
export HF_HUB_OFFLINE := 1

.PHONY: install test-install demo test docs serve-prod-like lint format

$(VENV)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	# torch first, pinned: the CPU build; an unpinned torch pulled in by trl would be a CUDA one.
	$(VENV)/bin/pip install -q torch==2.13.0
	$(VENV)/bin/pip install -q -r requirements.txt -e ".[sdk,worker,test]"
	# Its dependencies are in the test extra (pyproject.toml says why it comes without them).
	$(VENV)/bin/pip install -q --no-deps tinker-cookbook==0.6.1
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
