# Duckgres Admin — developer and CI entry points. Run as root on Debian 12 (see README.md).
#
#   make demo     install + services + a reshard through the API, the worker and a runner
#   make test     provision + install + services + migration checks + the FULL pytest suite
#                 (xdist workers, then the pods suite alone)
#                 (CI mode: a marked suite that cannot run fails; `make test CI=false` lets the
#                 kube, rgw and browser suites skip when their service is missing)
#   make lint     ruff, ruff format --check, mypy --strict, import-linter, makemigrations --check,
#                 OpenAPI schema without warnings
#   make install  .venv from requirements-dev.lock, every file hash-checked (re-installs only when
#                 a lock changes); `make lock` re-compiles both locks after a requirements edit
#   make services PostgreSQL 5432/5433/5434 (TLS), Redis 6379, kube-apiserver 16443
#   make image    the container image (Containerfile) with buildah on a local Debian base
#   make release  the image pushed (RELEASE_DESTINATION), manifests pinned to its digest, an SBOM
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
WITH_TEST_ENV := $(PY) scripts/with_test_env.py
PYTEST_ARGS ?=
REQ_STAMP := $(VENV)/.installed-$(shell cat requirements.lock requirements-dev.lock | sha256sum | cut -c1-16)
MIGRATE_CHECK_DB := duckgres_migrate_check_$(shell echo $$PPID)
PSQL_ADMIN := PGOPTIONS='-c client_min_messages=warning' psql -h 127.0.0.1 -U postgres -d postgres -qAtc

IMAGE ?= localhost/duckgres-admin
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE_BASE ?= localhost/duckgres-base:bookworm
IMAGE_ARCHIVE ?= var/image/duckgres-admin-$(VERSION).oci.tar

.PHONY: cli-wheel quickstart-image previous-image help install lock release services provision test lint demo migrate-check clean image image-build image-smoke

help:
	@sed -n '2,14p' Makefile | sed 's/^# \{0,1\}//'

install: $(REQ_STAMP) $(VENV)/bin/duckgres

