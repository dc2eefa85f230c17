"""What the delivery client remembers per host ends by time, never by count
(bridge/core/expiring.py)."""

from __future__ import annotations

from bridge.core.expiring import PURGE_FLOOR, Expiring


def test_every_live_entry_is_kept_however_many() -> None:
    entries: Expiring[str, int] = Expiring()
    for n in range(25_000):
        entries.put(f"h{n}", 100.0, n, now=float(n) / 1000)
    assert len(entries) == 25_000
    assert all(entries[f"h{n}"] == (100.0, n) for n in range(0, 25_000, 997))


def test_ended_entries_are_swept_once_the_map_has_doubled() -> None:
    entries: Expiring[int, str] = Expiring()
    for n in range(PURGE_FLOOR):
        entries.put(n, 10.0 + n % 2, "old", now=0.0)  # (odd ones end later: not at the front)
    entries.put(0, 30.0, "again", now=5.0)  # a key already held: replaced, moved to the end
    assert len(entries) == PURGE_FLOOR and list(entries)[-1] == 0
    entries.put(-1, 30.0, "new", now=20.0)  # at the bound: every ended entry goes
    assert entries == {0: (30.0, "again"), -1: (30.0, "new")}


def test_ended_entries_at_the_front_go_at_once() -> None:
    entries: Expiring[str, None] = Expiring()
    for n, key in enumerate("abcd"):
        entries.put(key, 10.0 + n, None, now=0.0)
    entries.put("e", 50.0, None, now=11.5)  # a and b ended: gone before the map grows
    assert list(entries) == ["c", "d", "e"]


def test_the_map_stays_within_twice_its_live_entries() -> None:
    """Hosts used for a while each, one after another: the map never holds more than twice
    the entries alive at its last sweep (or the floor)."""
    entries: Expiring[int, None] = Expiring()
    largest = 0
    for n in range(200_000):
        now = n / 100  # 100 new hosts a second, each remembered for 30 s: 3,000 alive
        entries.put(n, now + 30, None, now)
        largest = max(largest, len(entries))
    assert largest <= 2 * 3_000 + 1


def test_at_its_limit_the_entry_put_longest_ago_goes() -> None:
    entries: Expiring[str, int] = Expiring(limit=3)
    for n, key in enumerate("abcde"):
        entries.put(key, 100.0, n, now=0.0)
    assert list(entries) == ["c", "d", "e"]
    entries.put("d", 200.0, 9, now=0.0)  # a key held: replaced, nothing goes, put last
    assert list(entries.items()) == [("c", (100.0, 2)), ("e", (100.0, 4)), ("d", (200.0, 9))]
    entries.put("f", 100.0, 5, now=0.0)  # the one put longest ago goes: c, not d
    assert list(entries) == ["e", "d", "f"]


def test_a_full_map_drops_one_entry_per_put_in_constant_time() -> None:
    """Eviction at the limit walks no holes left by earlier ones (a plain dict's first key
    does: 13.5 µs a put at 16,384 entries, by a review); counted, not timed: the entry taken
    is always the oldest, and the map never holds more than its limit."""
    entries: Expiring[int, None] = Expiring(limit=1000)
    for n in range(50_000):
        entries.put(n, 1e9, None, now=0.0)
        assert len(entries) <= 1000
    assert next(iter(entries)) == 49_000
