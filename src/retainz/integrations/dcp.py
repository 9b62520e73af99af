"""PyTorch Distributed Checkpoint (DCP) storage plugin: ``dcp.save``/``dcp.load`` onto a zoned device.

One checkpoint id is one store generation.  The generation id is the id's last path component
(``/ckpt/step-500`` -> ``step-500``), the step is parsed from it (``retainz.retention.steps.parse_step``)
and the runtime's retention rule turns both into the placement hint (:func:`retainz.retention.rule_hint`).
With ``series="jobs/a"`` (jobs sharing a device) the id is ``jobs%2Fa%2Fstep-500``, the ``retainz://`` id
of ``jobs/a/step-500``.  With ``retention=`` the writer also enacts the rule on its series once a save
commits (``ZonedStorageWriter.retire``; docs/retention.md).

Layout (one device per rank; ``device`` is a directory ``DIR`` or a path containing ``{rank}``)::

    DIR/rank0.img   generation "step-500": __0_0.distcp (rank 0's items), .metadata (DCP Metadata)
    DIR/rank1.img   generation "step-500": __1_0.distcp (rank 1's items)
    ...

A single device file (no process group, or world size 1) holds both shards in one generation.  With a
node service for it (``retainz serve DEVICE``, docs/node.md) every rank uses that one device: the ranks
join one generation (``NodeStore.begin_generation(join=...)``), each writes its shard, the others leave
it after ``write_data`` and the coordinator's commit in ``finish`` commits them all.

Commit protocol (torch 2.13 call order: ``reset`` -> ``set_up_storage_writer`` -> ``prepare_local_plan``
-> (coordinator) ``prepare_global_plan`` -> ``write_data`` -> (coordinator) ``finish``):

1. every rank streams its items into one shard ``__{rank}_0.distcp`` of the generation on its own
   device (tensor bytes straight from the tensor's storage, no whole-shard copy);
2. a non-coordinator rank commits its generation at the end of ``write_data`` (DCP gathers the write
   results only after every ``write_data`` returned, so all ranks have committed before ``finish``);
3. the coordinator's ``finish`` writes the pickled ``Metadata`` (with ``storage_data`` = every item's
   :class:`ZonedLocation`) as the shard ``.metadata`` of its own generation and commits it: that commit
   record is the checkpoint's commit point, the counterpart of ``.metadata.tmp`` -> fsync -> rename.

A load needs the committed generation with ``.metadata`` on the coordinator's device and checks that
each rank generation it reads from is committed; an id that never committed fails with
:class:`CheckpointNotFoundError`.  Readers see committed generations only, so a load while a newer
save is still being written sees the last committed checkpoint.

Tensor items are stored as raw bytes (C order, the tensor's dtype), not ``torch.save`` pickles; byte
items as the planner's serialized ``BytesIO``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import math
import os
import pickle
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import (
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from retainz.errors import (
    ChecksumError,
    GenerationExistsError,
    GenerationNotFoundError,
    InvalidIdError,
    NoSpaceError,
    RetainZError,
)
from retainz.hint import Hint, class_bounds
from retainz.ids import checkpoint_name, members, series_folder, series_generation_id
from retainz.jobs import life, ranks, stores
from retainz.retention.base import parse_rule
from retainz.retention.durable import StepRate, until_durable
from retainz.retention.online import rule_hint
from retainz.retention.retire import check_enactable, is_explicit, pattern_of, retired_after_commit
from retainz.retention.steps import parse_step

__all__ = [
    "ZonedStorageWriter",
    "ZonedStorageReader",
    "ZonedLocation",
    "CheckpointNotFoundError",
    "UnsafeMetadataError",
    "load_metadata",
    "device_path",
    "METADATA_SHARD",
]

log = logging.getLogger("retainz.dcp")

#: Shard holding the pickled DCP ``Metadata``; its commit is the checkpoint's commit point.
METADATA_SHARD = ".metadata"
#: Bytes handed to the store per ``write_shard`` chunk (views of the tensor's storage, not copies).
CHUNK_BYTES = 8 << 20


class CheckpointNotFoundError(RetainZError, FileNotFoundError):
    """No committed checkpoint with that id on the device (never committed, still being written, or
    deleted), or a rank's data generation it references is missing."""


class UnsafeMetadataError(RetainZError, pickle.UnpicklingError):
    """A checkpoint's ``.metadata`` pickle names a global outside DCP's metadata types: loading it would
    run code the checkpoint chose.  Pass ``trust_metadata=True`` only for a device you trust."""


#: The globals a ``.metadata`` pickle may name: DCP's metadata dataclasses and enum (torch 2.13
#: ``torch/distributed/checkpoint/metadata.py``), what they hold (``torch.Size``, the layout by name
#: through ``torch.serialization._get_layout``, ``pathlib`` paths in ``StorageMeta.checkpoint_id``,
#: ``OrderedDict``) and this writer's :class:`ZonedLocation`.  Dtypes (``torch.float32``, ...) are
#: admitted by value: a ``torch`` attribute that is a ``torch.dtype``.
_METADATA_GLOBALS = frozenset({
    ("torch.distributed.checkpoint.metadata", name) for name in (
        "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
        "BytesStorageMetadata", "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING")
} | {
    ("torch", "Size"), ("torch.serialization", "_get_layout"), ("collections", "OrderedDict"),
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"), (__name__, "ZonedLocation"),
})


