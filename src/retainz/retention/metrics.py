"""Monitored-metric series for top-k retention (Lightning ``monitor``, HF ``metric_for_best_model``).

Top-k retirement depends on future metric values, so a run needs a series: read from a file, or a
seeded synthetic validation-loss curve.  Logical time: values are keyed by training step.

Synthetic curves (seeded; same seed, same series):

* ``synthetic`` (:func:`synthetic_loss`): a smooth ``1 / sqrt`` decay plus white noise;
* ``plateau`` (:func:`plateau_loss`): the shape of published validation-loss curves: a power-law
  decay, plateaus ended by learning-rate drops, autocorrelated noise and rare loss spikes.

File format (``metric=FILE``): one ``STEP VALUE`` pair a line, separated by whitespace or a comma;
blank lines and lines starting with ``#`` are ignored; steps strictly increasing.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

__all__ = ["MetricSeries", "load_metric_file", "synthetic_loss", "plateau_loss", "METRIC_CURVES"]


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


def plateau_loss(steps: range | list[int], seed: int, *, floor: float = 2.0, scale: float = 2.5,
                 alpha: float = 0.76, tau_frac: float = 0.02, drops: tuple[float, ...] = (0.5, 0.75),
                 drop: float = 0.12, noise: float = 0.01, phi: float = 0.8, spike_rate: float = 0.02,
                 spike: float = 0.15, spike_decay: float = 0.5) -> MetricSeries:
    """A seeded validation-loss curve with the features of published ones (plateaus, drops, noise, spikes).

    ``L(s) = floor + scale * (1 + s / tau) ** -alpha + drop * (number of drops after s) + n(s) + x(s)``

    * power-law decay in steps, exponent ``alpha = 0.76``: ``L(S) ~ (S_c / S) ** alpha_S`` with
      ``alpha_S ~ 0.76`` (Kaplan et al., "Scaling Laws for Neural Language Models", 2020,
      arXiv:2001.08361, section 5); ``tau = tau_frac * last step`` keeps it finite at step 0;
    * plateaus ended by learning-rate drops: the step schedule divides the rate by 10 at 50 % and
      75 % of training (He et al., "Deep Residual Learning", 2016, arXiv:1512.03385, section 3.4;
      their figure 4 curves are flat, then fall at each drop); each drop lowers the loss by ``drop``.
      The warmup-stable-decay schedule gives the same shape (Hu et al., MiniCPM, 2024,
      arXiv:2404.06395, section 4);
    * autocorrelated noise ``n``: AR(1) with coefficient ``phi`` and stationary standard deviation
      ``noise`` (a validation loss wanders between evaluations; it is not white);
    * loss spikes ``x``: at each evaluation, with probability ``spike_rate``, a jump of up to
      ``spike`` that decays by ``spike_decay`` per evaluation (Chowdhery et al., PaLM, 2022,
      arXiv:2204.02311, section 5.1: about 20 spikes over a run).

    On a plateau the noise exceeds the trend, so top-k membership is a lottery and survivors can be
    old; right after a drop every new checkpoint beats the old ones, which then die together.

    Args:
        steps: the evaluated steps, ascending (the drops sit at fractions of the last one).
        seed: random seed.
        floor, scale, drop, noise, spike: loss units; alpha, tau_frac, phi, spike_decay: unitless;
            drops: fractions of the last step; spike_rate: probability per evaluation.

    Returns:
        The series, ``source`` ``"plateau:seed=S"``.
    """
    steps = list(steps)
    rng = random.Random(seed)
    last = max(steps) if steps else 1
    tau = max(1.0, tau_frac * last)
    at = [f * last for f in drops]
    innov = noise * math.sqrt(1.0 - phi * phi)
    n = rng.gauss(0.0, noise)
    x = 0.0
    values = {}
    for s in steps:
        n = phi * n + rng.gauss(0.0, innov)
        x *= spike_decay
        if rng.random() < spike_rate:
            x += rng.uniform(0.3, 1.0) * spike
        trend = floor + scale * (1.0 + s / tau) ** -alpha + drop * sum(1 for a in at if s < a)
        values[s] = trend + n + x
    return MetricSeries(values, f"plateau:seed={seed}")


#: Synthetic metric curves by the name a rule's ``metric=`` takes.
METRIC_CURVES = {"synthetic": synthetic_loss, "plateau": plateau_loss}
