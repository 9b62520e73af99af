"""Helpers shared by the runtimes' retention rules (:mod:`.rules`): argument checks, save
schedules and metric series."""

from __future__ import annotations

from retainz.retention.metrics import METRIC_CURVES, MetricSeries, load_metric_file


def _positive(rule: str, **values: int | None) -> None:
    for key, v in values.items():
        if v is not None and v < 1:
            raise ValueError(f"retention rule {rule}: {key} must be >= 1, got {v}")


def _check_steps(total_steps: int, first_step: int = 1) -> None:
    if total_steps < 1:
        raise ValueError(f"a run needs at least 1 training step, got {total_steps}")
    if not 0 <= first_step <= total_steps:  # 0: a run whose first save is at step 0 (a seed checkpoint)
        raise ValueError(f"first_step must be in 0..{total_steps}, got {first_step}")


def _multiples(interval: int, first: int, last: int) -> range:
    """Multiples of ``interval`` in ``[first, last]``."""
    return range(-(-first // interval) * interval, last + 1, interval)


def _metric_series(metric: str, steps: list[int], seed: int) -> MetricSeries:
    if metric in METRIC_CURVES:
        return METRIC_CURVES[metric](steps, seed)
    series = load_metric_file(metric)
    for s in steps:
        series.at(s)  # every evaluated step needs a value: fail now, naming the step
    return series
