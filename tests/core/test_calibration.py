"""Calibration: the upstream's token counts against the proxy's estimate, learned per model."""

from __future__ import annotations

import math
import threading
from typing import Any

import pytest

from proxy.core.calibration import Calibration


def test_unknown_model_ratio_is_one() -> None:
    calibration = Calibration()
    assert calibration.ratio("m") == 1.0
    assert calibration.adjust("m", 1234) == 1234


def test_learns_moving_average() -> None:
    calibration = Calibration(smoothing=0.5)
    assert calibration.observe("m", 100, 100) == 1.0
    assert calibration.observe("m", 100, 200) == 1.5
    assert calibration.observe("m", 100, 200) == 1.75
    assert calibration.ratio("other") == 1.0
    assert calibration.adjust("m", 3) == math.ceil(3 * 1.75)


def test_converges_on_a_steady_ratio() -> None:
    calibration = Calibration()
    for _ in range(60):
        calibration.observe("m", 1000, 1300)
    assert calibration.ratio("m") == pytest.approx(1.3)


@pytest.mark.parametrize(("reported", "expected"), [(10_000, 4.0), (1, 0.5)])
def test_ratio_is_clamped(reported: int, expected: float) -> None:
    calibration = Calibration()
    for _ in range(5):
        calibration.observe("m", 100, reported)
    assert calibration.ratio("m") == expected


@pytest.mark.parametrize(
    ("estimated", "reported"),
    [(0, 100), (100, 0), (-5, 100), (100, -1), (100, float("nan")), (True, 100), (100, None), ("100", 120)],
)
def test_bad_observations_ignored(estimated: Any, reported: Any) -> None:
    calibration = Calibration()
    calibration.observe("m", 100, 150)
    assert calibration.observe("m", estimated, reported) == 1.5
    assert calibration.ratio("m") == 1.5


@pytest.mark.parametrize("kwargs", [{"smoothing": 0}, {"smoothing": 1.5}, {"minimum": 2.0}, {"maximum": 0.9}])
def test_invalid_calibration_settings(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Calibration(**kwargs)


def test_model_table_is_bounded() -> None:
    calibration = Calibration(max_models=2)
    for model in ("a", "b", "c"):
        calibration.observe(model, 100, 200)
    assert [calibration.ratio(model) for model in ("a", "b", "c")] == [1.0, 2.0, 2.0]


def test_concurrent_observations_stay_consistent() -> None:
    calibration = Calibration()

    def observe() -> None:
        for _ in range(500):
            calibration.observe("m", 100, 250)

    threads = [threading.Thread(target=observe) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert calibration.ratio("m") == pytest.approx(2.5)
