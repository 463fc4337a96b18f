"""lr_at against ALGORITHMS.md section 1's worked example and the schedule boundaries."""

import math

import pytest

from stagewise.model.config import OptimizerConfig, ScheduleConfig
from stagewise.model.schedules import decay_tokens, lr_at

PEAK, LOW = 4.5e-4, 4.5e-6
OPT = OptimizerConfig(lr=PEAK, min_lr=LOW)


def wsd(decay="minus_sqrt", warmup=0, **kw):
    return ScheduleConfig(kind="wsd", decay=decay, warmup_tokens=warmup, **kw)


def test_worked_example_minus_sqrt():
    sched = wsd(decay_tokens=200)
    assert lr_at(900, sched, OPT, 1000) == pytest.approx(1.35e-4, rel=1e-3)
    assert lr_at(950, sched, OPT, 1000) == pytest.approx(6.42e-5, rel=1e-3)


def test_decay_fraction_gives_the_same_example():
    assert decay_tokens(wsd(decay_fraction=0.2), 1000) == 200
    assert lr_at(900, wsd(decay_fraction=0.2), OPT, 1000) == pytest.approx(1.35e-4, rel=1e-3)


@pytest.mark.parametrize("decay, mid", [("linear", 0.5), ("cosine", 0.5), ("minus_sqrt", 1 - math.sqrt(0.5))])
def test_wsd_boundaries_and_shapes(decay, mid):
    sched = wsd(decay=decay, decay_tokens=200)
    assert lr_at(0, sched, OPT, 1000) == PEAK  # no warmup: peak from the start
    assert lr_at(799, sched, OPT, 1000) == PEAK  # stable until T - D
    assert lr_at(800, sched, OPT, 1000) == pytest.approx(PEAK)  # r = 0
    assert lr_at(900, sched, OPT, 1000) == pytest.approx(LOW + mid * (PEAK - LOW))
    assert lr_at(1000, sched, OPT, 1000) == pytest.approx(LOW)  # r = 1
    assert lr_at(5000, sched, OPT, 1000) == pytest.approx(LOW)  # after T: stays at min


def test_decay_is_monotone():
    sched = wsd(decay_tokens=200)
    values = [lr_at(t, sched, OPT, 1000) for t in range(800, 1001, 10)]
    assert all(a > b for a, b in zip(values, values[1:]))


def test_linear_warmup_then_peak():
    sched = wsd(warmup=100, decay_tokens=200)
    assert lr_at(0, sched, OPT, 1000) == 0.0
    assert lr_at(25, sched, OPT, 1000) == pytest.approx(PEAK / 4)
    assert lr_at(99, sched, OPT, 1000) == pytest.approx(PEAK * 0.99)
    assert lr_at(100, sched, OPT, 1000) == PEAK
    assert lr_at(500, sched, OPT, 1000) == PEAK


def test_constant_after_warmup():
    sched = ScheduleConfig(kind="constant", warmup_tokens=10)
    assert lr_at(5, sched, OPT, 1000) == pytest.approx(PEAK / 2)
    assert lr_at(10, sched, OPT, 1000) == PEAK
    assert lr_at(10_000, sched, OPT, 1000) == PEAK


def test_cosine_runs_from_end_of_warmup_to_total():
    sched = ScheduleConfig(kind="cosine", warmup_tokens=100)
    assert lr_at(100, sched, OPT, 1100) == pytest.approx(PEAK)
    assert lr_at(600, sched, OPT, 1100) == pytest.approx(LOW + 0.5 * (PEAK - LOW))
    assert lr_at(1100, sched, OPT, 1100) == pytest.approx(LOW)
    assert lr_at(2000, sched, OPT, 1100) == pytest.approx(LOW)


def test_zero_length_decay_is_a_step_at_the_end():
    sched = wsd(decay_tokens=0)
    assert lr_at(999, sched, OPT, 1000) == PEAK
    assert lr_at(1000, sched, OPT, 1000) == LOW
