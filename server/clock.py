"""The broker's one wall clock: milliseconds since the epoch, which state/ is handed as ``now_ms``."""
import time


def now_ms() -> int:
    return int(time.time() * 1000)
