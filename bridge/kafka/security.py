"""Kafka errors that no retry mends: the cluster refused the credentials, the broker's certificate
is not trusted, or the broker refused the client certificate; or the producer had a fatal error
(the cluster refused it an idempotent producer id: the principal may not write).

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


CREDENTIALS_HINT = (
    "check kafka.security_protocol, sasl_* and the ssl.* kafka.properties "
    "(or KAFKA_SECURITY_PROTOCOL, KAFKA_SASL_*)"
)
ACL_HINT = (
    "the bridge's principal needs Read and Write on its topics (one PREFIXED ACL on the source "
    "topic's name covers them all) and Read on its consumer group: see ACLs in the README"
)
RESTART_HINT = (
    "start the bridge again (Kubernetes does): it gets a new producer, and what it had not "
    "committed is delivered again"
)
_NOT_AUTHORIZED = (
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
)


class KafkaFatalError(BridgeError):
    """Kafka refused the bridge something that no retry mends. The message is one line that
    names the failure and the cluster; ``hint`` says what to check."""

    reason = "kafka_fatal"

    def __init__(self, bootstrap_servers: str, failure: str, hint: str) -> None:
        self.failure = failure
        self.hint = hint
        super().__init__(f"Kafka at {bootstrap_servers}: {failure}")


class KafkaSecurityError(KafkaFatalError):
    """The cluster refused the bridge's credentials, or TLS failed on a certificate."""

    reason = "kafka_security"

    def __init__(self, bootstrap_servers: str, failure: str) -> None:
        super().__init__(bootstrap_servers, failure, CREDENTIALS_HINT)


def producer_failure(bootstrap_servers: str, error: KafkaError) -> KafkaFatalError:
    """The error that ends the bridge when its producer had the fatal error ``error``: most
    often the cluster refusing the idempotent producer because the principal may not write."""
    detail = _SUFFIX.sub("", " ".join(str(error.str()).split()))
    if error.code() in _NOT_AUTHORIZED:
        failure = f"not authorized to write the bridge's topics; librdkafka said: {detail}"
        return KafkaFatalError(bootstrap_servers, failure, ACL_HINT)
    failure = f"the producer failed for good; librdkafka said: {detail}"
    return KafkaFatalError(bootstrap_servers, failure, RESTART_HINT)


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
