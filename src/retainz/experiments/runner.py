"""``retainz run``: run a manifest's cases in parallel processes, one JSON record per case.

Phases:

1. expand the manifest (:mod:`retainz.experiments.manifest`); refuse if any case already has a record
   in the output folder (use another ``--output`` for a repeat, or ``--resume`` to fill in the rest);
2. generate the traces the cases need, once per distinct :class:`~retainz.experiments.manifest.TraceSpec`,
   cached by the spec's hash under the trace cache (default ``<output>/traces``);
3. run each case in a worker process (``--jobs``, default: the number of cores) and write its record
   atomically (a temporary file linked into place, so a record is never half-written nor overwritten).
   The workers are local processes (``--executor local``, the default) or a Dask distributed
   cluster (``--executor dask[=SCHEDULER_ADDRESS]``; :class:`_DaskPool`); records are identical.

A case that raises is recorded with ``status: "failed"`` and its error and traceback; the others go on.

The record schema is :data:`retainz.runrecord.SCHEMA` (see ``docs/experiments.md``).
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from fractions import Fraction

from retainz.experiments.manifest import CASE_DEFAULTS, Case, TraceSpec, load_manifest
from retainz.experiments.record import finalize, provenance

__all__ = ["Backend", "RetainZBackend", "RunSummary", "run_manifest", "run_cases", "execute_case",
           "RecordExistsError"]


class RecordExistsError(FileExistsError):
    """The output folder already holds records of these cases."""


class Backend:
    """How a case becomes a result: trace generation and replay.  The runner passes an instance to
    its workers (so it must pickle).  :class:`RetainZBackend` is the real one.
    """

    name = "abstract"

    def generate_trace(self, spec: TraceSpec, path: str) -> None:  # pragma: no cover - interface
        """Write the trace for ``spec`` to ``path``."""
        raise NotImplementedError

    def replay(self, trace_path: str, case: Case, workdir: str) -> dict:  # pragma: no cover
        """Replay the trace under the case's inputs; returns the replay's JSON-able result dict."""
        raise NotImplementedError


class RetainZBackend(Backend):
    """The real thing: ``retainz trace generate`` and :func:`retainz.trace.replay.replay`.

    Devices: ``memory`` (the in-memory replay device), ``file`` (a FileDevice with payload in the
    case's work folder, deleted afterwards) and ``guest`` (the replay command run inside the QEMU ZNS
    guest of :mod:`retainz.vm.guest` against ``/dev/nvme0n1``).  A case with a ``system`` is a
    file-system comparison run (:mod:`retainz.experiments.filesystems`).
    """

    name = "retainz"

    def generate_trace(self, spec: TraceSpec, path: str) -> None:
        from retainz.trace.generate import write_generated

        if spec.fleet is not None:
            import json

            from retainz.trace.fleet import FleetConfig, write_fleet

            write_fleet(path, FleetConfig.from_json(json.loads(spec.fleet)), seed=spec.seed)
            return
        if spec.tenants is None:
            write_generated(path, scaled_layout(spec.layout, spec.scale), spec.rule, spec.steps, seed=spec.seed)
            return
        from retainz.trace.mix import mix

        parts = []
        try:
            for j, (layout, rule, offset) in enumerate(spec.tenants):
                part = f"{path}.job{j}"
                parts.append(part)
                write_generated(part, scaled_layout(layout, spec.scale), rule, spec.steps - offset,
                                seed=spec.seed + j)
            mix(parts, path, offsets=[t[2] for t in spec.tenants])
        finally:
            for part in parts:
                if os.path.exists(part):
                    os.unlink(part)

    def replay(self, trace_path: str, case: Case, workdir: str) -> dict:
        i = case.inputs
        if i.get("system") is not None:
            from retainz.experiments.filesystems import run_filesystem_case

            return run_filesystem_case(trace_path, case, workdir)
        if i["device"] == "guest":
            return _replay_in_guest(trace_path, case, workdir)
        from retainz.trace.replay import replay

        img = os.path.join(workdir, f"{case.id}.img") if i["device"] == "file" else None
        try:
            dev = i["device"] if i["device"].startswith("fdp") else "memory" if img is None else f"file:{img}"
            return replay(trace_path, case.replay_config(dev))
        finally:
            if img and os.path.exists(img):
                os.unlink(img)


def scaled_layout(name: str, scale: str):
    """The layout ``name`` with every file's size multiplied by ``scale`` (rounded down, at least one
    byte); the name gains ``@scale=1/1024`` and each file's source says it was scaled.  Scale 1 returns
    the layout itself."""
    import dataclasses

    from retainz.trace.layouts import ShardSpec, get_layout

    lay = get_layout(name)
    f = Fraction(scale)
    if f == 1:
        return lay

    def sc(files):
        return tuple(ShardSpec(s.name, max(1, s.nbytes * f.numerator // f.denominator),
                               f"{s.source} (size scaled by {f})") for s in files)

    return dataclasses.replace(lay, name=f"{lay.name}@scale={f}", shards=sc(lay.shards),
                               model_only=sc(lay.model_only),
                               notes=lay.notes + (f"every file size scaled by {f} for a capacity trial",))


def _replay_in_guest(trace_path: str, case: Case, workdir: str) -> dict:
    """Run ``retainz replay`` inside the QEMU ZNS guest on ``/dev/nvme0n1`` with the case's geometry and
    ``guest_memory_mib`` of RAM (512 MiB when absent)."""
    try:
        from retainz.vm.guest import GuestConfig, ZNSConfig, run_in_guest
        from retainz.vm.setup import VMSetupError
    except ImportError as e:  # pragma: no cover - depends on the vm lane
        raise RuntimeError(f"device 'guest' needs the QEMU guest tooling (retainz.vm.guest): {e}") from None
    config = case.replay_config("/dev/nvme0n1")
    if config.zones is None:
        raise ValueError("device 'guest' needs a case with an explicit zone count, not a pressure")
    out = os.path.join(os.path.abspath(workdir), case.id)
    os.makedirs(out, exist_ok=True)
    result_file = os.path.join(out, "replay.json")
    argv = [sys.executable, "-m", "retainz.cli", "replay", os.path.abspath(trace_path), *config.cli_args(), "--json"]
    shell = " ".join(_shq(a) for a in argv) + f" > {_shq(result_file)}"
    g = config.geometry(config.zones)
    zns = ZNSConfig(zones=g.nr_zones, zone_size=g.zone_size, zone_capacity=g.zone_capacity, max_open=g.max_open,
                    max_active=g.max_active)
    memory = case.inputs.get("guest_memory_mib", CASE_DEFAULTS["guest_memory_mib"])   # absent: the default
    try:
        res = run_in_guest(["/bin/sh", "-c", shell], out,
                           GuestConfig(zns=zns, nullblk=None, timeout=6 * 3600.0, memory_mb=memory), install=False)
    except VMSetupError as e:
        raise RuntimeError(f"device 'guest' is unavailable: {e} (run `retainz vm setup`, or point RETAINZ_QEMU "
                           "and RETAINZ_VM_KERNEL_DIR at your own QEMU/FEMU binary and kernel)") from None
    if res.status != 0:
        raise RuntimeError(f"replay in the guest exited {res.status}:\n{res.console_tail()}")
    with open(result_file, encoding="utf-8") as f:
        return json.load(f)


def _shq(s: str) -> str:
    import shlex

    return shlex.quote(s)


def _write_new(path: str, text: str) -> None:
    """Write ``text`` to ``path`` atomically; FileExistsError if ``path`` exists (never overwrites).

    The temporary file lives in the folder's ``.work`` subfolder (same file system, so the link is
    atomic): a worker terminated mid-write (Ctrl-C) leaves no stray ``*.json`` among the records."""
    d = os.path.join(os.path.dirname(path) or ".", ".work")
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=".json")
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, path)  # atomic, and fails if the record exists
    finally:
        os.unlink(tmp)


def _generate(backend: Backend, spec: TraceSpec, trace_dir: str) -> tuple[str, str, float]:
    """Generate (or reuse) the trace of ``spec``; returns (path, sha256, seconds)."""
    from retainz.trace.io import sha256_file

    path = os.path.join(trace_dir, f"{spec.key()}.jsonl")
    t0 = time.perf_counter()
    if not os.path.exists(path):
        fd, tmp = tempfile.mkstemp(dir=trace_dir, prefix=".tmp-", suffix=".jsonl")
        os.close(fd)
        try:
            backend.generate_trace(spec, tmp)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return path, sha256_file(path), time.perf_counter() - t0


def execute_case(case: Case, trace: dict | None, output: str, backend: Backend, prov: dict,
                 error: str | None = None) -> dict:
    """Run one case and write its record to ``<output>/<case id>.json``; returns the record.

    Args:
        case: the case.
        trace: ``{"key", "path", "sha256", "bytes", "seconds"}`` of its trace, or None when trace
            generation failed (then ``error`` says why and the case is recorded as failed).
        output: the records folder.
        backend: trace generation and replay.
        prov: provenance (:func:`retainz.experiments.record.provenance`).
        error: a failure that happened before the case could run.
    """
    rec: dict = {"id": case.id, "manifest": case.manifest, "tags": case.tags, "inputs": case.inputs,
                 "backend": backend.name, "provenance": prov}
    if trace is not None:
        rec["trace"] = {"key": trace["key"], "sha256": trace["sha256"], "bytes": trace["bytes"],
                        "file": os.path.relpath(trace["path"], output) if trace["path"] else None}
    wall0, cpu0 = time.perf_counter(), time.process_time()
    try:
        if error is not None:
            raise RuntimeError(error)
        workdir = os.path.join(output, ".work")
        os.makedirs(workdir, exist_ok=True)
        result = dict(backend.replay(trace["path"], case, workdir))
        zone_map = result.pop("zone_map", None)
        rec["status"] = "ok"
        rec["metrics"] = result
        rec["capacity_stop_step"] = result.get("capacity_stop_step")
        rec["capacity_stop_cause"] = result.get("capacity_stop_cause")
        rec["capacity_stop_state"] = result.get("capacity_stop_state")
        if zone_map is not None:
            rec["zone_map"] = zone_map
    except Exception as e:  # noqa: BLE001 - every failure becomes a failed record
        rec["status"] = "failed"
        rec["error"] = {"type": type(e).__name__, "message": str(e), "traceback": traceback.format_exc()}
    rec["timing"] = {"wall_seconds": time.perf_counter() - wall0, "cpu_seconds": time.process_time() - cpu0,
                     "trace_seconds": trace["seconds"] if trace else None}
    rec = finalize(rec)
    _write_new(os.path.join(output, f"{case.id}.json"), json.dumps(rec, indent=1, sort_keys=True) + "\n")
    return rec


@dataclass
class RunSummary:
    """What :func:`run_cases` did: counts and the ids of failed cases."""

    total: int = 0
    ok: int = 0
    failed: list[str] = field(default_factory=list)
    skipped: int = 0
    capacity_stops: int = 0
    seconds: float = 0.0

    def line(self) -> str:
        return (f"{self.total} cases: {self.ok} ok ({self.capacity_stops} with a capacity stop), "
                f"{len(self.failed)} failed, {self.skipped} already recorded; {self.seconds:.1f} s")


def _recorded_ok(path: str) -> bool:
    """Whether the record at ``path`` is a readable record of a case that ran (status ``ok``)."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f).get("status") == "ok"
    except (OSError, ValueError, AttributeError):
        return False


