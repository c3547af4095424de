"""Time the codec on a typical ``invoke``: decode_client (parse + checks + validate) and encode.

Run: /work/venv/bin/python bench/codec_timing.py
Prints microseconds per operation, the median of several timeit runs.
"""

from __future__ import annotations

import statistics
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from protocol import codec
from protocol.messages import Invoke

MESSAGE = Invoke(
    id="req-42",
    call_id="call-7f3a9c",
    tool="weather.forecast",
    params={"city": "Paris", "days": 3, "units": "metric", "include": ["wind", "rain"]},
    catalog_version="c0ffee12",
)
RAW = codec.encode(MESSAGE)
RUNS = 7
NUMBER = 20_000


def _median_us(stmt: str) -> float:
    times = timeit.repeat(stmt, globals=globals(), repeat=RUNS, number=NUMBER)
    return statistics.median(times) / NUMBER * 1e6


def main() -> None:
    assert codec.decode_client(RAW) == MESSAGE
    print(f"invoke message: {len(RAW)} bytes; {RUNS} runs x {NUMBER} ops, median")
    print(f"decode_client (bytes): {_median_us('codec.decode_client(RAW)'):7.2f} us/op")
    print(f"encode:                {_median_us('codec.encode(MESSAGE)'):7.2f} us/op")


if __name__ == "__main__":
    main()