class _MetadataUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` that resolves only :data:`_METADATA_GLOBALS` and torch dtypes."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _METADATA_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise UnsafeMetadataError(f".metadata names {module}.{name}, not a DCP metadata type: refused "
                                  "(pass trust_metadata=True to load a checkpoint from a device you trust)")


def load_metadata(blob: bytes, *, trusted: bool = False) -> Metadata:
    """Unpickle a ``.metadata`` shard (DCP ``Metadata``, as ``finish`` writes it).

    torch 2.13's ``FileSystemReader.read_metadata`` runs ``pickle.load`` on the file, so a checkpoint
    directory anyone could write runs their code; here only DCP's metadata types are resolved unless
    ``trusted``.  Tensor data is never unpickled (raw bytes).

    Raises:
        UnsafeMetadataError: the pickle names any other global (and ``trusted`` is false).
        pickle.UnpicklingError: the bytes are not a pickle.
    """
    if trusted:
        return pickle.loads(blob)
    return _MetadataUnpickler(io.BytesIO(blob)).load()


@dataclasses.dataclass(frozen=True)
class ZonedLocation:
    """Where one write item lives (DCP's ``WriteResult.storage_data``, like ``_StorageInfo``).

    Attributes:
        rank: the rank whose device holds the bytes (``DIR/rank{rank}.img``).
        shard: shard name in the generation (``__{rank}_0.distcp``).
        offset: byte offset of the item in the shard.
        length: bytes of the item.
        dtype: tensor dtype name (``"float32"``), ``None`` for a byte item.
        shape: the stored chunk's shape (the local chunk, not the global tensor), ``None`` for bytes.
    """

    rank: int
    shard: str
    offset: int
    length: int
    dtype: str | None = None
    shape: tuple[int, ...] | None = None


@dataclasses.dataclass(frozen=True)
class _RankStream:
    rank: int


def device_path(device: str | os.PathLike, rank: int, *, reading: bool = False) -> str:
    """The device of ``rank``: ``device`` formatted with ``{rank}``, ``DIR/rank{rank}.img`` for a
    directory (existing, or a path ending in ``/``), else the device itself for every rank: the ranks
    share it through its node service, ``retainz serve``'s or the one the first rank to open it starts
    (:func:`retainz.jobs.stores.using` with ``share``; docs/node.md), and a checkpoint saved so holds
    every rank's shards on that one device (a load at another world size reads them there).
    ``reading`` is accepted for the callers that say which use they make of it."""
    del reading
    text = os.fspath(device)
    if "{rank}" in text:
        return text.format(rank=rank)
    if os.path.isdir(text) or text.endswith("/"):
        return os.path.join(text, f"rank{rank}.img")
    return text


def _current_rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _shared_device(device: Any) -> bool:
    """Whether the ranks of this job share ``device`` (one device file or block device, no ``{rank}``
    and no directory of rank devices, and more than one rank)."""
    if stores.is_store(device) or ranks.world_size() <= 1:
        return False
    text = os.fspath(device)
    return "{rank}" not in text and not (os.path.isdir(text) or text.endswith("/"))


def _item_bytes(item: Any) -> int:
    """A tensor write item's bytes (elements of its chunk times the dtype's size); 0 for a byte item."""
    td = item.tensor_data
    if td is None:
        return 0
    return math.prod(td.chunk.sizes) * td.properties.dtype.itemsize


def split_items(items: list, bins: int) -> list[list]:
    """A rank's write items dealt over ``bins`` shards, as DCP's ``FileSystemWriter`` deals them over
    its ``thread_count`` files (torch ``distributed/checkpoint/filesystem.py``
    ``_split_by_size_and_type``): byte items round-robin, then tensors largest first, each to the
    shard holding the fewest tensor bytes so far (the first such on a tie).  Every shard holds its
    byte items first (the planner serializes them), then its tensors in the order dealt.

    One shard holds the byte items, then the tensors in plan order (as DCP writes its one file).

    Returns:
        ``bins`` lists of items (some may be empty).
    """
    if bins == 1:
        return [[i for i in items if i.type == WriteItemType.BYTE_IO]
                + [i for i in items if i.type != WriteItemType.BYTE_IO]]
    shards: list[list] = [[] for _ in range(bins)]
    sizes = [0] * bins
    byte_items = [i for i in items if i.type == WriteItemType.BYTE_IO]
    for n, item in enumerate(byte_items):
        shards[n % bins].append(item)
    for item in sorted((i for i in items if i.type != WriteItemType.BYTE_IO), key=_item_bytes, reverse=True):
        k = sizes.index(min(sizes))
        shards[k].append(item)
        sizes[k] += _item_bytes(item)
    return shards


def _tensor_chunks(t: torch.Tensor) -> Iterator[memoryview]:
    """Views of ``t``'s bytes in C order, ``CHUNK_BYTES`` at a time (a copy only if not contiguous)."""
    if t.device.type != "cpu":
        t = t.cpu()
    if not t.is_contiguous():
        t = t.contiguous()
    if t.numel() == 0:
        return
    raw = memoryview(t.reshape(-1).view(torch.uint8).numpy())
    for start in range(0, len(raw), CHUNK_BYTES):
        yield raw[start:start + CHUNK_BYTES]


class ZonedStorageWriter(StorageWriter):
    """DCP ``StorageWriter`` that writes each checkpoint as one generation of a RetainZ store.

    Calls, in order (torch 2.13 ``dcp.save``/``dcp.async_save``; THREAD mode runs them on an executor
    thread): ``reset(checkpoint_id)`` (all ranks, when ``checkpoint_id`` is passed),
    ``set_up_storage_writer`` (all ranks), ``prepare_local_plan`` (all), ``prepare_global_plan``
    (coordinator), ``write_data`` (all), ``finish`` (coordinator).

    Args:
        device: an open store (single process), a FileDevice path, a directory (one
            ``rank{N}.img`` per rank) or a path containing ``{rank}``.
        checkpoint_id: the checkpoint id if not passed to ``dcp.save`` (e.g. ``"/ckpt/step-500"``).
        retention: the runtime's retention rule, e.g. ``"torchtitan:interval=500,keep_latest_k=10"``
            (:func:`retainz.retention.parse_rule`; the hint is :func:`retainz.retention.rule_hint`'s).
        condition: an explicit retention condition for the next saves (wins over ``retention``):
            ``"permanent"``, ``"at_step:N"``, ``"after:N"`` (:func:`retainz.retention.explicit_hint`)
            or a :class:`~retainz.hint.Hint`; change it per save with :meth:`set_condition`.
        step: the training step, when the id names none (``parse_step`` otherwise).
        series: the job's checkpoint folder inside the device (``"jobs/a"``;
            :mod:`retainz.ids`): the generation id is ``quote(series/name)`` (the
            ``retainz://`` id of that directory) instead of the bare last component, and retention
            counts and retires only this series.  Jobs sharing a device each pass their own; default
            the root series (ids ``step-500``).
        retire: enact ``retention`` (default True): once a save has committed, the checkpoints of its
            series the rule no longer keeps are deleted (:func:`retainz.retention.retire.
            retired_after_commit`: TorchTitan ``keep_latest_k``, Megatron ``retain_interval``, HF
            ``save_total_limit``), and the survivors' hints are brought to the rule's.  False: the
            rule only hints placement and nothing is deleted.
        geometry: create and format missing device files with this ``Geometry``.
        policy: placement policy for a device this writer formats or opens (``None``: ``retainz``
            for a device it formats, :data:`retainz.placement.DEFAULT_POLICY`; the recorded one
            for a store it opens).
        overwrite: replace a committed generation of the same id at this one's commit
            (replace-on-commit: until then the old one stays readable; a crash leaves exactly one
            of the two); default False raises ``GenerationExistsError``.
        wait: seconds to wait for a device another process holds.
        promote: a destination URL (``file:///mnt/lustre/ckpt``, ``s3://bucket/prefix``; ``{rank}`` in it is
            replaced by the rank, one destination per rank device; without ``{rank}`` and with several
            ranks, each rank's device promotes its own shards to the one destination as node
            ``rank{N}`` of the world, and a save is durable once every rank's part is): committed saves the
            ``promote_policy`` selects are copied there in the background and verified
            (:class:`retainz.tier.Promoter`, docs/tiers.md); training does not wait.  Retention then
            keeps a selected save until its copy is verified (its deletion is deferred, not dropped),
            and a save refused for space while deletions wait raises
            :class:`~retainz.errors.PromotionBacklogError`.
        promote_policy: ``all``, ``every:n=STEPS``, ``requested`` (only saves named by
            :meth:`request_promotion`) or ``none``.
        promote_bandwidth: cap in bytes per second on the copies (``None``: none).
        promote_options: fsspec storage options for the destination (s3fs credentials, endpoint).
        thread_count: shards per rank, each written by a thread of its own, as ``FileSystemWriter``'s
            ``thread_count`` files (``__{rank}_0.distcp`` ... ``__{rank}_{n-1}.distcp``; items dealt by
            :func:`split_items`).  The store places one thread's extent at a time (its lock); what
            overlaps is each thread's serialization and device-to-host copies.

    Retirement happens on each rank's own device at the first point that rank knows the save has
    committed: the coordinator right after its commit in :meth:`finish`; another rank when its next
    save starts (:meth:`prepare_local_plan`), since only the coordinator's commit completes a
    checkpoint.  It also runs at each writer's first save, before its admission: what the rule no
    longer keeps of an earlier run (deferred then, durable now) retires before the new save needs
    the room.  A save given an explicit condition (:meth:`set_condition`) is outside the rule:
    never counted, retired or re-hinted by it.

    Raises:
        ValueError: a malformed rule or series, or ``retire`` with a rule the store cannot enact
            (Lightning, Accelerate, Orbax, HF with ``metric``: pass ``retire=False``).
    """

    def __init__(self, device: Any, checkpoint_id: str | os.PathLike | None = None, *,
                 retention: str | None = None, condition: str | Hint | None = None,
                 step: int | None = None, series: str | None = None, retire: bool = True, geometry=None,
                 policy: str | None = None, overwrite: bool = False, wait: float = 120.0,
                 promote: str | None = None, promote_policy: str = "all", promote_bandwidth: float | None = None,
                 promote_options: dict | None = None, thread_count: int = 1):
        super().__init__()
        if thread_count.__class__ is not int or thread_count < 1:
            raise ValueError(f"thread_count must be a positive int, not {thread_count!r}")
        self.thread_count = thread_count
        self.device = device
        self.promote = promote
        self._promote_args = {"policy": promote_policy, "bandwidth": promote_bandwidth,
                              "storage_options": promote_options}
        if promote is not None:
            from retainz.tier import parse_policy

            parse_policy(promote_policy)     # a malformed policy fails here, not at the first save
        self._promoter: Any = None
        self._promoter_hold = contextlib.ExitStack()
        self._promote_next = False
        self._pace = StepRate()          # the run's steps per second, from the saves' start times
        #: the clock the run's pace is measured by (seconds, monotonic; tests set a fake one)
        self.clock = time.monotonic
        self.retention = retention
        self.series = series_folder(series)
        self._rule = parse_rule(retention) if retention and retire else None
        if self._rule is not None:
            check_enactable(self._rule)
        self._retire_due = False
        self._started = False            # retention ran at this writer's first save (on its device)
        #: purges after a commit that failed (each logged; the next save's purge retries)
        self.retire_failures = 0
        self.condition = condition
        self.explicit_step = step
        self.geometry, self.policy, self.overwrite, self.wait = geometry, policy, overwrite, wait
        self.checkpoint_id: str | None = None
        self.rank = 0
        self.is_coordinator = True
        self.save_id = uuid.uuid4().hex
        self._held = contextlib.ExitStack()
        self._store: Any = None
        self._gen: Any = None
        if checkpoint_id is not None:
            self.reset(checkpoint_id)

    # -- properties ---------------------------------------------------------------------------------
    @property
    def generation(self) -> str:
        """The generation id of the current checkpoint (its last component, in :attr:`series`)."""
        if self.checkpoint_id is None:
            raise ValueError("no checkpoint_id: pass it to ZonedStorageWriter or to dcp.save")
        return series_generation_id(self.series, checkpoint_name(self.checkpoint_id))

    @property
    def step(self) -> int:
        """The training step recorded with the generation (0 when the id names none)."""
        if self.explicit_step is not None:
            return self.explicit_step
        parsed = parse_step(self.checkpoint_id) if self.checkpoint_id is not None else None
        return parsed if parsed is not None else 0

    def hint(self) -> Hint | None:
        """The hint for the current checkpoint: the explicit condition's, else the retention rule's
        prediction for the step (``None`` without either, or when no step is known).

        Raises:
            ValueError: a malformed rule or condition.
        """
        step = self.explicit_step if self.explicit_step is not None else (
            parse_step(self.checkpoint_id) if self.checkpoint_id is not None else None)
        return rule_hint(self.retention, step, condition=self.condition)

    def keeps_until_durable(self) -> bool:
        """True when the rule retires the current save only once its promotion is verified: an enacted
        rule (``retention`` with ``retire=True``), a promoter whose policy selects the save (or
        :meth:`request_promotion`), and no explicit condition (such a save is outside the rule)."""
        if self._rule is None or self._promoter is None or self.condition:
            return False
        return self._promote_next or self._promoter.policy.selects(self.generation, self.step)

    def store_hint(self) -> Hint | None:
        """The hint the store is given for the current save: :meth:`hint`, and for a save kept until
        durable (:meth:`keeps_until_durable`) a predicted reclaim step of at least the step its
        promotion is expected to be verified at (:func:`retainz.retention.until_durable`): the
        promoter's expected delay in seconds (:meth:`retainz.tier.Promoter.expected_delay`: the backlog
        and this save at the measured bandwidth, or the cap before any measurement) turned into steps
        at the run's pace, measured from the saves' start times (:class:`retainz.retention.StepRate`).
        Until two saves have been seen, or with no bandwidth known, the rule's hint stands.  Each call
        records one save's start (:attr:`clock`) for the pace.
        """
        hint = self.hint()
        self._pace.observe(self.step, self.clock())
        if hint is None or not self.keeps_until_durable():
            return hint
        steps = self._pace.steps_in(self._promoter.expected_delay())
        if steps is None:
            return hint
        short, medium = class_bounds(self._rule.base_interval)
        return until_durable(hint, self.step, self.step + math.ceil(steps), short=short, medium=medium)

    def set_condition(self, condition: str | Hint | None) -> None:
        """Set the explicit retention condition for the following saves (``None``: use the rule)."""
        self.condition = condition

    # -- StorageWriter ------------------------------------------------------------------------------
    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        """Start a new checkpoint write (DCP calls it when ``checkpoint_id`` is passed to ``save``).

        A generation left open by a failed earlier save of this writer is aborted.
        """
        self._release(abort=True)
        if checkpoint_id is not None:
            self.checkpoint_id = os.fspath(checkpoint_id)
            checkpoint_name(self.checkpoint_id)  # validate early
        self.save_id = uuid.uuid4().hex

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        """Record the role and rank (``rank=`` is passed by torch 2.13 since the method takes
        ``**kwargs``; the process group rank otherwise)."""
        self.is_coordinator = is_coordinator
        rank = kwargs.get("rank")
        self.rank = int(rank) if rank is not None else _current_rank()

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=self.checkpoint_id, save_id=self.save_id)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        """Open this rank's device and begin the generation (refuses an existing id unless
        ``overwrite``); tags the plan with this rank's stream."""
        gen = self.generation
        self._release(abort=True)
        store = self._held.enter_context(stores.using(device_path_for(self.device, self.rank),
                                                       geometry=self.geometry, policy=self.policy,
                                                       wait=self.wait, job=self.series or None,
                                                       share=_shared_device(self.device)))
        self._store = store
        if self.promote is not None and self._promoter is None:
            self._start_promoter()
        if self._retire_due or (self._rule is not None and not self._started):
            # a non-coordinator's previous save is complete (DCP returned); or this writer's first
            # save: what the rule stopped keeping before it started (a job that stopped with
            # retirements deferred, made durable since by `retainz tier promote`) retires now, not
            # only after a commit that may not fit without that room
            self._retire_due = False
            self._retire_logged(store)
        self._started = True
        try:
            store.generation(gen)
            exists = True
        except GenerationNotFoundError:
            exists = False
        if exists and not self.overwrite:
            self._release()
            # DCP's own FileSystemWriter says "Checkpoint already exists and self.overwrite=False." (torch
            # filesystem.py); callers and PyTorch's tests match that wording
            raise GenerationExistsError(f"Checkpoint already exists and overwrite=False: checkpoint "
                                        f"{self.checkpoint_id!r}: generation {gen!r} is already committed "
                                        "(pass overwrite=True to replace it)")
        # overwrite: the committed checkpoint is replaced at this one's commit, not before
        # (replace-on-commit); no declared size: the store admits the bytes as they arrive
        # ranks sharing one served device write one generation (the token joins them there)
        self._gen = store.begin_generation(gen, self.step, hint=self.store_hint(), replace=exists,
                                           join=ranks.join_token(str(self.checkpoint_id)))
        return dataclasses.replace(plan, storage_data=_RankStream(self.rank))

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        """Keep each rank's own stream (one device per rank)."""
        return [p if p.storage_data is not None else dataclasses.replace(p, storage_data=_RankStream(i))
                for i, p in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        """Stream this rank's items into the shards ``__{rank}_{i}.distcp`` (``i`` below
        :attr:`thread_count`, one thread each; :func:`split_items`) and, on a non-coordinator, commit
        the rank's generation.

        Tensor bytes are handed to the store as views of the tensor's storage, ``CHUNK_BYTES`` at a
        time, and ``planner.resolve_data`` is called lazily per item as the store consumes them.
        """
        if self._gen is None:
            raise RuntimeError("write_data before prepare_local_plan")
        rank = plan.storage_data.rank if isinstance(plan.storage_data, _RankStream) else self.rank
        gen = self._gen

        def write(shard: str, items: list) -> list[WriteResult]:
            results: list[WriteResult] = []

            def chunks() -> Iterator[memoryview]:
                offset = 0
                for item in items:
                    data = planner.resolve_data(item)
                    length, loc_dtype, loc_shape = 0, None, None
                    if item.type == WriteItemType.BYTE_IO:
                        buf = data.getbuffer() if isinstance(data, io.BytesIO) else memoryview(data).cast("B")
                        length = len(buf)
                        if length:
                            yield buf
                    else:
                        tensor = data.detach()
                        loc_dtype = str(tensor.dtype).removeprefix("torch.")
                        loc_shape = tuple(tensor.shape)
                        for view in _tensor_chunks(tensor):
                            length += len(view)
                            yield view
                    results.append(WriteResult(index=item.index, size_in_bytes=length,
                                               storage_data=ZonedLocation(rank, shard, offset, length,
                                                                          loc_dtype, loc_shape)))
                    offset += length

            gen.write_shard(shard, chunks())
            return results

        shards = [(f"__{rank}_{i}.distcp", items)
                  for i, items in enumerate(split_items(list(plan.items), self.thread_count))]
        try:
            self._admit_planned(shards)
            if len(shards) == 1:
                results = write(*shards[0])
            else:
                with ThreadPoolExecutor(len(shards), thread_name_prefix="retainz-dcp") as pool:
                    done = [pool.submit(write, shard, items) for shard, items in shards]
                    results = [r for f in done for r in f.result()]
            if not self.is_coordinator:
                if self._gen.joined:
                    self._gen.leave()     # the coordinator's commit commits this rank's shard too
                else:
                    self._gen.commit()
                    self._promote_committed()
                self._gen = None
                self._retire_due = self._rule is not None
                self._release()
        except NoSpaceError as e:
            self._release(abort=True)
            raise self._space_error(e) from e
        except BaseException:
            self._release(abort=True)
            raise
        fut: Future[list[WriteResult]] = Future()
        fut.set_result(results)
        return fut

    def _admit_planned(self, shards: list[tuple[str, list]]) -> None:
        """Admit the save's planned bytes before any is written: DCP's final plan gives every tensor
        item's size (:func:`_item_bytes`), so the generation's reservation grows at once to the
        tensor bytes of each shard, block-rounded, plus one block per shard for its byte items
        (``Store.admit``; byte items' sizes are known only once serialized, and are admitted as they
        arrive).  A save that cannot fit is refused here, not at its last MiB (on a served device the
        service admits it: ``NodeStore.admit``).

        Raises:
            NoSpaceError: ``cause`` ``"admission"`` (nothing of the save was written).
        """
        bs = self._store.device.geometry.block_size
        need = sum(-(-sum(_item_bytes(i) for i in items) // bs) * bs + bs for _, items in shards)
        with self._store.lock:
            self._store.admit(self._gen, need)

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """Write DCP's ``Metadata`` as the shard ``.metadata`` and commit: the commit point."""
        if self._gen is None:
            raise RuntimeError("finish before write_data")
        try:
            metadata.storage_data = {wr.index: wr.storage_data for rl in results for wr in rl}
            metadata.storage_meta = self.storage_meta()
            blob = pickle.dumps(metadata, protocol=pickle.HIGHEST_PROTOCOL)
            self._gen.write_shard(METADATA_SHARD, [blob])
            self._gen.commit()
            self._gen = None
            self._promote_committed()
            self._retire_logged(self._store)
        except NoSpaceError as e:
            raise self._space_error(e) from e
        finally:
            self._release(abort=True)

    def _retire_logged(self, store: Any) -> None:
        # the save is committed: a failed purge must not report it as failed (TorchTitan's purge
        # thread likewise logs a failed deletion and carries on); the next save's purge retries
        try:
            self.retire(store)
        except Exception as e:
            self.retire_failures += 1
            log.warning("%s: retention after the commit failed (retried at the next save): %s",
                        self.checkpoint_id, e)

    def retire(self, store: Any) -> list[str]:
        """Enact the rule on :attr:`series` of ``store``: delete the committed checkpoints it no
        longer keeps (journaled at this save's step), then give each survivor it counts the rule's
        hint for its step where the journaled one differs (a rule changed on resume, or saved
        without one; a survivor whose promotion is not verified yet keeps the later reclaim step its
        expected promotion finish gave it, :meth:`store_hint`).  Called by the writer once a save has
        committed; no-op without an enacted rule.

        Returns:
            The ids deleted, oldest first.
        """
        if self._rule is None:
            return []
        pat = pattern_of(self._rule)
        mine = [(name, g) for name, g in members(store.generations(), self.series)
                if pat.fullmatch(name) and not is_explicit(g.hint.condition)]
        doomed = retired_after_commit(self._rule, [(name, g.id) for name, g in mine])
        step = self.step
        deleted = []
        for gid in doomed:
            with contextlib.suppress(GenerationNotFoundError):   # another writer of the series got there
                if life.retire(store, gid, step=step, promoter=self._promoter):
                    deleted.append(gid)   # else kept until its promotion is verified (the promoter deletes it)
        pending = set() if self._promoter is None else {
            r.id for r in self._promoter.status() if r.state not in ("durable", "local")}
        names = {g.id: name for name, g in mine}
        # kept until durable: its expected promotion finish stands until it is durable
        life.rehint(store, [g for _, g in mine if g.id not in doomed],
                    lambda g: rule_hint(self._rule, int(pat.fullmatch(names[g.id]).group(1))), step=step,
                    keep=lambda g: g.id in pending and g.hint.kind == "until_durable")
        return deleted

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        try:
            checkpoint_name(checkpoint_id)
        except InvalidIdError:
            return False
        return True

    # -- promotion (retainz.tier) ---------------------------------------------------------------------
    @property
    def promoter(self) -> Any:
        """The :class:`retainz.tier.Promoter` of this writer's device (``None`` before the first save or
        without ``promote``): ``status()``, ``backlog()``, ``finish(timeout=...)`` at job end."""
        return self._promoter

    def request_promotion(self) -> None:
        """Promote the current save (the next to commit) whatever the policy: the runtime's per-save
        choice (``promote_policy="requested"``)."""
        self._promote_next = True

    def _start_promoter(self) -> None:
        from retainz.jobs import promotion
        from retainz.tier import state_path_for

        path = device_path_for(self.device, self.rank)
        store = self._promoter_hold.enter_context(stores.using(path, wait=self.wait,   # open between saves
                                                               share=_shared_device(self.device)))
        state = state_path_for(path) if isinstance(path, str | os.PathLike) else None
        url = self.promote.replace("{rank}", str(self.rank))
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        nodes: dict[str, Any] = {}
        if ("{rank}" not in self.promote and world > 1 and isinstance(path, str | os.PathLike)
                and not stores.served_by_another(path)):
            # one device per rank, one destination: each rank's device is a node promoting its own
            # shards, and a save is durable once every rank's part is (docs/tiers.md, "Several nodes")
            nodes = {"node": f"rank{self.rank}", "nodes": [f"rank{r}" for r in range(world)]}
        self._promoter = promotion.acquire(store, url, state_path=state, **self._promote_args, **nodes)

    def _promote_committed(self) -> None:
        if self._promoter is None:
            return
        gen = self.generation
        if self._promote_next:
            self._promote_next = False
            self._promoter.request(gen)
        else:
            self._promoter.committed(gen)

    def _space_error(self, e: NoSpaceError) -> NoSpaceError:
        """Admission's refusal, as a :class:`PromotionBacklogError` when retirements wait for promotions."""
        return self._promoter.backlog_error(e) if self._promoter is not None else e

    # -- helpers ------------------------------------------------------------------------------------
    def _release(self, abort: bool = False) -> None:
        if self._gen is not None and abort:
            with contextlib.suppress(Exception):
                self._gen.abort()
        self._gen = None
        self._store = None
        self._held.close()
        self._held = contextlib.ExitStack()

    def close(self) -> None:
        """Abort an unfinished generation, stop the promoter (a copy in flight is resumed by the next
        writer's promoter) and release the device."""
        self._release(abort=True)
        if self._promoter is not None:
            from retainz.jobs import promotion

            promotion.release(self._promoter)
            self._promoter = None
        self._promoter_hold.close()


def device_path_for(device: Any, rank: int, *, reading: bool = False) -> Any:
    """``device`` itself for an open store, else :func:`device_path`."""
    return device if stores.is_store(device) else device_path(device, rank, reading=reading)


class _ShardCursor:
    """Sequential reader over ``store.read_shard`` chunks: skip forward, read into buffers."""

    def __init__(self, chunks: Iterator[bytes]):
        self._it = iter(chunks)
        self._buf = memoryview(b"")
        self.pos = 0

    def _fill(self) -> bool:
        while not len(self._buf):
            try:
                self._buf = memoryview(next(self._it))
            except StopIteration:
                return False
        return True

    def skip_to(self, offset: int) -> None:
        if offset < self.pos:
            raise ValueError("cursor cannot go back")
        while self.pos < offset:
            if not self._fill():
                raise EOFError(f"shard ends at {self.pos}, item at {offset}")
            n = min(len(self._buf), offset - self.pos)
            self._buf, self.pos = self._buf[n:], self.pos + n

    def read_into(self, out: memoryview) -> None:
        done = 0
        while done < len(out):
            if not self._fill():
                raise EOFError(f"shard ends at {self.pos}, {len(out) - done} bytes short")
            n = min(len(self._buf), len(out) - done)
            out[done:done + n] = self._buf[:n]
            self._buf, self.pos, done = self._buf[n:], self.pos + n, done + n


class ZonedStorageReader(StorageReader):
    """DCP ``StorageReader`` for checkpoints written by :class:`ZonedStorageWriter`.

    Calls, in order (torch 2.13 ``dcp.load``): ``reset(checkpoint_id)``, ``read_metadata`` (all ranks),
    ``set_up_storage_reader``, ``prepare_local_plan``, (coordinator) ``prepare_global_plan``,
    ``read_data`` (all ranks).

    Args:
        device: as for :class:`ZonedStorageWriter`.
        checkpoint_id: the checkpoint id if not passed to ``dcp.load``.
        series: the series the checkpoint was saved in (``ZonedStorageWriter(series=...)``).
        wait: seconds to wait for a device another process holds (another rank reading it).
        trust_metadata: unpickle ``.metadata`` with plain ``pickle`` (any global, as torch's
            ``FileSystemReader`` does); by default only DCP's metadata types load
            (:func:`load_metadata`), and anything else raises :class:`UnsafeMetadataError`.
        durable: the promotion destination (``ZonedStorageWriter(promote=...)``'s URL): when a rank's
            local copy is missing (no device, no generation) or fails its checksum, that rank's shards
            are read from the verified durable copy there instead (docs/tiers.md, "Restore").
            :attr:`used` says which copy each rank's data came from, and a fallback is logged
            (``retainz.dcp`` warning).
        durable_options: fsspec storage options for ``durable``.
    """

    def __init__(self, device: Any, checkpoint_id: str | os.PathLike | None = None, *,
                 series: str | None = None, wait: float = 120.0, trust_metadata: bool = False,
                 durable: str | None = None, durable_options: dict | None = None):
        super().__init__()
        self.device = device
        self.trust_metadata = trust_metadata
        self.durable = durable
        self.durable_options = durable_options
        #: rank -> ``"local"`` or ``"durable copy at URL"``: where that rank's data was read from
        self.used: dict[int, str] = {}
        self.series = series_folder(series)
        self.wait = wait
        self.checkpoint_id = os.fspath(checkpoint_id) if checkpoint_id is not None else None
        self.storage_data: dict[MetadataIndex, ZonedLocation] = {}
        self.load_id = uuid.uuid4().hex
        self.rank = 0

    @property
    def generation(self) -> str:
        if self.checkpoint_id is None:
            raise ValueError("no checkpoint_id: pass it to ZonedStorageReader or to dcp.load")
        return series_generation_id(self.series, checkpoint_name(self.checkpoint_id))

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        self.storage_data = {}
        self.used = {}
        if checkpoint_id is not None:
            self.checkpoint_id = os.fspath(checkpoint_id)
        self.load_id = uuid.uuid4().hex

    def _durable_copy(self, rank: int, why: BaseException):
        """``(Destination, Manifest)`` of rank ``rank``'s durable copy, logging the fallback; re-raises
        ``why`` when there is no destination."""
        if self.durable is None:
            raise why
        from retainz.tier import Destination, durable_manifest

        url = self.durable.replace("{rank}", str(rank))
        dest = Destination(url, storage_options=self.durable_options)
        m = durable_manifest(dest, self.generation)
        where = f"durable copy at {url}"
        if self.used.get(rank) != where:
            log.warning("%s: rank %d's local copy is unusable (%s); reading the %s", self.checkpoint_id, rank,
                        why, where)
        self.used[rank] = where
        return dest, m

    def _rank_device(self, rank: int) -> Any:
        """Rank ``rank``'s device; with ``durable``, a single device file serves every rank (a layout
        other than the save's: one node loading what several saved, a generation restored whole onto
        one fresh device), and a shard it lacks is read from the durable copy."""
        return device_path_for(self.device, rank, reading=True)

    def _committed(self, store: Any, rank: int) -> Any:
        gen = self.generation
        try:
            return store.generation(gen)
        except GenerationNotFoundError:
            raise CheckpointNotFoundError(
                f"checkpoint {self.checkpoint_id!r}: no committed generation {gen!r} on "
                f"{device_path_for(self.device, rank, reading=True)} (never committed, still being written, or deleted)"
            ) from None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """Read ``.metadata`` of the committed generation on rank 0's device (every rank does; the
        device is opened in turn when ranks run in separate processes)."""
        try:
            with stores.using(device_path_for(self.device, 0), wait=self.wait, job=self.series or None,
                              share=_shared_device(self.device)) as store:
                info = self._committed(store, 0)
                if METADATA_SHARD not in info.shards:
                    raise CheckpointNotFoundError(f"checkpoint {self.checkpoint_id!r}: generation "
                                                  f"{self.generation!r} has no {METADATA_SHARD} shard")
                blob = b"".join(store.read_shard(self.generation, METADATA_SHARD))
                self.used[0] = "local"
        except (FileNotFoundError, ChecksumError) as e:   # no device, no generation, a failed checksum
            from retainz.tier import read_durable_shard

            dest, m = self._durable_copy(0, e)
            blob = b"".join(read_durable_shard(dest, m, METADATA_SHARD))
        metadata = load_metadata(blob, trusted=self.trust_metadata)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.storage_data = metadata.storage_data
        rank = kwargs.get("rank")
        self.rank = int(rank) if rank is not None else _current_rank()
        if self.storage_data is None:
            raise CheckpointNotFoundError(f"checkpoint {self.checkpoint_id!r}: metadata has no storage_data")

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Stream each needed shard once, in offset order, copying items into the planner's tensors.

        Items on this rank's device are read first; then each other rank's device in turn (holding
        at most one device at a time, so ranks reading each other's devices cannot deadlock).
        """
        groups: dict[tuple[int, str], list[ReadItem]] = {}
        for req in plan.items:
            loc: ZonedLocation = self.storage_data[req.storage_index]
            groups.setdefault((loc.rank, loc.shard), []).append(req)
        ranks = sorted({r for r, _ in groups}, key=lambda r: (r != self.rank, r))
        for rank in ranks:
            mine = [(shard, reqs) for (r, shard), reqs in sorted(groups.items()) if r == rank]
            try:
                if self.used.get(rank, "local") != "local":
                    raise CheckpointNotFoundError(f"rank {rank}'s metadata came from the durable copy")
                with stores.using(self._rank_device(rank), wait=self.wait, job=self.series or None,
                                  share=_shared_device(self.device)) as store:
                    info = self._committed(store, rank)
                    for shard, reqs in mine:
                        if shard not in info.shards:
                            raise CheckpointNotFoundError(f"checkpoint {self.checkpoint_id!r}: rank {rank}'s "
                                                          f"generation has no shard {shard!r}")
                        self._read_shard(store.read_shard(self.generation, shard), reqs, planner)
                self.used.setdefault(rank, "local")
            except (FileNotFoundError, ChecksumError) as e:   # every item of the rank is read again
                from retainz.tier import read_durable_shard

                dest, m = self._durable_copy(rank, e)
                for shard, reqs in mine:
                    self._read_shard(read_durable_shard(dest, m, shard), reqs, planner)
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    def _read_shard(self, chunks: Iterator[bytes], reqs: list[ReadItem], planner: LoadPlanner) -> None:
        by_item: dict[MetadataIndex, list[ReadItem]] = {}
        for req in reqs:
            by_item.setdefault(req.storage_index, []).append(req)
        order = sorted(by_item, key=lambda idx: self.storage_data[idx].offset)
        cursor = _ShardCursor(chunks)
        for idx in order:
            loc = self.storage_data[idx]
            cursor.skip_to(loc.offset)
            items = by_item[idx]
            if loc.dtype is None:  # byte item: small, serialized by the planner
                buf = bytearray(loc.length)
                cursor.read_into(memoryview(buf))
                for req in items:
                    planner.load_bytes(req, io.BytesIO(bytes(buf)))
                continue
            dtype = getattr(torch, loc.dtype)
            whole = [r for r in items if all(o == 0 for o in r.storage_offsets)
                     and tuple(r.lengths) == tuple(loc.shape)]
            if len(items) == 1 and whole:
                req = items[0]
                target = planner.resolve_tensor(req).detach()
                if (target.device.type == "cpu" and target.is_contiguous() and target.dtype == dtype
                        and tuple(target.shape) == tuple(loc.shape)):
                    if loc.length:  # straight into the destination tensor's bytes
                        cursor.read_into(memoryview(target.reshape(-1).view(torch.uint8).numpy()))
                    planner.commit_tensor(req, target)
                    continue
                stored = self._read_tensor(cursor, loc, dtype)
                target.copy_(stored)
                planner.commit_tensor(req, target)
                continue
            stored = self._read_tensor(cursor, loc, dtype)
            for req in items:
                piece = stored
                for dim, (start, length) in enumerate(zip(req.storage_offsets, req.lengths, strict=True)):
                    piece = piece.narrow(dim, start, length)
                target = planner.resolve_tensor(req).detach()
                if target.size() != piece.size():
                    raise AssertionError(f"{req.storage_index}: size {tuple(target.size())} vs stored "
                                         f"{tuple(piece.size())}")
                target.copy_(piece)
                planner.commit_tensor(req, target)

    @staticmethod
    def _read_tensor(cursor: _ShardCursor, loc: ZonedLocation, dtype: torch.dtype) -> torch.Tensor:
        out = torch.empty(loc.shape, dtype=dtype)
        if loc.length:
            cursor.read_into(memoryview(out.reshape(-1).view(torch.uint8).numpy()))
        return out

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return ZonedStorageWriter.validate_checkpoint_id(checkpoint_id)
