"""Kafka errors that no retry mends: the cluster refused the credentials, the broker's certificate
is not trusted, or the broker refused the client certificate.

librdkafka retries these for ever and reports each attempt to ``error_cb`` only (a metadata
request just times out as "Broker transport failure"). Recognised here, in one place, they end
``bridge run`` at start (:class:`bridge.kafka.consumer.ThreadedConsumer`) and ``bridge check``
(:func:`probe_cluster`) at once, with one line that says which it is.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from bridge.core.errors import BridgeError

PROBE_FIRST_SLICE_S = 0.5
"""``probe_cluster`` waits this long for metadata at first, then twice as long each time,
reading error reports in between (a slow broker still gets time enough to answer)."""

_SUFFIX = re.compile(r"\s*\(after \d+ms in state \w+\)$")
_BROKER = re.compile(r"^(?P<broker>[a-z_]+://\S+?): (?P<detail>.*)$", re.S)
_CERTIFICATE_UNTRUSTED = ("certificate verify failed",)
_CERTIFICATE_REFUSED = ("alert bad certificate", "alert certificate required", "alert unknown ca")


class KafkaSecurityError(BridgeError):
    """The cluster refused the bridge's credentials, or TLS failed on a certificate: retrying
    cannot help. The message is one line that names the failure and the broker."""

    reason = "kafka_security"

    def __init__(self, bootstrap_servers: str, failure: str) -> None:
        self.failure = failure
        super().__init__(f"Kafka at {bootstrap_servers}: {failure}")


def security_failure(error: KafkaError) -> str | None:
    """One line naming the failure when ``error`` (an ``error_cb`` report) is an authentication
    or certificate failure; None for anything else (a broker down, a timeout...)."""
    code = error.code()
    text = str(error.str())
    lowered = text.lower()
    if code == KafkaError._AUTHENTICATION:
        what = "authentication failed (check the SASL mechanism, user name and password)"
    elif code in (KafkaError._SSL, KafkaError._TRANSPORT) and any(
        marker in lowered for marker in _CERTIFICATE_UNTRUSTED
    ):
        what = (
            "certificate verification failed: the broker's certificate is not trusted "
            "(check ssl.ca.location and the broker's host name)"
        )
    elif code in (KafkaError._SSL, KafkaError._TRANSPORT) and any(
        marker in lowered for marker in _CERTIFICATE_REFUSED
    ):
        what = (
            "the broker refused the client certificate (check ssl.certificate.location and "
            "ssl.key.location, and that the broker trusts their CA)"
        )
    else:
        return None
    detail = _SUFFIX.sub("", " ".join(text.split()))
    match = _BROKER.match(detail)
    if match is not None:
        return f"{what}; {match['broker']} said: {match['detail']}"
    return f"{what}; librdkafka said: {detail}"


def watch_security(
    forward: Callable[[KafkaError], None] | None,
) -> tuple[Callable[[KafkaError], None], list[str]]:
    """An ``error_cb`` that notes the first security failure in the returned list (empty until
    then; one entry at most, however long the client runs), then calls ``forward`` (the caller's
    own ``error_cb``) with every error."""
    failures: list[str] = []

    def on_error(error: KafkaError) -> None:
        if not failures:
            reason = security_failure(error)
            if reason is not None:
                failures.append(reason)
        if forward is not None:
            forward(error)

    return on_error, failures


def probe_cluster(settings: dict[str, Any], timeout: float) -> Any:
    """The cluster's metadata (``list_topics``) within ``timeout`` seconds.

    Raises :class:`KafkaSecurityError` as soon as librdkafka reports a security failure (rather
    than a transport failure after the whole timeout), else ``KafkaException`` when the cluster
    does not answer in time.
    """
    on_error, failures = watch_security(settings.get("error_cb"))
    admin = AdminClient({**settings, "error_cb": on_error})
    deadline = time.monotonic() + (timeout if timeout >= 0 else 0.0)  # NaN: one attempt
    wait = PROBE_FIRST_SLICE_S
    while True:
        remaining = deadline - time.monotonic()
        try:
            return admin.list_topics(timeout=max(0.05, min(wait, remaining)))
        except KafkaException:
            wait *= 2
            admin.poll(0)  # serve error_cb: the reports of the attempts so far
            if failures:
                bootstrap = str(settings.get("bootstrap.servers", ""))
                raise KafkaSecurityError(bootstrap, failures[0]) from None
            if time.monotonic() >= deadline:
                raise