class _Progress:
    """A tqdm bar of items done, with the items per second and the elapsed time, and no ETA: cases
    differ in cost by two orders of magnitude (a payload-writing FileDevice case against a payload-less
    one; small zones against large), so an ETA from the mean rate reads 00:00 while the costly ones
    still run.  No bar when there is nothing to do (a rerun that finds every record)."""

    def __init__(self, total: int, desc: str, enabled: bool):
        self.bar = None
        if enabled and total:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, unit=desc.rstrip("s"), file=sys.stderr, mininterval=1.0,
                            smoothing=0, dynamic_ncols=True,
                            bar_format="{desc}: {n_fmt}/{total_fmt} |{bar}| [{elapsed}, {rate_fmt}]")

    def update(self) -> None:
        if self.bar is not None:
            self.bar.update()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run_cases(cases: list[Case], output: str, *, jobs: int | None = None, backend: Backend | None = None,
              trace_dir: str | None = None, resume: bool = False, progress: bool = True,
              executor: str = "local", connect_timeout: float = 5.0) -> RunSummary:
    """Run ``cases`` and write their records into ``output``.

    Args:
        cases: expanded cases (:func:`~retainz.experiments.manifest.load_manifest`).
        output: records folder (created).
        jobs: worker processes (default: the number of cores; 1 runs in this process).
        backend: default :class:`RetainZBackend`.
        trace_dir: trace cache (default ``<output>/traces``).
        resume: skip cases already recorded with status ``ok`` instead of refusing; a case recorded as
            failed (or whose record cannot be read) runs again and its record is replaced.
        progress: show a progress bar on stderr (cases done, elapsed time, cases/s; no ETA, see
            :class:`_Progress`); none when nothing is left to run.
        executor: ``local`` (worker processes here, the default), ``dask`` (a Dask ``LocalCluster`` of
            ``jobs`` workers) or ``dask=ADDRESS`` (the Dask scheduler at ADDRESS; workers share the
            output folder's file system).  Records are the same whichever runs them.
        connect_timeout: seconds to wait for the Dask scheduler at ADDRESS (dask.distributed's own
            default is 30 s); the pool is reached before anything is written, so an unreachable
            scheduler fails fast and leaves no folder behind.

    Raises:
        ConnectionError: the Dask scheduler at ADDRESS did not answer within ``connect_timeout``.
        RecordExistsError: a case already has a record and ``resume`` is False (nothing is run).
        ValueError: an unknown executor.
    """
    t0 = time.perf_counter()
    if executor != "local" and executor != "dask" and not executor.startswith("dask="):
        raise ValueError(f"unknown executor {executor!r}; valid: local, dask, dask=SCHEDULER_ADDRESS")
    backend = backend or RetainZBackend()
    jobs = jobs or os.cpu_count() or 1
    pool = None
    if not (executor == "local" and jobs == 1):
        pool = _LocalPool(jobs) if executor == "local" else _DaskPool(executor, jobs, connect_timeout)
    try:
        return _run(cases, output, jobs, backend, trace_dir, resume, progress, pool, t0)
    except BaseException:
        if pool is not None:
            # Ctrl-C (or any error): drop the queued cases and stop the running ones instead of letting
            # the executor's exit wait for every job.  Records are written atomically, so the ones
            # already written are complete and ``--resume`` runs only the rest.
            pool.abandon()
        raise


