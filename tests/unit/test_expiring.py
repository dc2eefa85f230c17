"""What the delivery client remembers per host ends by time, never by count
(bridge/http/expiring.py)."""

from __future__ import annotations

from bridge.http.expiring import PURGE_FLOOR, Expiring


def test_every_live_entry_is_kept_however_many() -> None:
    entries: Expiring[str, int] = Expiring()
    for n in range(25_000):
        entries.put(f"h{n}", 100.0, n, now=float(n) / 1000)
    assert len(entries) == 25_000
    assert all(entries[f"h{n}"] == (100.0, n) for n in range(0, 25_000, 997))


def test_ended_entries_are_swept_once_the_map_has_doubled() -> None:
    entries: Expiring[int, str] = Expiring()
    for n in range(PURGE_FLOOR):
        entries.put(n, 10.0, "old", now=0.0)
    entries.put(0, 30.0, "again", now=5.0)  # a key already held: no sweep, nothing grows
    assert len(entries) == PURGE_FLOOR
    entries.put(-1, 30.0, "new", now=20.0)  # at the bound: every ended entry goes
    assert entries == {0: (30.0, "again"), -1: (30.0, "new")}
    for n in range(1, PURGE_FLOOR - 1):  # the next sweep waits for the floor again
        entries.put(n, 50.0, "live", now=40.0)
    assert len(entries) == PURGE_FLOOR  # 0 and -1 ended at 30, not swept yet
    entries.put(PURGE_FLOOR, 50.0, "live", now=40.0)
    assert len(entries) == PURGE_FLOOR - 1  # 0 and -1 swept, the new one held
    assert 0 not in entries and -1 not in entries


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
    entries.put("d", 200.0, 9, now=0.0)  # a key held: replaced, nothing goes
    assert entries == {"c": (100.0, 2), "d": (200.0, 9), "e": (100.0, 4)}
