"""Matching: which webhooks receive an event of an account holder (pure, one dict lookup)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from bridge.core.webhook import Webhook


class Subscriptions:
    """Immutable index of the configured webhooks by (account holder, event) and by id."""

    __slots__ = ("_by_id", "_by_key")

    def __init__(self, webhooks: Iterable[Webhook]) -> None:
        by_id: dict[str, Webhook] = {}
        by_key: dict[tuple[str, str], list[Webhook]] = {}
        for webhook in webhooks:
            if webhook.id in by_id:
                raise ValueError(f"duplicate webhook id {webhook.id!r}")
            by_id[webhook.id] = webhook
            if webhook.enabled:
                for event in webhook.events:
                    by_key.setdefault((webhook.account, event), []).append(webhook)
        self._by_id = by_id
        self._by_key = {key: tuple(matches) for key, matches in by_key.items()}

    def match(self, account_holder_id: str, event: str) -> tuple[Webhook, ...]:
        """The enabled webhooks of this account holder that chose this event, in config order."""
        return self._by_key.get((account_holder_id, event), ())

    def get(self, webhook_id: str) -> Webhook | None:
        """The webhook with this id, enabled or not (callers check ``enabled``); None if unknown."""
        return self._by_id.get(webhook_id)

    def __iter__(self) -> Iterator[Webhook]:
        """Every configured webhook, enabled or not, in config order."""
        return iter(self._by_id.values())

    def __len__(self) -> int:
        return len(self._by_id)
