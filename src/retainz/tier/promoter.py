"""The promoter: copies the committed generations a policy selects to a destination, in the background,
and answers what retention and admission need to know (docs/tiers.md).

Calls, in order::

    p = Promoter(store, "s3://bucket/ckpt", policy="all", bandwidth=200 << 20)
    p.start()                    # a thread: scans the store, promotes what is not durable yet
    ... each save commits ...
    p.committed(gen_id)          # queue it if the policy selects it (returns at once)
    p.retire(store, gen_id, step)  # retention: delete now if durable (or not selected), else defer
    p.finish(newest=True)        # job end: request the newest, wait for the backlog
    p.close()

State: durability is read from the destination (a verified manifest that matches the local
generation), never assumed; a destination that failed to answer is not asked again until its back-off
ends (:attr:`Promoter.MAX_BACKOFF`: the worker's retries and retention's questions wait, and meanwhile
nothing counts as durable, so nothing is deleted); the queue, the copy in progress, failures and deferred retirements live
in memory and are rebuilt by the scan after a restart (the policy selects the same generations; the
runtime's explicit requests are kept in the settings file, :mod:`.state`).

Thread safety: one condition variable guards the promoter's state; the store has its own lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from retainz.errors import (
    DestinationError,
    DurableCopyError,
    GenerationNotFoundError,
    NoSpaceError,
    PromotionBacklogError,
)
from retainz.tier.bandwidth import RateLimit
from retainz.tier.copy import manifest_holds, promote_generation, world_holds
from retainz.tier.destination import Destination
from retainz.tier.manifest import Manifest
from retainz.tier.measure import MeasuredBandwidth
from retainz.tier.policy import PromotionPolicy, parse_policy
from retainz.tier.state import TierSettings

__all__ = ["Promoter", "GenerationTier", "TIER_STATES", "promotion_counters"]

log = logging.getLogger("retainz.tier")

#: A generation's tier state: ``durable`` (a verified copy at the destination), ``copying``,
#: ``pending`` (selected, waiting), ``failed`` (the last attempt failed; retried), ``nodes`` (several
#: nodes: this node's part is verified, another node's is not there yet), ``local`` (not selected by
#: the policy: the local copy is the only one, by choice).
TIER_STATES = ("durable", "copying", "pending", "failed", "nodes", "local")


@dataclass
class GenerationTier:
    """One committed generation's promotion state (``retainz tier status``'s row).

    Attributes:
        id, step, size: the generation (size in bytes).
        state: one of :data:`TIER_STATES`.
        done: bytes of it sent or found verified in the current attempt.
        error: the last failure's one line (``state`` ``failed``), else ``""``.
        deferred: retention wanted it retired; it is kept until it is durable.
    """

    id: str
    step: int
    size: int
    state: str
    done: int = 0
    error: str = ""
    deferred: bool = False

    def to_dict(self) -> dict:
        return {"id": self.id, "step": self.step, "size": self.size, "state": self.state, "done": self.done,
                "error": self.error, "deferred": self.deferred}


class Promoter:
    """Promotes ``store``'s committed generations to ``url`` (module docstring).

    Args:
        store: an open store (read-only is enough unless retirements are deferred to it).
        url: the destination (:class:`~retainz.tier.destination.Destination`).
        policy: a policy spelling (:func:`~retainz.tier.policy.parse_policy`) or a parsed one.
        bandwidth: the cap in bytes per second (``None``: none).
        storage_options: fsspec options (s3fs: credentials, ``client_kwargs={"endpoint_url": ...}``).
        fs: an fsspec filesystem to use for the URL (tests inject faults through it).
        state_path: the settings file keeping the runtime's explicit requests (:mod:`.state`).
        retry_seconds: how long a failed generation waits before its next attempt.
        on_progress: called with the bytes of each chunk sent (a progress bar).
        clock, sleep: for the bandwidth cap and the measured bandwidth (tests).
        node, nodes: this node's name and every node's (the world), when several nodes each promote
            the shards their own devices hold of one generation to one ``url`` (docs/tiers.md,
            "Several nodes"): a generation is durable only once every node's part is verified.

    Raises:
        ValueError: a malformed policy, URL or bandwidth; ``node`` not one of ``nodes``.
    """

    #: The longest back-off from a destination that does not answer (seconds): after a failure it is
    #: not asked again for ``retry_seconds``, doubled at each further failure up to this; an answer
    #: ends it.  Retention's questions (:meth:`is_durable`) then answer "not durable" without a round
    #: trip, so a save with deferred retirements does not wait on a dead endpoint once per generation.
    MAX_BACKOFF = 60.0

    @classmethod
    def from_settings(cls, store, settings, state_path, **kw) -> Promoter:
        """A promoter for ``store`` as a device's remembered :class:`~retainz.tier.state.TierSettings`
        say (destination, policy, bandwidth, and this node's name and the world's when several nodes
        promote one generation); ``kw`` as :class:`Promoter` takes them.

        Raises:
            DestinationError, ValueError: as :class:`Promoter`."""
        nodes = {"node": settings.node, "nodes": settings.nodes} if settings.node is not None else {}
        return cls(store, settings.url, policy=settings.policy, bandwidth=settings.bandwidth,
                   state_path=state_path, **nodes, **kw)

    def __init__(self, store, url: str, *, policy: str | PromotionPolicy = "all", bandwidth: float | None = None,
                 storage_options: dict | None = None, fs=None, state_path: str | None = None,
                 retry_seconds: float = 2.0, on_progress: Callable[[int], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 node: str | None = None, nodes: list[str] | tuple[str, ...] | None = None):
        if (node is None) != (nodes is None) or (node is not None and node not in nodes):
            raise ValueError(f"promotion node {node!r} must be one of nodes {nodes!r} (give both or neither)")
        self.node = node
        self.nodes = tuple(sorted(set(nodes))) if nodes is not None else ()
        self.store = store
        self.url = url
        self.dest = Destination(url, storage_options=storage_options, fs=fs)
        self.policy = parse_policy(policy) if isinstance(policy, str) else policy
        self.limit = RateLimit(bandwidth, clock=clock, sleep=sleep)
        self._clock = clock
        #: the effective bandwidth of verified promotions (:meth:`expected_delay`)
        self.measured = MeasuredBandwidth()
        self.state_path = state_path
        self.retry_seconds = retry_seconds
        self.on_progress = on_progress
        if state_path is not None:
            saved = TierSettings.load(state_path)
            if saved is not None and saved.url == url:
                for gid in saved.requested:
                    self.policy = self.policy.with_request(gid)
        self._cv = threading.Condition()
        self._durable: dict[str, Manifest] = {}
        self._queue: dict[str, float] = {}        # gen id -> monotonic time of its next attempt
        self._failed: dict[str, str] = {}
        self._waiting: set[str] = set()            # this node's part verified, another node's not yet
        self._deferred: dict[str, int | None] = {}
        self._current: str | None = None
        self._done = 0
        self._stop = False
        self._thread: threading.Thread | None = None
        self._scanned = False
        self._down_until = 0.0                     # monotonic time before which the destination is not asked
        self._down_wait = 0.0                      # the current back-off (seconds; 0: it answers)
        #: bytes sent to the destination or found verified there (all attempts), and generations made
        #: durable, this session
        self.bytes_sent = 0
        self.promoted = 0

    # -- selection -------------------------------------------------------------------------------------
    def selects(self, gen) -> bool:
        """True when the policy selects committed generation ``gen`` (a ``GenerationInfo``)."""
        return self.policy.selects(gen.id, gen.step)

    def request(self, gen_id: str) -> None:
        """The runtime asks for ``gen_id`` to be promoted (whatever the policy): kept in the settings
        file (when there is one) so a restart still promotes it, then queued."""
        with self._cv:
            self.policy = self.policy.with_request(gen_id)
            if self.state_path is not None:
                saved = TierSettings.load(self.state_path) or TierSettings(self.url, self.policy.describe())
                if saved.url != self.url:
                    saved = TierSettings(self.url, self.policy.describe())
                saved.requested = sorted(set(saved.requested) | {gen_id})
                saved.save(self.state_path)
            self._enqueue(gen_id)

    def committed(self, gen_id: str) -> None:
        """A generation committed: queue it when the policy selects it.  Returns at once."""
        try:
            gen = self.store.generation(gen_id)
        except GenerationNotFoundError:
            return
        if self.selects(gen):
            with self._cv:
                self._enqueue(gen_id)

    def _enqueue(self, gen_id: str) -> None:
        if gen_id not in self._durable and gen_id != self._current:
            self._queue.setdefault(gen_id, 0.0)
            self._cv.notify_all()

    def _unreachable(self) -> None:
        """The destination did not answer: back off (``retry_seconds``, doubled per failure up to
        :attr:`MAX_BACKOFF`).  Called under ``self._cv``."""
        self._down_wait = min(max(self._down_wait * 2, self.retry_seconds), self.MAX_BACKOFF)
        self._down_until = time.monotonic() + self._down_wait

    def _reachable(self) -> None:
        """The destination answered: the back-off ends.  Called under ``self._cv``."""
        self._down_wait, self._down_until = 0.0, 0.0

    def backing_off(self) -> float:
        """Seconds until the destination is asked again after failing to answer (0: it is asked)."""
        with self._cv:
            return max(0.0, self._down_until - time.monotonic())

    # -- the worker ------------------------------------------------------------------------------------
    def start(self) -> Promoter:
        """Start the background thread (it first scans the store: :meth:`refresh`)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="retainz-promoter", daemon=True)
            self._thread.start()
        return self

    def refresh(self) -> None:
        """Look at the destination for every generation the policy selects: a matching manifest makes
        it durable; any other is queued.  A destination that does not answer leaves them queued."""
        for gen in self.store.generations():
            if not self.selects(gen):
                continue
            with self._cv:
                asked = self._down_until <= time.monotonic()
            m = None
            if asked:                           # (a destination backed off from is not asked: queued)
                try:
                    m = world_holds(self.dest, gen, self.node)
                except DestinationError as e:
                    with self._cv:
                        self._failed[gen.id] = str(e)
                        self._unreachable()
                else:
                    with self._cv:
                        self._reachable()
            with self._cv:
                if m is not None:
                    self._durable[gen.id] = m
                    self._queue.pop(gen.id, None)
                    self._failed.pop(gen.id, None)
                    self._waiting.discard(gen.id)
                else:
                    self._durable.pop(gen.id, None)
                    self._enqueue(gen.id)
        with self._cv:
            self._scanned = True
            self._cv.notify_all()

    def _next(self) -> str | None:
        """The queued generation due first (lowest step), waiting for one; ``None`` when stopping."""
        with self._cv:
            while not self._stop:
                now = time.monotonic()
                due = [g for g, at in self._queue.items() if at <= now and self._down_until <= now]
                if due:
                    steps = {}
                    for g in due:
                        try:
                            steps[g] = self.store.generation(g).step
                        except GenerationNotFoundError:
                            steps[g] = -1
                    gid = min(due, key=lambda g: (steps[g], g))
                    del self._queue[gid]
                    self._current, self._done = gid, 0
                    return gid
                wake = min(self._queue.values(), default=None)
                if wake is not None:
                    wake = max(wake, self._down_until)
                self._cv.wait(None if wake is None else max(wake - now, 0.01))
            return None

    def _run(self) -> None:
        try:
            self.refresh()
        except Exception as e:  # noqa: BLE001 - the store went away; nothing to promote from
            log.warning("promotion to %s: scan failed: %s", self.url, e)
        while True:
            gid = self._next()
            if gid is None:
                return
            self._attempt(gid)

    def _progress(self, n: int) -> None:
        with self._cv:
            self._done += n
            self.bytes_sent += n
        if self.on_progress is not None:
            self.on_progress(n)

    def _attempt(self, gid: str) -> bool:
        """One attempt at promoting ``gid`` (already taken off the queue as the current one)."""
        try:
            try:
                gen = self.store.generation(gid)
            except GenerationNotFoundError:
                return False                     # deleted locally by hand: nothing to promote
            started = self._clock()
            m = promote_generation(self.store, gen, self.dest, limit=self.limit, progress=self._progress,
                                   stop=lambda: self._stop, node=self.node, nodes=self.nodes)
            self.measured.record(gen.size, self._clock() - started)
            if self.node is not None:
                whole = world_holds(self.dest, gen, self.node)
                if whole is None:          # this node's part is verified; wait for the others' and look again
                    with self._cv:
                        self._waiting.add(gid)
                        self._failed.pop(gid, None)
                        self._queue[gid] = time.monotonic() + self.retry_seconds
                    return False
                m = whole
        except InterruptedError:
            with self._cv:
                self._queue.setdefault(gid, 0.0)
            return False
        except (DestinationError, DurableCopyError, OSError, ValueError) as e:
            line = str(e) or type(e).__name__
            log.warning("promotion of %s to %s failed (retried in %.0f s): %s", gid, self.url, self.retry_seconds,
                        line)
            with self._cv:
                self._failed[gid] = line
                if isinstance(e, DestinationError | ConnectionError | TimeoutError):
                    self._unreachable()
                if not isinstance(e, GenerationNotFoundError):
                    self._queue[gid] = time.monotonic() + self.retry_seconds
            return False
        finally:
            with self._cv:
                if self._current == gid:
                    self._current = None
                self._cv.notify_all()
        with self._cv:
            self._reachable()
            self._durable[gid] = m
            self._failed.pop(gid, None)
            self._waiting.discard(gid)
            self.promoted += 1
            step = self._deferred.pop(gid, "none")
            self._cv.notify_all()
        if step != "none":
            self._delete(gid, step)
        return True

    def run_pending(self) -> bool:
        """Promote everything queued in this thread, each once (the CLI's foreground mode; no thread
        may be running).  Returns True when every selected generation is durable."""
        if not self._scanned:
            self.refresh()
        with self._cv:
            todo = sorted(self._queue)
            self._queue.clear()
        for gid in todo:
            with self._cv:
                self._current, self._done = gid, 0
            self._attempt(gid)
        with self._cv:
            return not self._queue and not self._failed

    def wait(self, timeout: float | None = None) -> bool:
        """Block until nothing is queued or copying (True), or ``timeout`` seconds pass (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while not self._scanned or self._queue or self._current is not None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cv.wait(left if left is not None else 1.0)
            return True

    def finish(self, *, newest: bool = True, timeout: float | None = None) -> bool:
        """Job end: request the newest committed generation (``newest``), then :meth:`wait`."""
        if newest:
            gens = self.store.generations()
            if gens:
                last = max(gens, key=lambda g: (g.step, g.commit_seq))
                self.request(last.id)
        return self.wait(timeout)

    def close(self) -> None:
        """Stop the thread (a copy in flight stops at its next chunk, leaving no manifest)."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> Promoter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- what retention and admission ask ----------------------------------------------------------------
    def is_durable(self, gen_id: str) -> bool:
        """True when the destination holds a verified copy of the local generation ``gen_id``, asked
        of the destination now (its manifest matches and every object has its size); False when it
        does not, does not answer, or is being backed off from after failing to answer (then it is
        not asked: :attr:`MAX_BACKOFF`)."""
        try:
            gen = self.store.generation(gen_id)
        except GenerationNotFoundError:
            return False
        with self._cv:
            if self._down_until > time.monotonic():
                return False            # backing off from a destination that did not answer
        try:
            m = world_holds(self.dest, gen, self.node)
        except DestinationError:
            with self._cv:
                self._unreachable()
            return False
        with self._cv:
            self._reachable()
            if m is None:
                if self._durable.pop(gen_id, None) is not None:
                    self._enqueue(gen_id)
            else:
                self._durable[gen_id] = m
        return m is not None

    def may_retire(self, gen_id: str) -> bool:
        """True when retention may delete the local copy of ``gen_id`` now: the policy does not select
        it, or it is durable (:meth:`is_durable`)."""
        try:
            gen = self.store.generation(gen_id)
        except GenerationNotFoundError:
            return True
        return not self.selects(gen) or self.is_durable(gen_id)

    def retire(self, store, gen_id: str, step: int | None = None) -> bool:
        """Retention's delete, keeping until durable: delete ``gen_id`` now when :meth:`may_retire`,
        else defer the deletion until its promotion is verified (the promoter then deletes it).

        Returns:
            True when it was deleted now.
        Raises:
            What ``store.delete`` raises.
        """
        if self.may_retire(gen_id):
            store.delete(gen_id, step=step)
            with self._cv:
                self._deferred.pop(gen_id, None)
            return True
        with self._cv:
            self._deferred[gen_id] = step
            self._enqueue(gen_id)
        log.info("%s: retirement deferred until its promotion to %s is verified", gen_id, self.url)
        return False

    def _delete(self, gen_id: str, step: int | None) -> None:
        try:
            self.store.delete(gen_id, step=step)
        except GenerationNotFoundError:
            pass
        except Exception as e:  # noqa: BLE001 - kept: the next retirement of the rule retries it
            log.warning("%s: deferred retirement failed: %s", gen_id, e)

    @property
    def deferred(self) -> list[str]:
        """Generations whose retirement waits for their promotion."""
        with self._cv:
            return sorted(self._deferred)

    def backlog(self) -> tuple[int, int]:
        """``(generations, bytes)`` the policy selects that are not durable yet (by what this promoter
        has verified)."""
        n = b = 0
        for row in self.status():
            if row.state not in ("durable", "local"):
                n += 1
                b += row.size
        return n, b

    def expected_delay(self, nbytes: int | None = None) -> float | None:
        """Seconds until a generation of ``nbytes`` bytes committed now is expected to be durable: the
        backlog ahead of it (bytes selected and not durable yet, less what the copy in flight has sent)
        plus its own bytes, over the bandwidth this promoter measured (:attr:`measured`), or its cap
        before any measurement.  What retention adds to a keep-until-durable generation's predicted
        reclaim step (:func:`retainz.retention.until_durable`; docs/tiers.md).

        Args:
            nbytes: the new generation's size in bytes; ``None``: the newest committed generation's
                (a runtime's saves are alike, and the new one's size is known only at its commit).

        Returns:
            Seconds (>= 0), or ``None`` when no bandwidth is known (no cap, nothing measured yet).
        """
        rate = self.measured.rate() or self.limit.rate
        if rate is None:
            return None
        rows = self.status()
        if nbytes is None:
            nbytes = max(rows, key=lambda r: r.step).size if rows else 0
        ahead = sum(r.size - r.done for r in rows if r.state not in ("durable", "local"))
        return max(0, ahead + nbytes) / rate

    def backlog_error(self, e: NoSpaceError) -> NoSpaceError:
        """The error admission's refusal ``e`` should surface as: a :class:`PromotionBacklogError`
        when retirements wait for promotions (the space they hold is what ran short), else ``e``."""
        held = self.deferred
        if not held:
            return e
        n, b = self.backlog()
        return PromotionBacklogError(
            f"promotion backlog: {len(held)} generations retention would retire wait for their durable copy at "
            f"{self.url} ({n} generations, {b:,} bytes not yet promoted); the save was refused, nothing deleted "
            f"({e})", needed=e.needed, available=e.available, backlog=n, backlog_bytes=b, state=e.state)

    def status(self) -> list[GenerationTier]:
        """One row per committed generation, ascending step (:class:`GenerationTier`)."""
        rows = []
        gens = self.store.generations()
        with self._cv:
            for g in gens:
                sel = self.selects(g)
                if g.id in self._durable:
                    state = "durable"
                elif not sel:
                    state = "local"
                elif g.id == self._current:
                    state = "copying"
                elif g.id in self._failed:
                    state = "failed"
                elif g.id in self._waiting:
                    state = "nodes"
                else:
                    state = "pending"
                rows.append(GenerationTier(g.id, g.step, g.size, state,
                                           self._done if g.id == self._current else (g.size if state == "durable" else 0),
                                           self._failed.get(g.id, "") if state == "failed" else "",
                                           g.id in self._deferred))
        return rows

    def verify(self, *, deep: bool = True) -> list[str]:
        """Check every durable copy again: its manifest, and (``deep``) every object read back with its
        size and crc32c.  A copy that fails loses its manifest (so nothing reports it durable) and is
        queued for a new copy.  Returns one line per copy found bad.

        Raises:
            DestinationError: the destination did not answer."""
        bad = []
        for gen in self.store.generations():
            if not self.selects(gen):
                continue
            m = manifest_holds(self.dest, gen, self.node)
            problem = None
            if m is None:
                if gen.id in self._durable:
                    problem = f"{gen.id}: its manifest or an object is gone or differs"
            elif deep:
                for c in m.shards:
                    path = self.dest.shard_path(gen.id, c.key)
                    if self.dest.checksum(path) != (c.size, c.crc32c):
                        problem = f"{gen.id}: {self.dest.where(path)} fails its crc32c or size"
                        break
            whole = world_holds(self.dest, gen, self.node) if problem is None and m is not None else None
            with self._cv:
                if whole is not None:
                    self._durable[gen.id] = whole
                    continue
                self._durable.pop(gen.id, None)
                self._enqueue(gen.id)
            if problem is not None:
                bad.append(problem)
                if m is not None:
                    self.dest.remove(self.dest.manifest_path(gen.id, self.node))
        return bad


def promotion_counters(store, device: str) -> dict | None:
    """``retainz df``'s promotion counters for ``device`` when it has a destination remembered
    (``DEVICE.tier.json``), asked of the destination now: ``{"url", "policy", "durable", "backlog":
    {"generations", "bytes"}, "failed", "error"}`` (``error``: the destination's first failure, else
    ``""``); ``None`` without one."""
    from retainz.errors import DestinationError
    from retainz.tier.state import TierSettings, state_path_for

    path = state_path_for(device)
    try:
        s = TierSettings.load(path) if path else None
        if s is None:
            return None
        p = Promoter.from_settings(store, s, path)
    except (ValueError, DestinationError) as e:     # a damaged settings file, no fsspec: df still answers
        return {"url": "", "policy": "", "durable": 0, "backlog": {"generations": 0, "bytes": 0}, "failed": 0,
                "error": str(e)}
    p.refresh()
    rows = p.status()
    n, b = p.backlog()
    failed = [r for r in rows if r.state == "failed"]
    return {"url": s.url, "policy": s.policy, "durable": sum(r.state == "durable" for r in rows),
            "backlog": {"generations": n, "bytes": b}, "failed": len(failed),
            "error": failed[0].error if failed else ""}
