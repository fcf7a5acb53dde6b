"""The cycle collector's pauses, as `trireme serve` reports them (server/metrics.py's GcPauses)."""
import gc

from trireme.server.metrics import GcPauses


def test_a_collection_is_timed_in_its_generation():
    pauses = GcPauses()
    gc.callbacks.append(pauses)
    try:
        junk = []
        junk.append(junk)                           # a cycle to find
        del junk
        gc.collect(2)
    finally:
        gc.callbacks.remove(pauses)
    assert pauses.seconds[2] > 0 and pauses.seconds[0] == pauses.seconds[1] == 0
