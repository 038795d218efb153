# efficiency: `make demo` brings the whole service up with demo data; `make test` runs the tests.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
VAR ?= var
WEB_ADDR ?= 127.0.0.1:8000
# Where the app finds its services. The defaults are what `.ci/services` starts; a second demo next to a
# running one (or next to services other work uses) takes its own database, Redis DB, Prometheus and state:
#   make demo VAR=var/demo2 DEMO_DB=efficiency_demo2 REDIS_DB=2 PROM_PORT=59190 WEB_ADDR=127.0.0.1:8002
# PostgreSQL and Redis already answering on their ports are used as they are (nothing is restarted).
DEMO_DB ?= efficiency
REDIS_DB ?= 0
PROM_PORT ?= 59090
export DATABASE_URL ?= postgres://efficiency:efficiency@127.0.0.1:55432/$(DEMO_DB)
export REDIS_URL ?= redis://127.0.0.1:56379/$(REDIS_DB)
export PROMETHEUS_URL ?= http://127.0.0.1:$(PROM_PORT)
export STATIC_ROOT ?= $(abspath $(VAR))/staticfiles
export MEDIA_ROOT ?= $(abspath $(VAR))/media
SERVICES = EFFICIENCY_VAR="$(abspath $(VAR))" PG_DB="$(DEMO_DB)" PROM_PORT="$(PROM_PORT)" \
	WEB_PORT="$(lastword $(subst :, ,$(WEB_ADDR)))" .ci/services
SUDO := $(shell [ "$$(id -u)" -eq 0 ] || echo sudo)

.PHONY: demo test stop stop-app services venv migrate lint typecheck format bench help plotly-bundle

help:
	@echo "make demo    install, start Postgres/Redis/Prometheus, load demo data, run web + worker + beat"
	@echo "make test    run the test suite (starts the services it needs)"
	@echo "make stop    stop everything make demo started"
	@echo "make stop-app  stop only the web server, worker and beat make demo started (services keep running)"
	@echo "make lint    ruff check and format check"
	@echo "make typecheck  mypy (django-stubs, DRF stubs) on jobs/ and efficiency/"
	@echo "make plotly-bundle  rebuild static/vendor/plotly.min.js (partial plotly.js; needs node/npm)"

$(PY):
	@$(PYTHON) -c "import ensurepip, venv" 2>/dev/null || { $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv python3-dev >/dev/null; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(PY)
	$(PY) -m pip install -q -e ".[dev]"
	@touch $@

venv: $(VENV)/.installed

services:
	@$(SERVICES) start

migrate: venv services
	DEBUG=true $(PY) manage.py migrate --noinput

export DEMO_STATE_DIR ?= $(CURDIR)/$(VAR)/demo

# The demo runs like a deployment (DEBUG=false: plain 404/500 pages, static files compressed and cached
# forever under hashed names by WhiteNoise) with the settings a laptop needs: plain HTTP on loopback (no SSL
# redirect, HSTS or HTTPS-only cookies), /metrics without a token (loopback only) and a private secret key
# generated once into var/.
DEMO_SECRET_FILE := $(VAR)/demo-secret-key
DEMO_ENV = DEBUG=false SECRET_KEY="$$(cat $(DEMO_SECRET_FILE))" SECURE_SSL_REDIRECT=false \
	SESSION_COOKIE_SECURE=false CSRF_COOKIE_SECURE=false SECURE_HSTS_SECONDS=0 METRICS_PUBLIC=true

$(DEMO_SECRET_FILE):
	@mkdir -p $(VAR)
	@umask 077 && $(PYTHON) -c "import secrets; print(secrets.token_urlsafe(50))" > $@

demo: migrate $(DEMO_SECRET_FILE)
	DEBUG=true $(PY) manage.py load_demo --tsdb $(VAR)/prometheus/data
	@$(SERVICES) restart-prometheus
	$(DEMO_ENV) $(PY) manage.py collectstatic --noinput -v0
	@mkdir -p $(VAR)/run
	@$(MAKE) --no-print-directory _stop_app
	$(DEMO_ENV) $(VENV)/bin/gunicorn --config gunicorn.conf.py --bind $(WEB_ADDR) --workers 2 --daemon \
	  --pid $(VAR)/run/web.pid --access-logfile $(VAR)/run/web-access.log --error-logfile $(VAR)/run/web.log
	@# The web server serves the simulated exporter: --finish waits until Prometheus has scraped the running
	@# jobs from it, so the first poll reads current data (no "Ingestion stale" alert at start, #28 item 3).
	@for i in $$(seq 60); do curl -fsS -o /dev/null http://$(WEB_ADDR)/login/ && break; sleep 0.5; done
	DEBUG=true $(PY) manage.py load_demo --finish
	$(DEMO_ENV) $(VENV)/bin/celery -A efficiency worker --loglevel INFO --concurrency 2 --detach \
	  --pidfile $(VAR)/run/worker.pid --logfile $(VAR)/run/worker.log
	$(DEMO_ENV) $(VENV)/bin/celery -A efficiency beat --loglevel INFO --detach \
	  --schedule $(VAR)/run/beat-schedule --pidfile $(VAR)/run/beat.pid --logfile $(VAR)/run/beat.log
	@for i in $$(seq 60); do curl -fsS -o /dev/null http://$(WEB_ADDR)/login/ && break; sleep 0.5; done
	@echo
	@echo "  efficiency is running:  http://$(WEB_ADDR)/"
	@echo "  log in as:              demo / demo-password   (staff; admin at /admin/)"
	@echo "  health:                 http://$(WEB_ADDR)/healthz"
	@echo "  stop with:              make stop-app (web, worker, beat; also make stop: the services too)"

_stop_app:
	@for p in web worker beat; do \
	  if [ -f $(VAR)/run/$$p.pid ]; then kill $$(cat $(VAR)/run/$$p.pid) 2>/dev/null || true; rm -f $(VAR)/run/$$p.pid; fi; \
	done

# Only the web server, worker and beat of this VAR (not the services).
stop-app: _stop_app

stop: _stop_app
	@$(SERVICES) stop

test: venv
	@WITH_BROWSER=1 .ci/services start
	$(VENV)/bin/pytest $(PYTEST_ARGS)

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: venv
	$(VENV)/bin/mypy

format: venv
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

bench: venv services
	@for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

# static/vendor/plotly.min.js: plotly.js with only the trace types jobs/charts/ draws (static/vendor/README.md).
plotly-bundle:
	static/vendor/plotly-bundle/build.sh
