"""The objective and the rate as a user writes them (`--ttft-p95 300ms`, `--rate 20/s`).
Pure; a value that cannot be read is a `UsageError` naming the option and the value."""

from __future__ import annotations

import math
import re
from typing import Final

from registry.errors import UsageError

_DURATION: Final = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s)?\s*")
_RATE: Final = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(?:/\s*(s|sec|min|m|h))?\s*")
_PER_SECOND: Final = {None: 1.0, "s": 1.0, "sec": 1.0, "min": 60.0, "m": 60.0, "h": 3600.0}


def parse_duration(option: str, text: str) -> float:
    """Seconds from `300ms`, `0.3s` or `300` (milliseconds when no unit is written)."""
    found = _DURATION.fullmatch(text)
    value = float(found.group(1)) if found else math.nan
    if not found or not math.isfinite(value) or value <= 0:
        raise UsageError(f"{option} {text!r} is not a duration above zero; write it as "
                         "300ms or 0.3s")
    return value / 1000 if found.group(2) in (None, "ms") else value


def parse_rate(option: str, text: str) -> float:
    """Requests per second from `20/s`, `20`, `1200/min` or `72000/h`."""
    found = _RATE.fullmatch(text)
    value = float(found.group(1)) if found else math.nan
    if not found or not math.isfinite(value) or value <= 0:
        raise UsageError(f"{option} {text!r} is not a request rate above zero; write it as "
                         "20/s, 1200/min or 20")
    return value / _PER_SECOND[found.group(2)]


def parse_prices(option: str, pairs: tuple[str, ...]) -> dict[str, float]:
    """`{SKU: $ per GPU-hour}` from `H100-SXM5-80GB=3.5` pairs (any spelling of a SKU that
    `registry.gpus` knows, or CPU)."""
    from registry.gpus import lookup_gpu

    prices: dict[str, float] = {}
    for pair in pairs:
        name, _, value = pair.partition("=")
        try:
            price = float(value)
        except ValueError:
            price = math.nan
        if not name or not math.isfinite(price) or price < 0:
            raise UsageError(f"{option} {pair!r} is not SKU=PRICE (a price per GPU-hour, "
                             "e.g. H100-SXM5-80GB=3.5)")
        prices[lookup_gpu(name, option=option).sku] = price
    return prices
