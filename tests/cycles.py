"""What the bridge's own code leaves in reference cycles (garbage only the cyclic collector
frees, and the bridge runs full collections rarely: bridge.ops.collector)."""

from __future__ import annotations

import gc
import types
from collections.abc import Iterator
from contextlib import contextmanager


def _made_by_the_bridge(each: object) -> bool:
    """An object of one of the bridge's classes (its errors included), or a frame of its code."""
    if isinstance(each, types.FrameType):
        return "/bridge/" in each.f_code.co_filename
    return type(each).__module__.startswith("bridge.")


@contextmanager
def bridge_cycles() -> Iterator[list[str]]:
    """The list this yields is filled, when the block ends, with what the block left in
    reference cycles that the bridge made (a short repr each). The collector is off meanwhile,
    so nothing the block leaves is collected before it is seen."""
    left: list[str] = []
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield left
        gc.collect()
        left.extend(repr(each)[:160] for each in gc.garbage if _made_by_the_bridge(each))
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
