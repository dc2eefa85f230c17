"""A reload builds again only the webhooks whose YAML changed (``loader.Reuse``), and composes
again only the webhooks whose text it has not met (``Reuse.texts``); the invariant: a load that
keeps webhooks reports exactly the problems a full load reports and, where it keeps a webhook,
the one in force is equal to what the full load builds. Checked on edits of every kind (a field,
key order, an anchored list aliased elsewhere, the delivery defaults, the environment, a secret
written into another webhook's shown field, a secret file's content, duplicates, removals and
moves; for the texts, edits that make a webhook's text read otherwise than where it was met: a
quote or a flow list left open, a webhook's text inside a quoted scalar, directives, document
markers, comments and sections around the list, its indentation, line breaks, tabs), one at a
time and at random."""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from bridge.config import loader
from bridge.config.digest import webhook_digest
from bridge.config.loader import Reuse, load_config
from bridge.core.errors import ConfigError
from bridge.core.settings import Config
from bridge.core.webhook import Webhook
from devtools.bench_config import SECRET_ENV, SECRET_VALUE, config_text
from tests.yaml_nodes import yaml_nodes

KEY = b"k" * 32
ENVIRON = {SECRET_ENV: SECRET_VALUE, "OTHER_SECRET": "https://hooks.shop-1.net/webhooks/7"}

Edit = Callable[[str, dict[str, str], Path], str]


def base_text(secret_file: Path) -> str:
    """A generated file (quoted and plain webhooks, ${VAR} secrets, an aliased events list) and
    one webhook whose secret is a file."""
    secret_file.write_text("a-secret-from-a-file-0123456789\n")
    return config_text(40) + (
        "  - id: wh-file\n    account: acct_file\n    url: https://file.example/hook\n"
        f"    events: [transaction.failed]\n    secret_file: {secret_file}\n"
    )


def outcome(load: Callable[[], Config]) -> Config | list[str]:
    """The configuration loaded, or the problems that refused it."""
    try:
        return load()
    except ConfigError as exc:
        return exc.problems


def digests(webhooks: list[Webhook]) -> list[tuple[str, bytes]]:
    return [(w.id, webhook_digest(w, KEY)) for w in webhooks]


TEXT_LOADS: list[bool] = []
"""Whether each load given the texts met before kept webhooks from their text alone."""


def check_reuse(
    before: str,
    after: str,
    environ: Mapping[str, str],
    tmp_path: Path,
    environ_before: Mapping[str, str] = ENVIRON,
    edit: Callable[[], object] = lambda: None,
) -> int:
    """Load ``before`` (in force, with ``environ_before``), then, once ``edit()`` has changed
    what else the load reads, ``after`` fully, with Reuse, and with Reuse and the texts met;
    assert they agree and return how many webhooks were kept."""
    path = tmp_path / "bridge.yaml"
    path.write_text(before)
    first = Reuse(KEY, {})
    in_force = {w.id: w for w in load_config(path, environ_before, first).webhooks}
    edit()
    assert first.order == list(in_force), "nothing kept without digests"
    path.write_text(after)
    full = outcome(lambda: load_config(path, environ))
    counts = []
    for texts in ({}, first.texts_read):
        reuse = Reuse(KEY, first.read, texts, first.secrets_read, first.context_read)
        reused = outcome(lambda: load_config(path, environ, reuse))  # noqa: B023 (called here)
        if texts:
            TEXT_LOADS.append(reuse.uncomposed > 0)
        if not isinstance(full, Config):
            assert reused == full
            counts.append(0)
            continue
        assert isinstance(reused, Config), reused
        built = {w.id: w for w in reused.webhooks}
        kept = [i for i in reuse.order if i not in built]
        assembled = [built.get(i) or in_force[i] for i in reuse.order]
        assert digests(assembled) == digests(list(full.webhooks))
        counts.append(len(kept))
    assert counts[0] == counts[1], "the texts change what is kept"
    return counts[0]


