"""The bridge's job done with Quix Streams, as its documentation shows a processing step: a
StreamingDataFrame over the source topic, Avro values read by Quix's own ``AvroDeserializer``, and
one function applied to each record that maps it to the notification, signs it (the bridge's own
``bridge.core`` mapping and signing, so bodies and headers are the same bytes) and POSTs it with
an ``httpx.Client``, one record at a time.

Retries are what such an application does by hand: up to ``--attempts`` requests per record, in
memory, waiting ``--backoff`` seconds between them, the partition held meanwhile; then the record
is written to ``--dlq`` (a plain producer). Quix commits every second (``commit_interval``).

It runs in its own virtual environment (``.cache/peers/quix``; Quix Streams pins
confluent-kafka below the bridge's version), with the repository on ``PYTHONPATH`` for
``bridge.core``; ``devtools.bench_peers`` starts it. It stops after ``--records`` records and
prints one JSON line: records processed, delivered, dead-lettered, and its CPU seconds.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from confluent_kafka import Producer
from quixstreams import Application
from quixstreams.models.serializers.avro import AvroDeserializer

from bridge.core.mapping import to_notification
from bridge.core.signing import build_headers, message_id
from bridge.core.webhook import Secret, Webhook


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--dlq", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--schema", type=Path, required=True)
    parser.add_argument("--records", type=int, required=True)
    parser.add_argument("--hooks", required=True, help="JSON: {account: url}")
    parser.add_argument("--attempts", type=int, default=3)
    parser.add_argument("--backoff", type=float, default=0.1)
    args = parser.parse_args(argv)

    schema = json.loads(args.schema.read_text())
    hooks = {
        account: Webhook(f"quix-{account}", account, url, frozenset(), Secret(b"bench-secret"))
        for account, url in json.loads(args.hooks).items()
    }
    app = Application(
        broker_address=args.bootstrap,
        consumer_group=args.group,
        auto_offset_reset="earliest",
        commit_interval=1.0,
        auto_create_topics=False,
        use_changelog_topics=False,
    )
    topic = app.topic(args.topic, value_deserializer=AvroDeserializer(schema=schema))
    dead_letters = Producer({"bootstrap.servers": args.bootstrap, "linger.ms": 5})
    client = httpx.Client(timeout=10.0)
    counts = {"records": 0, "delivered": 0, "dead_lettered": 0}

    def deliver(record: dict[str, Any]) -> None:
        notification = to_notification(record)
        hook = hooks[str(record["accountHolderId"])]
        msg_id = message_id(notification.transaction_id, notification.event, hook.id)
        for attempt in range(1, args.attempts + 1):
            headers = build_headers(hook, msg_id, int(time.time()), notification.body)
            try:
                status = client.post(hook.url, content=notification.body, headers=headers)
                received = 200 <= status.status_code < 300
            except httpx.HTTPError:
                received = False
            if received:
                counts["delivered"] += 1
                break
            if attempt < args.attempts:
                time.sleep(args.backoff * attempt)
        else:
            dead_letters.produce(args.dlq, notification.body)
            dead_letters.poll(0)
            counts["dead_lettered"] += 1
        counts["records"] += 1
        if counts["records"] >= args.records:
            app.stop()

    app.dataframe(topic).update(deliver)
    app.run()
    dead_letters.flush(30)
    client.close()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({**counts, "cpu_s": round(usage.ru_utime + usage.ru_stime, 2)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
