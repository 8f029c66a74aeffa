"""faust-streaming talks to our Kafka: an app consumes a topic into a table and emits to another topic."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from lorafleet.kafka import make_producer
from tests.integration.kafka_helpers import collect

pytestmark = pytest.mark.integration


async def test_a_faust_app_consumes_into_a_table_and_emits_to_another_topic(services, tmp_path) -> None:
    run = uuid.uuid4().hex[:8]
    source, sink = f"faust-src-{run}", f"faust-sink-{run}"
    env = {
        **os.environ,
        **services.env(),
        "FAUST_TEST_APP_ID": f"lorafleet-test-{run}",
        "FAUST_TEST_SOURCE": source,
        "FAUST_TEST_SINK": sink,
        "FAUST_TEST_DATADIR": str(tmp_path / "faust"),
    }
    log = tmp_path / "faust.log"
    with log.open("wb") as out:  # a file, not a pipe nobody reads: a chatty worker never blocks on it
        worker = subprocess.Popen(
            [sys.executable, "-m", "faust", "-A", "tests.integration.faust_app", "worker", "-l", "warn"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        producer = make_producer(services.settings())
        await producer.start()
        try:
            for i in range(30):
                tenant = ["acme", "globex", "initech"][i % 3]
                await producer.send_and_wait(
                    source, json.dumps({"tenant": tenant, "n": i}).encode(), key=tenant.encode()
                )
        finally:
            await producer.stop()

        def final_counts(records: list) -> dict[str, int]:
            best: dict[str, int] = {}
            for r in records:
                v = json.loads(r.value)
                best[v["tenant"]] = max(best.get(v["tenant"], 0), v["count"])
            return best

        records = await collect(
            services.kafka_bootstrap,
            sink,
            want=lambda rs: (
                worker.poll() is not None or final_counts(rs) == {"acme": 10, "globex": 10, "initech": 10}
            ),
            timeout=120,
        )
        assert worker.poll() is None, log.read_text()[-3000:]
        assert final_counts(records) == {"acme": 10, "globex": 10, "initech": 10}
    finally:
        worker.terminate()
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