def quote_swallows(text: str) -> str:
    """``text`` with wh-000004's secret (its last line) left unclosed, and the text of
    wh-000003 (a webhook met before) right after it, then the list as it was: a segment equal
    to one met before, inside a quoted scalar."""
    start, end = hook_block(text, "wh-000004")
    block = text[slice(*hook_block(text, "wh-000003"))]
    opened = text[start:end].replace('"OVJvBe_9QeIdgxzWVwwcnmZjYGlaKHRV"', '"OVJvBe_9QeId')
    return text[:start] + opened + block + text[end:]


def inside_quoted_secret(text: str) -> str:
    """An entry-looking line inside a quoted secret that is valid YAML (a multi-line scalar):
    the file is accepted, with one webhook fewer than its lines suggest."""
    return text.replace(
        'secret: "OVJvBe_9QeIdgxzWVwwcnmZjYGlaKHRV"',
        'secret: "OVJvBe_9QeIdgxzWVwwcnmZjYGlaKHRV\n  - id: wh-000099\n    tail"',
        1,
    )


def list_at_first_column(text: str) -> str:
    head, _, tail = text.partition("webhooks:\n")
    return head + "webhooks:\n" + re.sub(r"^  ", "", tail, flags=re.M)


LOGGING = 'logging:\n  format: "json"\n  level: "info"\n'


def nth(text: str, old: str, new: str, n: int = 0) -> str:
    """``text`` with the ``n``-th occurrence of ``old`` replaced."""
    at = -1
    for _ in range(n + 1):
        at = text.index(old, at + 1)
    return text[:at] + new + text[at + len(old) :]


def hook_block(text: str, hook_id: str) -> tuple[int, int]:
    """Where the list item of webhook ``hook_id`` (quoted or not) is in ``text``; ValueError
    when it is not there (an earlier edit removed it)."""
    found = re.search(rf'^  - id: "?{re.escape(hook_id)}"?\n', text, re.M)
    if found is None:
        raise ValueError(hook_id)
    end = text.find("\n  - id:", found.start() + 1)
    return found.start(), len(text) if end < 0 else end + 1