$(REQ_STAMP): requirements.lock requirements-dev.lock
	@missing=(); \
	command -v psql >/dev/null || missing+=(postgresql-client); \
	command -v redis-server >/dev/null || missing+=(redis-server); \
	if [ $${#missing[@]} -gt 0 ]; then \
	  echo "install: apt-get install $${missing[*]}"; \
	  export DEBIAN_FRONTEND=noninteractive; apt-get update -q >/dev/null; \
	  apt-get install -y -q --no-install-recommends "$${missing[@]}" >/dev/null; \
	fi
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --require-hashes -r requirements-dev.lock
	@rm -f $(VENV)/.installed-*; touch $@

# The project and its command-line client (cli/, a distribution of its own that provides the
# `duckgres` console script, docs/cli.md), editable and without dependencies (requirements.txt
# pins those). Re-run when either pyproject.toml changes.
$(VENV)/bin/duckgres: pyproject.toml cli/pyproject.toml $(REQ_STAMP)
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -e . -e ./cli
	@touch $@

# The locks: every package of requirements.txt (the image) and requirements-dev.txt (tests and
# tools) resolved together, pinned, with the hashes of every file PyPI has for that version.
# pip-tools runs from a venv of its own, so it never changes what it resolves.
PIP_TOOLS := var/pip-tools
PIP_COMPILE := $(PIP_TOOLS)/bin/pip-compile --quiet --generate-hashes --allow-unsafe --strip-extras \
	--no-emit-index-url --no-emit-find-links
lock:
	@test -x $(PIP_TOOLS)/bin/pip-compile || { $(PYTHON) -m venv $(PIP_TOOLS) && \
	  $(PIP_TOOLS)/bin/pip install -q --disable-pip-version-check pip-tools==7.7.0; }
	$(PIP_COMPILE) --output-file requirements.lock requirements.txt
	$(PIP_COMPILE) --output-file requirements-dev.lock requirements-dev.txt
	$(PIP_COMPILE) --output-file k8s/overlays/quickstart/image/requirements.lock \
	  k8s/overlays/quickstart/image/requirements.in

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

# The one-time builds and packages the heavy suites need, cached outside the repository: the
# Kubernetes binaries (≈13 min once per machine), Chromium (browser suite), promtool (alert
# rules); Ceph RGW is installed by `services` in CI mode. Each returns at once when present.
provision:
	.ci/build-kube-apiserver.sh
	.ci/surfaces.sh --install-only
	.ci/promtool.sh
	.ci/pg12.sh

# The full suite, as CI runs it: CI mode unless the caller says CI=false, so services installs
# Ceph and starts the kube-apiserver, and a marked suite that cannot run fails instead of
# skipping. pytest exits 5 when it collected no tests: that is a failure, never a pass.
# Two phases: every suite but the pods one on TEST_WORKERS pytest-xdist workers (each worker is
# its own process, with its own test database and broker db, like concurrent runs), then the
# pods suite alone (one namespace on the one-node cluster; its timings are the janitor's, so it
# runs on an otherwise quiet machine). PYTEST_ARGS given: one plain pytest run with them.
TEST_WORKERS ?= 2
test: export CI ?= true
test: provision install image quickstart-image previous-image services migrate-check
	@run() { rc=0; $(PY) -m pytest "$$@" || rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests: failing" >&2; exit 1; fi; \
	  [ $$rc -eq 0 ] || exit $$rc; }; \
	if [ -n "$(PYTEST_ARGS)" ]; then run $(PYTEST_ARGS); exit 0; fi; \
	run -n $(TEST_WORKERS) --ignore=tests/pods; \
	run tests/pods

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(WITH_TEST_ENV) $(VENV)/bin/mypy .
	$(VENV)/bin/lint-imports
	$(PY) scripts/check_function_length.py
	$(WITH_TEST_ENV) manage.py makemigrations --check --dry-run
	$(WITH_TEST_ENV) manage.py spectacular --fail-on-warn --file /dev/null

demo: install services
	scripts/demo.sh

clean:
	rm -rf var test-artifacts .pytest_cache .mypy_cache .ruff_cache .import_linter_cache

# The image, built from the Containerfile by buildah (no Docker engine, no registry): the base is
# made locally from Debian's packages (.ci/base-image.sh, cached once per machine). Layers are
# cached, so a rebuild after a code change only redoes the project layers. Prints the size.
# Where the machine's pip is told to trust an extra CA (a TLS-inspecting egress proxy), that
# bundle is mounted read-only into the build steps and named by PIP_CERT; it never reaches a
# layer of the final image.
# The build is skipped when the image and its archive were made from exactly this tree (a stamp
# of every tracked file's content, the uncommitted changes and the untracked files): .ci/run
# needs the image for image-smoke and again for `make test`, and a fresh clone builds it once.
image:
	.ci/base-image.sh
	@stamp=var/image/.tree-$$( { git ls-files -s; git diff HEAD; git ls-files -o --exclude-standard -z | xargs -0 -r sha256sum; buildah images -q --no-trunc $(IMAGE_BASE) 2>/dev/null; } | sha256sum | cut -c1-16 ); \
	if [ -f "$$stamp" ] && [ -f $(IMAGE_ARCHIVE) ] && buildah inspect --type image $(IMAGE):$(VERSION) >/dev/null 2>&1; then \
	  echo "image: $(IMAGE):$(VERSION) is up to date with this tree ($$stamp): not rebuilt"; exit 0; fi; \
	$(MAKE) --no-print-directory image-build && rm -f var/image/.tree-* && touch "$$stamp"

image-build:
	@ca=$${PIP_CERT:-$$(python3 -m pip config get global.cert 2>/dev/null || true)}; \
	ca_args=(); if [ -n "$$ca" ] && [ -s "$$ca" ]; then \
	  ca_args=(-v "$$ca:/run/duckgres-build-ca.pem:ro" --build-arg PIP_CERT=/run/duckgres-build-ca.pem); \
	  echo "image: pip trusts the CA bundle $$ca during the build"; fi; \
	set -x; buildah bud --isolation chroot --layers --force-rm --pull=never -f Containerfile "$${ca_args[@]}" \
	  --build-arg BASE=$(IMAGE_BASE) --build-arg VERSION=$(VERSION) \
	  --build-arg REVISION=$$(git rev-parse HEAD 2>/dev/null || echo unknown) \
	  --build-arg SOURCE=$$(git remote get-url origin 2>/dev/null || echo unknown) \
	  --label org.opencontainers.image.base.name=$(IMAGE_BASE) \
	  --label org.opencontainers.image.base.digest=$$(buildah images -q --no-trunc $(IMAGE_BASE)) \
	  -t $(IMAGE):$(VERSION) .
	@mkdir -p $(dir $(IMAGE_ARCHIVE)); rm -f $(IMAGE_ARCHIVE)
	buildah push -q $(IMAGE):$(VERSION) oci-archive:$(IMAGE_ARCHIVE):$(IMAGE):$(VERSION)
	@echo "image: $(IMAGE):$(VERSION) $$(buildah images --format '{{.Size}}' $(IMAGE):$(VERSION)) (uncompressed), archive $(IMAGE_ARCHIVE) $$(du -h $(IMAGE_ARCHIVE) | cut -f1)"

# Smoke tests of the built image (run by .ci/run): user, check --deploy, pg clients, runner exit
# code, static files through gunicorn. The pg-client TLS check dumps a real server, so the local
# services start first (idempotent: a no-op when they already run).
image-smoke: image install services
	.ci/image-smoke.sh $(IMAGE):$(VERSION)

# The quickstart overlay's service image (k8s/overlays/quickstart/image: PostgreSQL 15, Redis, an
# in-memory S3), on the same local base, and its OCI archive for the cluster's runtime. Rebuilt
# only when its Containerfile, its lock or the base change (the hash is the image's label).
QUICKSTART_IMAGE ?= localhost/duckgres-quickstart-deps
QUICKSTART_ARCHIVE ?= var/image/duckgres-quickstart-deps-$(VERSION).oci.tar
quickstart-image:
	.ci/base-image.sh
	@dir=k8s/overlays/quickstart/image; \
	key=$$(cat $$dir/Containerfile $$dir/requirements.lock | sha256sum | cut -c1-16)-$$(buildah images -q $(IMAGE_BASE)); \
	have=$$(buildah inspect --type image --format '{{index .Docker.Config.Labels "duckgres.build-key"}}' $(QUICKSTART_IMAGE):$(VERSION) 2>/dev/null || true); \
	if [ "$$have" = "$$key" ] && [ -s $(QUICKSTART_ARCHIVE) ]; then \
	  echo "quickstart-image: $(QUICKSTART_IMAGE):$(VERSION) is up to date ($$key)"; exit 0; fi; \
	ca=$${PIP_CERT:-$$(python3 -m pip config get global.cert 2>/dev/null || true)}; \
	ca_args=(); if [ -n "$$ca" ] && [ -s "$$ca" ]; then \
	  ca_args=(-v "$$ca:/run/duckgres-build-ca.pem:ro" --env PIP_CERT=/run/duckgres-build-ca.pem); fi; \
	set -x; buildah bud --isolation chroot --layers --force-rm --pull=never "$${ca_args[@]}" \
	  --build-arg BASE=$(IMAGE_BASE) --build-arg VERSION=$(VERSION) --label duckgres.build-key=$$key \
	  -t $(QUICKSTART_IMAGE):$(VERSION) $$dir && \
	mkdir -p $(dir $(QUICKSTART_ARCHIVE)) && rm -f $(QUICKSTART_ARCHIVE) && \
	buildah push -q $(QUICKSTART_IMAGE):$(VERSION) oci-archive:$(QUICKSTART_ARCHIVE):$(QUICKSTART_IMAGE):$(VERSION)

# The image of the release before the newest migration (the parent of the last commit that
# changed duckgres_admin/migrations), for the pods suite's upgrade test (docs/testing.md): built
# from a clone of that commit with its own Makefile, tagged $(PREVIOUS_IMAGE). Skipped when the
# archive of that commit exists.
PREVIOUS_REV ?= $(shell git rev-parse "$$(git log -1 --format=%H -- duckgres_admin/migrations)^")
PREVIOUS_IMAGE ?= localhost/duckgres-admin-previous
PREVIOUS_DIR := var/previous
previous-image:
	@if [ "$$(git rev-parse --is-shallow-repository)" = true ]; then git fetch -q --unshallow; fi
	@test -n "$(PREVIOUS_REV)" || { echo "previous-image: no commit changed a migration"; exit 1; }
	@if [ -s $(PREVIOUS_DIR)/$(PREVIOUS_REV).oci.tar ] && buildah inspect --type image $(PREVIOUS_IMAGE):$(VERSION) >/dev/null 2>&1; then \
	  echo "previous-image: $(PREVIOUS_IMAGE):$(VERSION) of $(PREVIOUS_REV) is built"; exit 0; fi; \
	rm -rf $(PREVIOUS_DIR)/src && mkdir -p $(PREVIOUS_DIR) && \
	git clone -q --shared --no-checkout . $(PREVIOUS_DIR)/src && \
	git -C $(PREVIOUS_DIR)/src checkout -q --detach $(PREVIOUS_REV) && \
	$(MAKE) --no-print-directory -C $(PREVIOUS_DIR)/src image-build IMAGE=$(PREVIOUS_IMAGE) \
	  IMAGE_ARCHIVE=$(CURDIR)/$(PREVIOUS_DIR)/$(PREVIOUS_REV).oci.tar && \
	echo $(PREVIOUS_REV) > $(PREVIOUS_DIR)/REVISION

# The wheel of the command-line client (duckgres-cli, its own distribution under cli/), for
# `pip install` on a workstation (docs/cli.md "Install").
CLI_WHEEL_DIR ?= var/cli
cli-wheel: install
	@mkdir -p $(CLI_WHEEL_DIR)
	$(PY) -m pip wheel -q --disable-pip-version-check --no-deps -w $(CLI_WHEEL_DIR) ./cli
	@rm -rf cli/build cli/*.egg-info

# A release (docs/image.md "Reproducible builds"): the image pushed to RELEASE_DESTINATION (by
# default an OCI archive in RELEASE_DIR; `docker://registry.example/duckgres-admin:$(VERSION)`
# for a registry) with the digest buildah wrote there, the manifests of `kubectl apply -k k8s/`
# with every image pinned to that digest under RELEASE_REPOSITORY, the SBOM of the Python
# packages the image installs (CycloneDX, from requirements.lock), the SBOM of its Debian
# packages (CycloneDX, from dpkg inside the image: scripts/deb_sbom.py), the wheel of the
# command-line client (cli/, docs/cli.md), and their SHA-256 sums.
RELEASE_DIR ?= var/release/$(VERSION)
RELEASE_REPOSITORY ?= $(IMAGE)
RELEASE_DESTINATION ?= oci-archive:$(RELEASE_DIR)/duckgres-admin-$(VERSION).oci.tar:$(RELEASE_REPOSITORY):$(VERSION)
release: image install
	@rm -rf $(RELEASE_DIR) && mkdir -p $(RELEASE_DIR)/kustomize
	buildah push -q --digestfile $(RELEASE_DIR)/image.digest $(IMAGE):$(VERSION) $(RELEASE_DESTINATION)
	@digest=$$(cat $(RELEASE_DIR)/image.digest); \
	top=$$(realpath --relative-to=$(RELEASE_DIR)/kustomize k8s); \
	printf '%s\n' 'apiVersion: kustomize.config.k8s.io/v1beta1' 'kind: Kustomization' \
	  'resources:' "- $$top" 'images:' '- name: duckgres-admin' \
	  "  newName: $(RELEASE_REPOSITORY)" "  digest: $$digest" > $(RELEASE_DIR)/kustomize/kustomization.yaml; \
	kubectl kustomize $(RELEASE_DIR)/kustomize > $(RELEASE_DIR)/duckgres-admin-$(VERSION).yaml; \
	rm -rf $(RELEASE_DIR)/kustomize
	$(VENV)/bin/cyclonedx-py requirements requirements.lock --of JSON --output-reproducible \
	  -o $(RELEASE_DIR)/duckgres-admin-$(VERSION).sbom.cdx.json
	@ctr=$$(buildah from --pull=never -q $(IMAGE):$(VERSION)); \
	buildah run $$ctr -- dpkg-query -W \
	  -f '$${Package}\t$${Version}\t$${Architecture}\t$${db:Status-Abbrev}\n' > $(RELEASE_DIR)/.dpkg; \
	status=$$?; buildah rm $$ctr >/dev/null; test $$status = 0
	$(VENV)/bin/python scripts/deb_sbom.py duckgres-admin:$(VERSION) < $(RELEASE_DIR)/.dpkg \
	  > $(RELEASE_DIR)/duckgres-admin-$(VERSION).debian.cdx.json
	@rm $(RELEASE_DIR)/.dpkg
	$(MAKE) --no-print-directory cli-wheel CLI_WHEEL_DIR=$(RELEASE_DIR)
	@cd $(RELEASE_DIR) && sha256sum $$(ls | grep -v SHA256SUMS) > SHA256SUMS
	@echo "release: $(RELEASE_REPOSITORY)@$$(cat $(RELEASE_DIR)/image.digest) in $(RELEASE_DIR)"
