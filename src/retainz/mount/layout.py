"""The mount's name rules, now :mod:`retainz.namespace.names` (one set of rules for every face);
kept as an alias so older imports work."""

from retainz.namespace.names import *  # noqa: F401,F403
from retainz.namespace.names import __all__  # noqa: F401