EDITS: dict[str, Edit] = {
    "nothing": lambda t, e, d: t,
    "one timeout": lambda t, e, d: nth(t, "timeout_seconds: 2.5", "timeout_seconds: 7.5"),
    "key order": lambda t, e, d: t.replace(
        "  - id: wh-000001\n    account: acct_00000\n"
        "    url: https://hooks.shop-0.com:8444/webhooks/1?source=bridge\n",
        "  - url: https://hooks.shop-0.com:8444/webhooks/1?source=bridge\n"
        "    account: acct_00000\n    id: wh-000001\n",
        1,
    ),
    "anchored list": lambda t, e, d: t.replace(
        "&both\n      - transaction.success\n      - transaction.failed",
        "&both\n      - transaction.failed",
    ),
    "delivery default": lambda t, e, d: t.replace(
        "  timeout_seconds: 10.0\n", "  timeout_seconds: 11.0\n", 1
    ),
    "environment": lambda t, e, d: (e.update({SECRET_ENV: "another-value-from-env"}), t)[1],
    "secret shown elsewhere": lambda t, e, d: nth(
        t, "secret: QHAjC0KEoLn2IdsMHOBU-evsslXJUB5p", "secret: https://hooks.shop-1.net/webhooks/5"
    ),
    "env secret shown later": lambda t, e, d: nth(
        t, "secret: QHAjC0KEoLn2IdsMHOBU-evsslXJUB5p", "secret: ${OTHER_SECRET}"
    ),
    "env secret shown by an edit": lambda t, e, d: nth(
        t, "/webhooks/30?source=bridge", f"/webhooks/30/{SECRET_VALUE}"
    ),
    "part of a secret shown elsewhere": lambda t, e, d: nth(
        t, "secret: QHAjC0KEoLn2IdsMHOBU-evsslXJUB5p", "secret: a-hooks.shop-1.net/webhooks/5-b"
    ),
    "part of an env secret shown by an edit": lambda t, e, d: nth(
        t, "/webhooks/30?source=bridge", f"/webhooks/30/{SECRET_VALUE[3:19]}"
    ),
    "secret file": lambda t, e, d: ((d / "hook.secret").write_text("changed-secret-0123456789"), t)[
        1
    ],
    "duplicate id": lambda t, e, d: t + t[slice(*hook_block(t, "wh-000003"))],
    "removed": lambda t, e, d: (
        t[: hook_block(t, "wh-000004")[0]] + t[hook_block(t, "wh-000004")[1] :]
    ),
    "moved": lambda t, e, d: (
        t[: hook_block(t, "wh-000004")[0]]
        + t[hook_block(t, "wh-000004")[1] :]
        + t[slice(*hook_block(t, "wh-000004"))]
    ),
    "key given twice, a list and a scalar": lambda t, e, d: t.replace(
        "  - id: wh-000003\n", "  - id: wh-000003\n    events: !!seq x\n", 1
    ),
    "id through a merge key": lambda t, e, d: t.replace(
        "  - id: wh-000005\n",
        "  - <<: {id: wh-000007}\n    account: acct_m\n    url: https://m.example/x\n"
        "    events: [transaction.failed]\n    secret: secret-m-0123456789\n"
        "  - id: wh-000005\n",
        1,
    ),
    "added": lambda t, e, d: (
        t + "  - id: wh-new\n    account: acct_new\n    url: https://new.example/h\n"
        "    events: [transaction.failed]\n    secret: a-new-secret-0123456789\n"
    ),
    "quote left open": lambda t, e, d: nth(t, 'account: "acct_00000"', 'account: "acct_00000', 1),
    "flow list left open": lambda t, e, d: nth(
        t, 'events: ["transaction.failed"]', 'events: ["transaction.failed"'
    ),
    "a met text inside a quoted scalar": lambda t, e, d: quote_swallows(t),
    "an entry line inside a quoted secret": lambda t, e, d: inside_quoted_secret(t),
    "directive": lambda t, e, d: "%YAML 1.1\n---\n" + t,
    "tag directive": lambda t, e, d: "%TAG !! tag:example.com,2000:\n---\n" + t,
    "second document": lambda t, e, d: t + "---\nwebhooks: []\n",
    "comment at the first column": lambda t, e, d: nth(
        t, "  - id: wh-000003\n", "# c\n  - id: wh-000003\n"
    ),
    "section after the list": lambda t, e, d: t.replace(LOGGING, "") + LOGGING,
    "list at the first column": lambda t, e, d: list_at_first_column(t),
    "one webhook indented further": lambda t, e, d: t.replace(
        "  - id: wh-000003\n    account: acct_00000\n",
        "   - id: wh-000003\n     account: acct_00000\n",
    ),
    "line breaks": lambda t, e, d: t.replace("\n", "\r\n"),
    "tab": lambda t, e, d: nth(t, "    account: acct_00000\n", "    account: acct_00000\t# x\n", 2),
    "block scalar": lambda t, e, d: nth(
        t,
        "secret: QHAjC0KEoLn2IdsMHOBU-evsslXJUB5p",
        "secret: |\n      QHAjC0KEoLn2IdsMHOBU-evsslXJUB5p",
    ),
    "webhooks key written twice": lambda t, e, d: t + "webhooks: []\n",
}


@pytest.mark.parametrize("name", list(EDITS))
def test_an_edit_is_read_alike_with_and_without_reuse(tmp_path: Path, name: str) -> None:
    before = base_text(tmp_path / "hook.secret")
    environ = dict(ENVIRON)
    after = EDITS[name](before, environ, tmp_path)
    if name not in ("nothing", "environment", "secret file"):
        assert after != before, "the edit changed the file"
    kept = check_reuse(before, after, environ, tmp_path)
    if name in KEPT:
        assert kept == KEPT[name]


KEPT = {
    "part of a secret shown elsewhere": 0,  # refused (16 characters of a secret in a row)
    "part of an env secret shown by an edit": 0,
    "nothing": 40,
    "one timeout": 39,
    "key order": 40,
    "added": 40,
    "secret file": 40,
    "directive": 40,
    "section after the list": 40,
    "comment at the first column": 40,
}
"""How many of the 40 generated webhooks an edit leaves kept (the one naming a file never is)."""


