"""Matching: which webhooks receive an event of an account holder (pure, one dict lookup)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from bridge.core.webhook import Webhook

_Key = tuple[str, str]


class Subscriptions:
    """Immutable index of the configured webhooks by (account holder, event) and by id."""

    __slots__ = ("_by_id", "_by_key")

    def __init__(self, webhooks: Iterable[Webhook]) -> None:
        by_id: dict[str, Webhook] = {}
        by_key: dict[_Key, list[Webhook]] = {}
        for webhook in webhooks:
            if webhook.id in by_id:
                raise ValueError(f"duplicate webhook id {webhook.id!r}")
            by_id[webhook.id] = webhook
            if webhook.enabled:
                for event in webhook.events:
                    by_key.setdefault((webhook.account, event), []).append(webhook)
        self._by_id = by_id
        self._by_key = {key: tuple(matches) for key, matches in by_key.items()}

    def updated(
        self, webhooks: Sequence[Webhook], changed: Sequence[Webhook] | None = None
    ) -> Subscriptions:
        """The index of ``webhooks`` (the same as ``Subscriptions(webhooks)``), built from this
        one: only the (account holder, event) entries of webhooks added, removed or changed are
        rebuilt, a webhook being unchanged when it is the very object indexed here. A reload
        that keeps most :class:`Webhook` objects (see :mod:`bridge.config.reload`) costs a few
        dictionary passes instead of a rebuild (about 50 ms at 10,000 webhooks).

        ``changed``, when the caller knows it, lists the webhooks of ``webhooks`` that are not
        the objects indexed here, in their order, every other one being the very object indexed
        here, in the same order, none removed (what a reload that kept the others hands over).
        Then no pass over every webhook is made: at 10,000 webhooks each pass took about a
        millisecond of the event loop, the index about 5 ms."""
        old = self._by_id
        if changed is not None:
            by_id = dict(old)
            by_id.update((webhook.id, webhook) for webhook in changed)
            if len(by_id) != len(webhooks):  # (not what was said: an id twice, or one removed)
                return self.updated(webhooks)
            gone = [old[webhook.id] for webhook in changed if webhook.id in old]
        else:
            by_id = {webhook.id: webhook for webhook in webhooks}
            if len(by_id) != len(webhooks):
                return Subscriptions(webhooks)  # (it names the duplicate id)
            changed = [webhook for webhook in webhooks if old.get(webhook.id) is not webhook]
            gone = [webhook for key, webhook in old.items() if by_id.get(key) is not webhook]
            if self._reordered(by_id):
                return Subscriptions(webhooks)
        if len(changed) + len(gone) > len(webhooks) // 4:
            return Subscriptions(webhooks)
        fresh: dict[_Key, list[Webhook]] = {}
        for webhook in changed:
            if webhook.enabled:
                for event in webhook.events:
                    fresh.setdefault((webhook.account, event), []).append(webhook)
        touched = {(w.account, event) for w in (*changed, *gone) for event in w.events}
        by_key = dict(self._by_key)
        position: dict[str, int] | None = None
        for key in touched:
            kept = [w for w in self._by_key.get(key, ()) if by_id.get(w.id) is w]
            matches = kept + fresh.get(key, [])
            if not matches:
                by_key.pop(key, None)
                continue
            if len(matches) > 1:
                if position is None:
                    position = {webhook_id: n for n, webhook_id in enumerate(by_id)}
                matches.sort(key=lambda webhook: position[webhook.id])
            by_key[key] = tuple(matches)
        index = Subscriptions(())
        index._by_id = by_id
        index._by_key = by_key
        return index

    def _reordered(self, by_id: dict[str, Webhook]) -> bool:
        """Whether the webhooks both here and in ``by_id`` come in another order there (then
        the entries that did not change would be out of order: the index is rebuilt)."""
        old = self._by_id
        if by_id.keys() == old.keys():  # the same ids (the usual reload): compared in C
            return list(by_id) != list(old)
        return [key for key in old if key in by_id] != [key for key in by_id if key in old]

    def match(self, account_holder_id: str, event: str) -> tuple[Webhook, ...]:
        """The enabled webhooks of this account holder that chose this event, in config order."""
        return self._by_key.get((account_holder_id, event), ())

    def get(self, webhook_id: str) -> Webhook | None:
        """The webhook with this id, enabled or not (callers check ``enabled``); None if unknown."""
        return self._by_id.get(webhook_id)

    def judge(self, webhook_id: str, account: str, event: str) -> Webhook | str:
        """The webhook a delivery of ``account``'s ``event`` to ``webhook_id`` goes to now, or
        why it goes nowhere (a dead-letter reason): the id is no longer configured, names
        another account holder's webhook (``account`` "" for a delivery written before it was
        carried: not checked), is disabled or no longer chooses the event. The one judgement
        of a delivery against the configuration in force, when it comes back from a bridge
        topic and again when its request starts."""
        webhook = self._by_id.get(webhook_id)
        if webhook is None:
            return "webhook_removed"
        if account and webhook.account != account:
            return "webhook_reassigned"
        if not webhook.enabled:
            return "webhook_disabled"
        if event not in webhook.events:
            return "event_unsubscribed"
        return webhook

    def __iter__(self) -> Iterator[Webhook]:
        """Every configured webhook, enabled or not, in config order."""
        return iter(self._by_id.values())

    def __len__(self) -> int:
        return len(self._by_id)