def _run(cases, output, jobs, backend, trace_dir, resume, progress, pool, t0) -> RunSummary:
    os.makedirs(output, exist_ok=True)
    trace_dir = trace_dir or os.path.join(output, "traces")
    os.makedirs(trace_dir, exist_ok=True)
    summary = RunSummary(total=len(cases))
    existing = [c for c in cases if os.path.exists(os.path.join(output, f"{c.id}.json"))]
    if existing and not resume:
        raise RecordExistsError(f"{output} already holds {len(existing)} of these {len(cases)} records "
                                f"(e.g. {existing[0].id}.json); refusing to overwrite: choose another "
                                "--output, or --resume to run only the missing cases")
    # --resume runs what is missing and what failed: a failed case's record is replaced by the rerun's
    done = {c.id for c in existing if _recorded_ok(os.path.join(output, f"{c.id}.json"))}
    todo = [c for c in cases if c.id not in done]
    for c in existing:
        if c.id not in done:        # the failed record moves aside (kept in .work) for the rerun's record
            os.makedirs(os.path.join(output, ".work"), exist_ok=True)
            os.replace(os.path.join(output, f"{c.id}.json"), os.path.join(output, ".work", f"{c.id}.failed.json"))
    summary.skipped = len(done)
    prov = provenance()

    specs = sorted({c.trace for c in todo}, key=lambda s: s.key())
    traces: dict[TraceSpec, dict] = {}
    trace_errors: dict[TraceSpec, str] = {}

    def on_trace(spec, fut):
        try:
            path, sha, secs = fut.result()
            traces[spec] = {"key": spec.key(), "path": path, "sha256": sha, "bytes": os.path.getsize(path),
                            "seconds": secs}
        except Exception as e:  # noqa: BLE001
            trace_errors[spec] = f"trace generation failed for {spec}: {type(e).__name__}: {e}"

    def on_case(case, fut):
        try:
            rec = fut.result()
        except Exception as e:  # noqa: BLE001 - a worker that died: record it here
            rec = execute_case(case, None, output, backend, prov,
                               error=f"worker process failed: {type(e).__name__}: {e}")
        if rec["status"] == "ok":
            summary.ok += 1
            if rec.get("capacity_stop_step") is not None:
                summary.capacity_stops += 1
        else:
            summary.failed.append(case.id)

    def args_of(c):
        spec = c.trace
        return (c, traces.get(spec), output, backend, prov, trace_errors.get(spec))

    if pool is None:
        bar = _Progress(len(specs), "traces", progress)
        for s in specs:
            f = cf.Future()
            try:
                f.set_result(_generate(backend, s, trace_dir))
            except Exception as e:  # noqa: BLE001
                f.set_exception(e)
            on_trace(s, f)
            bar.update()
        bar.close()
        bar = _Progress(len(todo), "cases", progress)
        for c in todo:
            f = cf.Future()
            try:
                f.set_result(execute_case(*args_of(c)))
            except Exception as e:  # noqa: BLE001
                f.set_exception(e)
            on_case(c, f)
            bar.update()
        bar.close()
    else:
        bar = _Progress(len(specs), "traces", progress)
        futs = {pool.submit(_generate, backend, s, trace_dir): s for s in specs}
        for f in pool.as_completed(futs):
            on_trace(futs[f], f)
            bar.update()
        bar.close()
        bar = _Progress(len(todo), "cases", progress)
        futs = {pool.submit(execute_case, *args_of(c)): c for c in todo}
        for f in pool.as_completed(futs):
            on_case(futs[f], f)
            bar.update()
        bar.close()
        pool.close()
    summary.seconds = time.perf_counter() - t0
    return summary


