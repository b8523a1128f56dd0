"""Calibration: how the upstream counts tokens compared with the proxy's estimate, learned per model."""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from typing import Any


class Calibration:
    """Per-model ratio of the upstream's reported prompt tokens to our estimate (an exponential moving average)."""

    def __init__(self, smoothing: float = 0.3, minimum: float = 0.5, maximum: float = 4.0,
                 max_models: int = 1024) -> None:
        if not 0 < smoothing <= 1 or not 0 < minimum <= 1 <= maximum:
            raise ValueError("need 0 < smoothing <= 1 and 0 < minimum <= 1 <= maximum")
        self._smoothing = smoothing
        self._minimum = minimum
        self._maximum = maximum
        self._max_models = max_models  # model names come from clients: keep the table bounded
        self._ratios: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def observe(self, model: str | None, estimated: int, reported: int) -> float:
        """Learn from one response's usage; returns the model's ratio afterwards."""
        key = model or ""
        if not _positive_number(estimated) or not _positive_number(reported):
            return self.ratio(model)
        sample = self._clamp(reported / estimated)
        with self._lock:
            previous = self._ratios.get(key)
            ratio = sample if previous is None else previous + self._smoothing * (sample - previous)
            self._ratios[key] = ratio = self._clamp(ratio)
            self._ratios.move_to_end(key)
            while len(self._ratios) > self._max_models:
                self._ratios.popitem(last=False)
        return ratio

    def ratio(self, model: str | None) -> float:
        with self._lock:
            return self._ratios.get(model or "", 1.0)

    def adjust(self, model: str | None, estimated: int) -> int:
        """Our estimate scaled to what this model's upstream is expected to report."""
        return math.ceil(estimated * self.ratio(model))

    def _clamp(self, ratio: float) -> float:
        return min(self._maximum, max(self._minimum, ratio))


def _positive_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0
