"""Helpers shared by the runtimes' retention rules (:mod:`.rules`): argument checks, save
schedules and metric series."""

from __future__ import annotations

from retainz.retention.metrics import METRIC_CURVES, MetricSeries, load_metric_file

__all__ = ["positive", "check_steps", "multiples", "metric_series"]


def positive(rule: str, **values: int | None) -> None:
    """Refuse a rule's count or interval below 1 (``None``: unset, allowed).

    Raises:
        ValueError: one line naming the rule and the key."""
    for key, v in values.items():
        if v is not None and v < 1:
            raise ValueError(f"retention rule {rule}: {key} must be >= 1, got {v}")


def check_steps(total_steps: int, first_step: int = 1) -> None:
    """Refuse a run of fewer than 1 step (steps) or a first step outside ``0..total_steps``.

    Raises:
        ValueError: one line naming the bound."""
    if total_steps < 1:
        raise ValueError(f"a run needs at least 1 training step, got {total_steps}")
    if not 0 <= first_step <= total_steps:  # 0: a run whose first save is at step 0 (a seed checkpoint)
        raise ValueError(f"first_step must be in 0..{total_steps}, got {first_step}")


def multiples(interval: int, first: int, last: int) -> range:
    """Multiples of ``interval`` in ``[first, last]``."""
    return range(-(-first // interval) * interval, last + 1, interval)


def metric_series(metric: str, steps: list[int], seed: int) -> MetricSeries:
    """The metric values a top-k rule ranks saves by at ``steps``: a synthetic curve of
    :data:`~retainz.retention.metrics.METRIC_CURVES` (seeded), or a metric file
    (:func:`~retainz.retention.metrics.load_metric_file`).

    Raises:
        ValueError: a file that lacks a value at one of ``steps`` (naming it), or is unreadable."""
    if metric in METRIC_CURVES:
        return METRIC_CURVES[metric](steps, seed)
    series = load_metric_file(metric)
    for s in steps:
        series.at(s)  # every evaluated step needs a value: fail now, naming the step
    return series