@pytest.mark.parametrize("name", ["nothing", "one timeout", "added", "section after the list"])
def test_an_edit_leaving_the_texts_alike_composes_only_what_changed(
    tmp_path: Path, name: str
) -> None:
    """The texts met before are used (the load does not start again in full), and most of the
    webhooks' texts were noted: the generated ones but those anchored or aliased and the one
    naming a file."""
    before = base_text(tmp_path / "hook.secret")
    path = tmp_path / "bridge.yaml"
    path.write_text(before)
    first = Reuse(KEY, {})
    load_config(path, ENVIRON, first)
    anchored = before.count("&both") + before.count("*both")
    assert len(first.texts_read) == 40 - anchored
    del TEXT_LOADS[:]
    check_reuse(before, EDITS[name](before, dict(ENVIRON), tmp_path), ENVIRON, tmp_path)
    assert TEXT_LOADS == [True]


def test_hostile_texts_fall_back_to_a_full_load(tmp_path: Path) -> None:
    """Each edit that makes a text met before read otherwise than where it was met makes the
    load start again in full (and, by check_reuse, agree with a full load)."""
    hostile = (
        "quote left open",
        "flow list left open",
        "a met text inside a quoted scalar",
        "an entry line inside a quoted secret",
    )
    for name in hostile:
        before = base_text(tmp_path / "hook.secret")
        del TEXT_LOADS[:]
        check_reuse(before, EDITS[name](before, dict(ENVIRON), tmp_path), ENVIRON, tmp_path)
        assert TEXT_LOADS == [False], name


def test_random_edits_are_read_alike_with_and_without_reuse(tmp_path: Path) -> None:
    rng = random.Random(7)
    names = list(EDITS)
    del TEXT_LOADS[:]
    for _ in range(80):
        before = base_text(tmp_path / "hook.secret")
        environ = dict(ENVIRON)
        after = before
        for name in rng.sample(names, rng.randint(1, 3)):
            try:
                after = EDITS[name](after, environ, tmp_path)
            except ValueError:  # an edit whose target an earlier edit removed
                continue
        check_reuse(before, after, environ, tmp_path)
    assert 10 < sum(TEXT_LOADS) < len(TEXT_LOADS), "the texts were used, and refused, at times"


def test_webhooks_naming_files_or_merging_are_never_kept(tmp_path: Path) -> None:
    secret = tmp_path / "hook.secret"
    text = base_text(secret) + (
        "  - <<: {account: acct_merged, events: [transaction.failed]}\n"
        "    id: wh-merged\n    url: https://merged.example/h\n"
        "    secret: merged-secret-0123456789\n"
    )
    path = tmp_path / "bridge.yaml"
    path.write_text(text)
    first = Reuse(KEY, {})
    load_config(path, ENVIRON, first)
    assert "wh-file" not in first.read and "wh-merged" not in first.read
    again = Reuse(KEY, first.read)
    config = load_config(path, ENVIRON, again)
    assert [w.id for w in config.webhooks] == ["wh-file", "wh-merged"]
    assert len(again.order) == 42


@pytest.mark.parametrize("holder", ["wh-000004", "wh-000008"])
def test_a_new_secret_is_looked_for_in_the_webhooks_kept_from_their_text(
    tmp_path: Path, holder: str
) -> None:
    """A webhook edited to a secret that a webhook met before shows (wh-000006's url, a text
    kept as it was, before or after the edited one): refused, as by a full load."""
    before = base_text(tmp_path / "hook.secret")
    start, end = hook_block(before, holder)
    block = re.sub(
        r'secret: "[^"]*"',
        'secret: "https://hooks.shop-1.net/webhooks/6?source=bridge"',
        before[start:end],
    )
    after = before[:start] + block + before[end:]
    assert after != before
    del TEXT_LOADS[:]
    assert check_reuse(before, after, ENVIRON, tmp_path) == 0, "refused"
    assert TEXT_LOADS == [False]


