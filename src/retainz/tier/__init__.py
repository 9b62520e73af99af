"""Tiers: the zoned device as the fast local tier, verified copies at an fsspec destination
(docs/tiers.md).

=====================  ================================================================================
module                 owns
=====================  ================================================================================
:mod:`.policy`         which generations are promoted (``all``, ``every:n=N``, ``requested``, ``none``)
:mod:`.bandwidth`      the bandwidth cap (a token bucket)
:mod:`.measure`        the bandwidth promotions achieved (what the expected promotion delay is from)
:mod:`.destination`    an fsspec URL: object layout, verified reads and writes, errors as one type
:mod:`.manifest`       the object written last that alone makes a generation durable
:mod:`.copy`           one generation's promotion protocol (resume, read back, manifest last)
:mod:`.promoter`       the background promoter: queue, retries, keep-until-durable, backlog
:mod:`.restore`        reading a durable copy back (fallback) and restoring onto a local store
:mod:`.state`          the local settings file (destination, policy, explicit requests)
=====================  ================================================================================
"""

from retainz.tier.bandwidth import RateLimit
from retainz.tier.copy import promote_generation
from retainz.tier.destination import Destination
from retainz.tier.manifest import Manifest
from retainz.tier.measure import MeasuredBandwidth
from retainz.tier.policy import PromotionPolicy, parse_policy
from retainz.tier.promoter import TIER_STATES, GenerationTier, Promoter, promotion_counters
from retainz.tier.restore import durable_manifest, read_durable_shard, restore_generation
from retainz.tier.state import TierSettings, state_path_for

__all__ = ["Promoter", "GenerationTier", "TIER_STATES", "promotion_counters", "Destination", "Manifest", "PromotionPolicy",
           "parse_policy", "RateLimit", "MeasuredBandwidth", "promote_generation", "durable_manifest", "read_durable_shard",
           "restore_generation", "TierSettings", "state_path_for"]
