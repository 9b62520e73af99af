"""Which committed generations are promoted: the promotion policy (docs/tiers.md, "Policies").

A policy is a pure function of a generation's id and step (and of the ids the runtime asked for), so
the same policy selects the same generations after a restart: nothing about the selection has to be
journaled.  Spellings (the project's ``NAME[:k=v]`` form, :func:`retainz.spec.parse_spec`):

=================  ==============================================================================
``all``            every committed generation
``every:n=N``      generations whose training step is a multiple of ``N`` steps (``every:n=1000``
                   promotes steps 0, 1000, 2000...; Megatron's ``--save-retain-interval`` idea)
``requested``      only the generations the runtime names, per save (``Promoter.request``), and the
                   newest at job end (``Promoter.finish(newest=True)``)
``none``           nothing (a configured destination used only to restore from)
=================  ==============================================================================

Every policy also promotes what is requested explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from retainz.spec import parse_spec

__all__ = ["PromotionPolicy", "parse_policy", "POLICY_NAMES"]

#: The policy names :func:`parse_policy` takes.
POLICY_NAMES = ("all", "every", "requested", "none")


@dataclass(frozen=True)
class PromotionPolicy:
    """A parsed promotion policy.

    Attributes:
        name: one of :data:`POLICY_NAMES`.
        every: the step interval of ``every:n=N`` (0 otherwise).
        requested: generation ids the runtime asked for explicitly (selected under every policy).
    """

    name: str = "all"
    every: int = 0
    requested: frozenset[str] = field(default_factory=frozenset)

    def selects(self, gen_id: str, step: int) -> bool:
        """True when the generation ``gen_id`` saved at ``step`` must be promoted."""
        if gen_id in self.requested:
            return True
        if self.name == "all":
            return True
        if self.name == "every":
            return step % self.every == 0
        return False

    def with_request(self, gen_id: str) -> PromotionPolicy:
        """The same policy with ``gen_id`` requested too."""
        return PromotionPolicy(self.name, self.every, self.requested | {gen_id})

    def describe(self) -> str:
        """The spelling :func:`parse_policy` reads back (without the requests)."""
        return f"every:n={self.every}" if self.name == "every" else self.name


def parse_policy(text: str) -> PromotionPolicy:
    """Read a policy spelling (the module docstring's table).

    Raises:
        ValueError: an unknown name, an unknown or missing key, ``n`` not a whole number >= 1 (one line).
    """
    name, pairs = parse_spec(text, "promotion policy")
    params = dict(pairs)
    if name not in POLICY_NAMES:
        raise ValueError(f"unknown promotion policy {name!r} (one of: {', '.join(POLICY_NAMES)})")
    if name == "every":
        extra = set(params) - {"n"}
        if extra or "n" not in params:
            raise ValueError(f"promotion policy every takes exactly n=STEPS (every:n=1000), not {text!r}")
        try:
            n = int(params["n"])
        except (TypeError, ValueError):
            raise ValueError(f"promotion policy every: n must be a whole number of steps, not {params['n']!r}") from None
        if n < 1:
            raise ValueError(f"promotion policy every: n must be at least 1 step, not {n}")
        return PromotionPolicy("every", n)
    if params:
        raise ValueError(f"promotion policy {name} takes no parameters ({text!r})")
    return PromotionPolicy(name)