@pytest.mark.parametrize("source", ["environment", "file"])
@pytest.mark.parametrize("position", ["after", "before"])
def test_a_secret_met_after_a_webhook_showing_it_is_found_whether_it_is_kept_or_not(
    tmp_path: Path, source: str, position: str
) -> None:
    """A webhook whose url holds a secret read from the environment or a file (read in order)
    by a webhook after it, or before it, is refused: by a full load, and by a load keeping
    webhooks (built again, kept, or kept from their text alone)."""
    shown = "https://hooks.shop-1.net/webhooks/6"
    secret_file = tmp_path / "shown.secret"
    secret_file.write_text("a-harmless-secret-0123456789\n")
    secret = "secret: ${SHOWN}" if source == "environment" else f"secret_file: {secret_file}"
    hook = (
        "  - id: wh-late\n    account: acct_late\n    url: https://late.example/h\n"
        f"    events: [transaction.failed]\n    {secret}\n"
    )
    base = base_text(tmp_path / "hook.secret")
    start, _end = hook_block(base, "wh-000006")
    text = base + hook if position == "after" else base[:start] + hook + base[start:]
    environ = {**ENVIRON, "SHOWN": shown}
    harmless = {**ENVIRON, "SHOWN": "a-harmless-secret-0123456789"}

    def edit() -> None:  # the file's secret becomes what the webhook shows
        secret_file.write_text(shown)

    assert check_reuse(text, text, environ, tmp_path, harmless, edit) == 0
    full = outcome(lambda: load_config(tmp_path / "bridge.yaml", environ))
    assert isinstance(full, list)
    assert any("webhook 'wh-000006': field 'url': holds a secret" in each for each in full)


HEAD = config_text(0).replace("webhooks: []\n", "webhooks:\n")


def small_hook(number: int, secret: str = "", events: str = "") -> str:
    """A webhook whose last line is its secret, or its events when given."""
    head = f"  - id: wh-{number}\n    account: acct_1\n    url: https://h{number}.example.com/x\n"
    secret = f"    secret: {secret or f'sekret-value-{number}-0123456789'}\n"
    if events:
        return head + secret + f"    events: {events}\n"
    return head + "    events: [transaction.failed]\n" + secret


@pytest.mark.parametrize(
    ("before", "after"),
    [
        # A text noted where a closer ending the file, with no line break after it, closed the
        # flow list it opened; met again where nothing closes it (found by a review helper).
        (
            HEAD + small_hook(1) + small_hook(2, events="[transaction.failed,") + "]",
            HEAD + small_hook(1) + small_hook(2, events="[transaction.failed,") + small_hook(3),
        ),
        (
            HEAD + small_hook(1) + small_hook(2, secret='"prev-0123456789') + '"',
            HEAD + small_hook(1) + small_hook(2, secret='"prev-0123456789') + small_hook(3),
        ),
        # A text met before, inside a quote that a closer ending the file closes: the full load
        # reads it as part of a secret.
        (
            HEAD + small_hook(1) + small_hook(2),
            HEAD + small_hook(1) + small_hook(9, secret='"opened-0123456789') + small_hook(2) + '"',
        ),
        (  # the same with a line break at the end, and a section after the list
            HEAD.replace(LOGGING, "") + small_hook(1) + small_hook(2) + LOGGING,
            HEAD.replace(LOGGING, "")
            + small_hook(1)
            + small_hook(9, secret='"opened-0123456789')
            + small_hook(2)
            + '"\n'
            + LOGGING,
        ),
    ],
)
def test_a_closer_where_the_list_ends_is_read_alike(
    tmp_path: Path, before: str, after: str
) -> None:
    assert LOGGING in HEAD
    check_reuse(before, after, ENVIRON, tmp_path)


def test_a_webhook_edited_to_show_the_secret_of_a_kept_text_is_refused(tmp_path: Path) -> None:
    """The secrets of the webhooks not composed are remembered as the document's: an edited
    webhook whose url shows one (wh-000006's, its text kept) is refused, as by a full load."""
    before = base_text(tmp_path / "hook.secret")
    shown = "https://hooks.shop-1.net/fvRlmDYJPxgebTs8VjbmYwDztTH-hKMJ"
    assert 'secret: "fvRlmDYJPxgebTs8VjbmYwDztTH-hKMJ"' in before
    after = before.replace('"https://hooks.shop-1.net/webhooks/4?source=bridge"', f'"{shown}"', 1)
    assert after != before
    del TEXT_LOADS[:]
    assert check_reuse(before, after, ENVIRON, tmp_path) == 0, "refused"


