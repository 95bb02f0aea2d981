# Duckgres Admin — developer and CI entry points. Run as root on Debian 12 (see README.md).
#
#   make demo     install + services + a reshard through the API, the worker and a runner
#   make test     install + services + migration checks + the full pytest suite
#   make lint     ruff, ruff format --check, mypy --strict, import-linter, makemigrations --check,
#                 OpenAPI schema without warnings
#   make install  .venv with requirements-dev.txt (re-installs only when requirements change)
#   make services PostgreSQL 5432/5433/5434 (TLS), Redis 6379, kube-apiserver 16443
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
WITH_TEST_ENV := $(PY) scripts/with_test_env.py
PYTEST_ARGS ?=
REQ_STAMP := $(VENV)/.installed-$(shell cat requirements.txt requirements-dev.txt | sha256sum | cut -c1-16)
MIGRATE_CHECK_DB := duckgres_migrate_check_$(shell echo $$PPID)
PSQL_ADMIN := PGOPTIONS='-c client_min_messages=warning' psql -h 127.0.0.1 -U postgres -d postgres -qAtc

.PHONY: help install services test lint demo migrate-check clean

help:
	@sed -n '2,8p' Makefile | sed 's/^# \{0,1\}//'

install: $(REQ_STAMP)

$(REQ_STAMP): requirements.txt requirements-dev.txt
	@missing=(); \
	command -v psql >/dev/null || missing+=(postgresql-client); \
	command -v redis-server >/dev/null || missing+=(redis-server); \
	if [ $${#missing[@]} -gt 0 ]; then \
	  echo "install: apt-get install $${missing[*]}"; \
	  export DEBIAN_FRONTEND=noninteractive; apt-get update -q >/dev/null; \
	  apt-get install -y -q --no-install-recommends "$${missing[@]}" >/dev/null; \
	fi
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements-dev.txt
	@rm -f $(VENV)/.installed-*; touch $@

services:
	.ci/services.sh

# Migrations are complete (no model change without a migration) and apply to an empty database.
migrate-check: install services
	$(WITH_TEST_ENV) manage.py makemigrations --check --dry-run
	@$(PSQL_ADMIN) 'DROP DATABASE IF EXISTS $(MIGRATE_CHECK_DB)'
	@$(PSQL_ADMIN) 'CREATE DATABASE $(MIGRATE_CHECK_DB)'
	DUCKGRES_CONFIG_STORE="postgresql://postgres@127.0.0.1:5432/$(MIGRATE_CHECK_DB)?sslmode=require" \
	  $(WITH_TEST_ENV) manage.py migrate --no-input -v 0
	DUCKGRES_CONFIG_STORE="postgresql://postgres@127.0.0.1:5432/$(MIGRATE_CHECK_DB)?sslmode=require" \
	  $(WITH_TEST_ENV) manage.py migrate --check -v 0
	@$(PSQL_ADMIN) 'DROP DATABASE IF EXISTS $(MIGRATE_CHECK_DB)'

# The full suite. pytest exits 5 when it collected no tests: that is a failure, never a pass.
test: install services migrate-check
	@rc=0; $(PY) -m pytest $(PYTEST_ARGS) || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests: failing" >&2; exit 1; fi; \
	exit $$rc

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(WITH_TEST_ENV) $(VENV)/bin/mypy .
	$(VENV)/bin/lint-imports
	$(WITH_TEST_ENV) manage.py makemigrations --check --dry-run
	$(WITH_TEST_ENV) manage.py spectacular --fail-on-warn --file /dev/null

demo: install services
	scripts/demo.sh

clean:
	rm -rf var test-artifacts .pytest_cache .mypy_cache .ruff_cache .import_linter_cache