class _LocalPool:
    """The default executor: worker processes on this machine (``concurrent.futures``)."""

    def __init__(self, jobs: int):
        self.pool = cf.ProcessPoolExecutor(max_workers=jobs)

    def submit(self, fn, *args):
        return self.pool.submit(fn, *args)

    @staticmethod
    def as_completed(futs):
        return cf.as_completed(futs)

    def close(self) -> None:
        self.pool.shutdown(wait=True)

    def abandon(self) -> None:
        """Cancel the pending jobs and terminate the workers (a running case is lost, not half
        written: records are linked into place atomically)."""
        procs = list((getattr(self.pool, "_processes", None) or {}).values())
        self.pool.shutdown(wait=False, cancel_futures=True)
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=5)


class _DaskPool:
    """``--executor dask[=ADDRESS]``: cases run as tasks on a Dask distributed cluster
    (``dask.distributed.Client``; the ``dask`` extra).  Without an address a ``LocalCluster`` of
    ``jobs`` single-threaded worker processes is started here and stopped at the end.  With one,
    the workers must see the output folder and the trace cache at the same paths (a shared file
    system): each worker writes its case's record itself, exactly as a local worker does.

    Raises:
        RuntimeError: dask.distributed is not installed (``pip install retainz[dask]``).
        ValueError: an empty scheduler address.
    """

    def __init__(self, executor: str, jobs: int, connect_timeout: float = 5.0):
        try:
            from dask.distributed import Client, LocalCluster
        except ImportError as e:
            raise RuntimeError(f"--executor dask needs dask.distributed (pip install 'retainz[dask]'): {e}") \
                from None
        _, _, address = executor.partition("=")
        self.cluster = None
        self.submitted: list = []
        if executor == "dask":
            self.cluster = LocalCluster(n_workers=jobs, threads_per_worker=1, processes=True,
                                        dashboard_address=None)
            self.client = Client(self.cluster)
        elif not address:
            raise ValueError("--executor dask=ADDRESS needs a scheduler address, e.g. dask=tcp://10.0.0.5:8786")
        else:
            try:
                self.client = Client(address, timeout=connect_timeout)
            except (OSError, TimeoutError) as e:
                raise ConnectionError(f"--executor dask={address}: no Dask scheduler answered within "
                                      f"{connect_timeout:g} s ({type(e).__name__}); is it running and "
                                      "reachable from here?") from None

    def submit(self, fn, *args):
        # pure=False: equal arguments are still separate runs (dask would otherwise merge them)
        f = self.client.submit(fn, *args, pure=False)
        self.submitted.append(f)
        return f

    @staticmethod
    def as_completed(futs):
        from dask.distributed import as_completed

        return as_completed(list(futs))

    def close(self) -> None:
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()

    def abandon(self) -> None:
        """Cancel every task still queued or running and stop a cluster started here."""
        try:
            self.client.cancel([f for f in self.submitted if not f.done()], force=True)
        finally:
            self.close()


def run_manifest(manifest: str, output: str, **kw) -> RunSummary:
    """Expand ``manifest`` and :func:`run_cases` it; keyword arguments as there."""
    _, cases = load_manifest(manifest)
    return run_cases(cases, output, **kw)
