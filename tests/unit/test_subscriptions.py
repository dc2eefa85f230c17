"""Matching: an event reaches exactly the enabled webhooks of its account that chose it."""

from __future__ import annotations

import pytest

from bridge.core.subscriptions import Subscriptions
from bridge.core.webhook import Secret, Webhook

SUCCESS, FAILED = "transaction.success", "transaction.failed"


def webhook(webhook_id: str, account: str, *events: str, enabled: bool = True) -> Webhook:
    return Webhook(
        id=webhook_id,
        account=account,
        url=f"https://{webhook_id}.example/hook",
        events=frozenset(events),
        secret=Secret(b"s"),
        enabled=enabled,
    )


SHOP = webhook("shop", "acct_1", SUCCESS, FAILED)
ALERTS = webhook("alerts", "acct_1", FAILED)
PAUSED = webhook("paused", "acct_1", SUCCESS, FAILED, enabled=False)
OTHER = webhook("other", "acct_2", SUCCESS)
SUBSCRIPTIONS = Subscriptions([SHOP, ALERTS, PAUSED, OTHER])


def test_each_webhook_of_the_account_that_chose_the_event_matches_in_config_order() -> None:
    assert SUBSCRIPTIONS.match("acct_1", FAILED) == (SHOP, ALERTS)
    assert SUBSCRIPTIONS.match("acct_1", SUCCESS) == (SHOP,)
    assert SUBSCRIPTIONS.match("acct_2", SUCCESS) == (OTHER,)


def test_nothing_matches_other_accounts_or_unchosen_events() -> None:
    assert SUBSCRIPTIONS.match("acct_2", FAILED) == ()
    assert SUBSCRIPTIONS.match("acct_unknown", SUCCESS) == ()
    assert SUBSCRIPTIONS.match("acct_1", "transaction.refund") == ()


def test_disabled_webhooks_never_match_but_can_be_looked_up() -> None:
    assert PAUSED not in SUBSCRIPTIONS.match("acct_1", SUCCESS)
    assert SUBSCRIPTIONS.get("paused") is PAUSED
    assert SUBSCRIPTIONS.get("shop") is SHOP
    assert SUBSCRIPTIONS.get("missing") is None


def test_iteration_lists_every_webhook() -> None:
    assert list(SUBSCRIPTIONS) == [SHOP, ALERTS, PAUSED, OTHER]
    assert len(SUBSCRIPTIONS) == 4
    assert len(Subscriptions([])) == 0


def test_duplicate_ids_are_refused() -> None:
    with pytest.raises(ValueError, match="duplicate webhook id 'shop'"):
        Subscriptions([SHOP, webhook("shop", "acct_9", SUCCESS)])
