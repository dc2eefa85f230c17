"""The open-file limit raised at start (bridge.ops.limits), in a real process whose limits the
test sets first."""

from __future__ import annotations

import json
import resource
import subprocess
import sys

from bridge.ops.limits import OTHER_FILES, wanted_open_files

HARD = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
CEILING = 8192 if HARD == resource.RLIM_INFINITY else min(HARD, 8192)


def raised(soft: int, hard: int, wanted: int) -> dict[str, object]:
    """Run raise_open_file_limit(wanted) in a process started with the limits (soft, hard)."""
    code = (
        "import json, resource\n"
        "from bridge.ops.limits import raise_open_file_limit\n"
        f"files = raise_open_file_limit({wanted})\n"
        "now = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "print(json.dumps({'soft': files.soft, 'hard': files.hard, 'enough': files.enough, "
        "'now': list(now)}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard)),
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    answer: dict[str, object] = json.loads(done.stdout)
    return answer


def test_the_soft_limit_is_raised_to_what_the_settings_want() -> None:
    wanted = CEILING - 100
    answer = raised(256, CEILING, wanted)
    assert answer == {"soft": wanted, "hard": CEILING, "enough": True, "now": [wanted, CEILING]}


def test_a_hard_limit_below_the_wanted_one_is_reached_and_reported() -> None:
    answer = raised(256, 300, 1000)
    assert answer == {"soft": 300, "hard": 300, "enough": False, "now": [300, 300]}


def test_a_soft_limit_already_high_enough_is_never_lowered() -> None:
    answer = raised(2000, CEILING, 1000)
    assert answer == {"soft": 2000, "hard": CEILING, "enough": True, "now": [2000, CEILING]}


def test_the_wanted_descriptors_count_every_busy_and_idle_connection_and_the_rest() -> None:
    assert wanted_open_files(1000, 4000) == 5000 + OTHER_FILES
    assert wanted_open_files(1, 0) == 1 + OTHER_FILES
