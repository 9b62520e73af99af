"""The retention hint of each generation a namespace begins: from a rule, or inferred from names.

A namespace is given its retention as a rule string (``"hf:save_steps=500,save_total_limit=2"``,
:func:`retainz.retention.rule_hint`), a ``{folder: rule}`` dict (the longest folder holding a
checkpoint wins: :func:`rule_for`), ``"auto"`` (the rule is inferred from the saves and deletions the
namespace sees: :class:`~retainz.retention.inference.RetentionInference`), or ``None`` (no hints).
:class:`Hints` answers the hint of each new generation and takes the namespace's saves, deletions
and aborts as evidence for the inference.
"""

from __future__ import annotations

import logging

from retainz.ids import series_of
from retainz.retention.inference import RetentionInference
from retainz.retention.online import rule_hint

__all__ = ["Hints", "rule_for"]

log = logging.getLogger("retainz.namespace")


def rule_for(retention: str | dict | None, folder: str) -> str | None:
    """The retention rule of checkpoints in ``folder``: ``retention`` itself (a rule string), or of a
    ``{folder: rule}`` dict the entry of the longest folder that holds ``folder``; ``None`` for no rule
    or ``"auto"`` (inferred instead)."""
    if isinstance(retention, dict):
        best = None
        for f, rule in retention.items():
            f = f.strip("/")
            if (not f or folder == f or folder.startswith(f + "/")) and (best is None or len(f) > len(best[0])):
                best = (f, rule)
        return best[1] if best else None
    return retention if retention != "auto" else None


class Hints:
    """The retention hints of one namespace (see the module docstring).

    Args:
        retention: ``None``, a rule string, a ``{folder: rule}`` dict, or ``"auto"``.
        face: the namespace's :class:`~retainz.namespace.hooks.Face` (told of a series' first save
            under a rule: ``Face.series_begins``).

    Attributes:
        inference: the :class:`~retainz.retention.inference.RetentionInference` of ``"auto"`` (else ``None``).
    """

    def __init__(self, retention, face):
        self.retention = retention
        self.face = face
        self.inference = RetentionInference() if retention == "auto" else None
        self._series_seen: set[str] = set()

    def hint(self, series: str, gid: str, step: int | None):
        """The hint of new generation ``gid`` of ``series`` at training ``step`` (``None``: no step in
        its name); with ``"auto"`` the save is evidence for the series' rule."""
        if self.inference is not None:
            hint = self.inference.hint(series, step)
            if step is not None:
                before = self.inference.rule(series)
                self.inference.observe_save(series, gid, step)
                self._log_rule(series, before)
            return hint
        rule = rule_for(self.retention, series)
        if rule and series not in self._series_seen:
            self._series_seen.add(series)
            self.face.series_begins(series)
        return rule_hint(rule, step)

    def found(self, path: str, gid: str, step: int | None) -> None:
        """Committed generation ``gid`` at ``path`` was there when the namespace was made: an earlier
        save, evidence too."""
        if self.inference is not None and step is not None:
            self.inference.observe_save(series_of(path), gid, step)

    def deleted(self, gid: str, path: str | None) -> None:
        """The runtime retired ``gid`` (at ``path``, if known)."""
        if self.inference is not None:
            series = series_of(path) if path is not None else None
            before = self.inference.rule(series) if series is not None else None
            self.inference.observe_delete(gid)
            if series is not None:
                self._log_rule(series, before)

    def aborted(self, gid: str) -> None:
        """Generation ``gid`` was begun and will not commit."""
        if self.inference is not None:
            self.inference.observe_abort(gid)

    def summary(self) -> dict:
        """What ``"auto"`` has inferred so far (``RetentionInference.summary``; ``{}`` otherwise)."""
        return self.inference.summary() if self.inference is not None else {}

    def _log_rule(self, series: str, before) -> None:
        after = self.inference.rule(series)
        if after is not None and (before is None or before.describe() != after.describe()):
            log.info("retention inferred for %s/: %s (%d events)", series, after.describe(), after.evidence)