def test_webhooks_cross_to_the_parent_by_pickle_field_for_field(tmp_path: Path) -> None:
    """The child of ``bridge run`` pickles the webhooks it built (``Webhook.__reduce__``: the
    constructor's arguments): every field of every kind of webhook comes back equal and of the
    same type, secrets, TLS settings and all, and with the same digest."""
    import dataclasses
    import pickle

    path = tmp_path / "bridge.yaml"
    path.write_text(base_text(tmp_path / "secret"))
    webhooks = list(load_config(path, ENVIRON).webhooks)
    back = pickle.loads(pickle.dumps(webhooks, pickle.HIGHEST_PROTOCOL))
    assert back == webhooks and digests(back) == digests(webhooks)
    names = [each.name for each in dataclasses.fields(Webhook)]
    for before, after in zip(webhooks, back, strict=True):
        for name in names:
            assert type(getattr(after, name)) is type(getattr(before, name))
    assert {w.tls for w in webhooks} != {webhooks[0].tls}  # TLS settings of more than one kind
    assert any(w.previous_secret is not None for w in webhooks)


@pytest.mark.parametrize(
    "host",
    ["ZQ9XWLMN8PKDR4TYVB2C", "".join(chr(ord(char) + 0xFEE0) for char in "zq9xwlmn8pkdr4tyvb2c")],
)
def test_a_kept_webhooks_host_shown_holding_a_new_secret_is_refused(
    tmp_path: Path, host: str
) -> None:
    """A webhook kept (built before, or from its text alone) whose URL's host is shown
    lowercased or mapped as a secret of the edited file: refused, as by a full load."""
    before = base_text(tmp_path / "hook.secret")
    start, end = hook_block(before, "wh-000006")
    before = (
        before[:start]
        + re.sub(r"url: [^\n]*", f'url: "https://{host}.example.com/h"', before[start:end])
        + before[end:]
    )
    start, end = hook_block(before, "wh-000003")
    after = (
        before[:start]
        + re.sub(r"secret: [^\n]*", 'secret: "zq9xwlmn8pkdr4tyvb2c"', before[start:end])
        + before[end:]
    )
    assert after != before
    assert check_reuse(before, after, ENVIRON, tmp_path) == 0
    full = outcome(lambda: load_config(tmp_path / "bridge.yaml", ENVIRON))
    assert isinstance(full, list)
    assert any("webhook 'wh-000006': field 'url': holds a secret" in each for each in full)


@pytest.mark.parametrize("short", [0, 1, 100, 300])
def test_a_reload_counts_the_nodes_of_the_webhooks_it_keeps_from_their_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, short: int
) -> None:
    """The node limit holds alike with and without reuse: the webhooks kept from their text
    count the nodes they were composed from, so a reload that composes only the new webhook is
    refused where the full load is (with the same problem, wherever in the list the limit is
    passed: before kept webhooks too), and accepted where it is."""
    before = base_text(tmp_path / "secret")
    after = before + (
        "  - id: wh-new\n    account: acct_new\n    url: https://new.example/hook\n"
        "    events: [transaction.failed]\n    secret: a-new-secret-0123456789\n"
    )
    limit = yaml_nodes(after) - short
    kept = check_reuse(
        before,
        after,
        ENVIRON,
        tmp_path,
        edit=lambda: monkeypatch.setattr(loader, "MAX_NODES", limit),
    )
    full = outcome(lambda: load_config(tmp_path / "bridge.yaml", ENVIRON))
    if short == 0:
        assert kept > 0 and isinstance(full, Config)
        assert TEXT_LOADS[-1], "the reload composed only what it had not met"
        return
    assert kept == 0
    assert isinstance(full, list) and len(full) == 1
    assert f"more than {limit:,} nodes" in full[0]
