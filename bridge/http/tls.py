"""TLS contexts for deliveries: one per distinct :class:`~bridge.core.webhook.TlsSettings`, made
once and shared by every connection that uses it (the system store, plus the setting's CA file,
client certificate and least version)."""

from __future__ import annotations

import ssl
from typing import Final

from bridge.core.webhook import TlsSettings

VERSIONS: Final = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}


class TlsError(Exception):
    """A TLS setting whose files cannot be used (the message names the file)."""


def make_context(settings: TlsSettings) -> ssl.SSLContext:
    """A verifying client context for ``settings``; TlsError when a file cannot be used."""
    context = ssl.create_default_context()
    context.minimum_version = VERSIONS[settings.min_version]
    try:
        if settings.ca_file is not None:
            context.load_verify_locations(cafile=settings.ca_file)
        if settings.client_cert_file is not None:
            context.load_cert_chain(settings.client_cert_file, settings.client_key_file)
    except (OSError, ssl.SSLError, ValueError) as exc:
        files = ", ".join(
            path
            for path in (settings.ca_file, settings.client_cert_file, settings.client_key_file)
            if path
        )
        raise TlsError(f"cannot use the TLS files {files}: {exc}") from None
    return context


class TlsContexts:
    """The contexts in use, made on first use of each setting (a failure is remembered too)."""

    def __init__(self) -> None:
        self._contexts: dict[TlsSettings, ssl.SSLContext | TlsError] = {}

    def get(self, settings: TlsSettings) -> ssl.SSLContext:
        """The context of ``settings``; TlsError when its files cannot be used."""
        context = self._contexts.get(settings)
        if context is None:
            try:
                context = make_context(settings)
            except TlsError as exc:
                context = exc
            self._contexts[settings] = context
        if isinstance(context, TlsError):
            raise context
        return context
