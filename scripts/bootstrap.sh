#!/usr/bin/env bash
# Install what the project needs, idempotently: Debian packages (as root), the Python virtualenv, and the
# Kafka and object-store jars from Maven Central. Re-running is cheap: each step is skipped when done.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-$(command -v python3.11 || echo python3)}
VENV=${VENV:-.venv}
STAMPS=.data/stamps
mkdir -p "$STAMPS"

say() { printf '[bootstrap] %s\n' "$*"; }

apt_install() {
  if [ "$(id -u)" != 0 ]; then
    say "missing Debian packages: $*; install them (sudo apt-get install -y $*) and re-run"; exit 1
  fi
  if [ ! -f "$STAMPS/apt-updated" ]; then apt-get update -qq && touch "$STAMPS/apt-updated"; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# 1. System packages: PostgreSQL server, Java 17+, Maven, Redis, Prometheus and Chromium.
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then say "installing postgresql"; apt_install postgresql; fi
# Debian's package starts a cluster of its own on 5432; this project runs its own cluster and leaves that one be.
command -v java >/dev/null 2>&1 || { say "installing Java 17"; apt_install openjdk-17-jre-headless; }
command -v mvn >/dev/null 2>&1 || { say "installing Maven"; apt_install maven; }
# Redis (the gateways' shared rate limits), Prometheus (the local stack's scraper and promtool) and
# Chromium (the console's browser tests, driven by Playwright; no browser is downloaded).
command -v redis-server >/dev/null 2>&1 || { say "installing redis-server"; apt_install redis-server; }
command -v prometheus >/dev/null 2>&1 || { say "installing prometheus"; apt_install prometheus; }
command -v chromium >/dev/null 2>&1 || { say "installing chromium"; apt_install chromium; }

# 2. Python virtualenv from the hash-pinned locks, with the project installed editable.
PYTHON=$PY VENV=$VENV bash scripts/venv.sh

# 3. Java services' jars, resolved by Maven from Maven Central into infra/<component>/lib.
for component in kafka objectstore; do
  pom="infra/$component/pom.xml"
  want=$(sha256sum "$pom" | cut -c1-16)
  if [ "$(cat "$STAMPS/jars-$component" 2>/dev/null)" != "$want" ] || ! ls "infra/$component/lib/"*.jar >/dev/null 2>&1; then
    say "resolving $component jars from Maven Central"
    rm -rf "infra/$component/lib"
    mvn -q -B -Dstyle.color=never -f "$pom" dependency:copy-dependencies -DoutputDirectory=lib -DincludeScope=runtime
    echo "$want" > "$STAMPS/jars-$component"
  fi
done
say "ok"
