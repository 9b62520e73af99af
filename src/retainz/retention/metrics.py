"""Monitored-metric series for top-k retention (Lightning ``monitor``, HF ``metric_for_best_model``).

Top-k retirement depends on future metric values, so a run needs a series: read from a file, or a
seeded synthetic validation-loss curve.  Logical time: values are keyed by training step.

File format (``metric=FILE``): one ``STEP VALUE`` pair a line, separated by whitespace or a comma;
blank lines and lines starting with ``#`` are ignored; steps strictly increasing.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

__all__ = ["MetricSeries", "load_metric_file", "synthetic_loss"]


@dataclass(frozen=True)
class MetricSeries:
    """Metric values by training step.

    Attributes:
        values: step -> value.
        source: where the values came from (``"synthetic:seed=0"`` or the file path).
    """

    values: dict[int, float]
    source: str

    def at(self, step: int) -> float:
        """The value at ``step``; a missing step is a ``ValueError`` naming it."""
        try:
            return self.values[step]
        except KeyError:
            raise ValueError(f"metric series {self.source} has no value for step {step}") from None


def load_metric_file(path: str) -> MetricSeries:
    """Read a ``STEP VALUE`` file; malformed lines fail with their line number."""
    values: dict[int, float] = {}
    last = -1
    with open(path, encoding="utf-8") as f:
        for lineno, raw in enumerate(f, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.replace(",", " ").split()
            if len(parts) != 2:
                raise ValueError(f"{path}:{lineno}: expected 'STEP VALUE', got {line!r}")
            try:
                step = int(parts[0])
                value = float(parts[1])
            except ValueError:
                raise ValueError(f"{path}:{lineno}: expected an integer step and a number, got {line!r}") from None
            if step <= last:
                raise ValueError(f"{path}:{lineno}: step {step} is not after step {last}")
            if not math.isfinite(value):
                raise ValueError(f"{path}:{lineno}: value {parts[1]!r} is not finite")
            values[step] = value
            last = step
    if not values:
        raise ValueError(f"{path}: no metric values")
    return MetricSeries(values, path)


def synthetic_loss(steps: range | list[int], seed: int, *, floor: float = 1.8, scale: float = 3.0,
                   tau: float = 2000.0, noise: float = 0.03) -> MetricSeries:
    """A seeded validation-loss curve: ``floor + scale / sqrt(1 + step / tau) + N(0, noise)``.

    Early on the loss falls faster than the noise, so a new checkpoint is usually the best (top-k then
    behaves like keep-latest-k); later the noise dominates and top-k membership becomes a lottery.

    Args:
        steps: the steps to give values for.
        seed: random seed (same seed, same series).
        floor, scale, tau, noise: curve parameters (loss units; ``tau`` in steps).
    """
    rng = random.Random(seed)
    values = {s: floor + scale / math.sqrt(1.0 + s / tau) + rng.gauss(0.0, noise) for s in steps}
    return MetricSeries(values, f"synthetic:seed={seed}")
