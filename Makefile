# The two set-up commands are `make up` and `make test`; each installs and starts what it needs.
.PHONY: up test down status deps lint check

VENV := .venv
LF := $(VENV)/bin/lorafleet

deps:
	@bash scripts/bootstrap.sh

## Bring up the whole local stack: Kafka, PostgreSQL, S3, migrations, topics, and the project's processes.
up: deps
	@$(LF) demo --prepare-only
	@$(LF) services up
	@$(LF) services status
	@$(LF) demo
	@$(LF) console url

## Run every test against real local services (started here if they are not running).
test: deps
	@$(LF) services up --infra-only
	@$(VENV)/bin/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

## Stop everything this project started.
down:
	@if [ -x $(LF) ]; then $(LF) services down; fi

status:
	@$(LF) services status

lint:
	@$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

## The static checks CI runs before the tests: ruff, ruff's formatter (check only) and mypy (pyproject.toml).
## All three run; the target fails if any of them does.
check: deps
	@status=0; \
	$(VENV)/bin/ruff check . || status=1; \
	$(VENV)/bin/ruff format --check . || status=1; \
	$(VENV)/bin/mypy || status=1; \
	exit $$status
