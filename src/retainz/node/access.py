"""Who may do what through the node service (docs/node.md, "Access control").

A client says in ``hello`` which **job** it writes for: a series folder (:mod:`retainz.ids`),
``""`` for the device's root series, or ``*`` for the whole device.  Its **scope** is what it may list,
read, begin, re-hint and delete:

* job ``"jobs/a"``: every generation whose path (:func:`~retainz.ids.generation_path`) lies
  under ``jobs/a/`` (``jobs/a/step-5``, ``jobs/a/sub/x``; not ``jobs/a2/step-5``);
* job ``""`` (the root series, the default): the generations whose path has no folder (``step-500``,
  the ids ``ZonedStorageWriter`` gives without ``series=``);
* job ``*``: every generation.  Only the service's own user (the kernel's peer credentials,
  ``SO_PEERCRED``: its uid, or root) may ask for it, unless the operator granted it.

The operator grants more with ``retainz serve``: ``--allow-all`` (every client's scope is the whole
device: one trusted tenant) or ``--grant JOB=SERIES`` (JOB's scope also holds SERIES's generations;
``SERIES`` ``*`` for all of them).  A job is declared, not proven: any client allowed on the socket may
declare any job except ``*``.  The scope keeps a job's retention, listings and deletes from touching
another job's checkpoints by mistake; the boundary between users is the socket's mode and group and the
device file's permissions (a client that may write the device file may write any byte of it).
"""

from __future__ import annotations

from retainz.errors import AccessDeniedError
from retainz.ids import generation_path, series_folder, series_generation_id

__all__ = ["ALL", "Scope", "parse_job", "parse_grant", "scope_for"]

#: The job that means the whole device.
ALL = "*"


def parse_job(text: str) -> str:
    """A job as ``hello`` carries it: ``*``, or a series folder normalised (``"/jobs/a/"`` ->
    ``"jobs/a"``; ``""`` the root series).

    Raises:
        ValueError: a malformed series (an empty, ``.`` or ``..`` component, a ``#``), or a ``*``
            inside a folder name.
    """
    if text == ALL:
        return ALL
    if "*" in text:
        raise ValueError(f"job {text!r}: '*' alone names the whole device; a series folder holds no '*'")
    return series_folder(text)


def parse_grant(text: str) -> tuple[str, str]:
    """``JOB=SERIES`` (``retainz serve --grant``) as ``(job, series)``; ``SERIES`` may be ``*``.

    Raises:
        ValueError: no ``=``, or a malformed job or series (:func:`parse_job`).
    """
    job, eq, series = text.partition("=")
    if not eq:
        raise ValueError(f"--grant {text!r}: expected JOB=SERIES (SERIES a folder, or * for every job)")
    return parse_job(job), parse_job(series)


class Scope:
    """The generations one client may see and change: a set of series folders (each with every folder
    below it, the root series alone for ``""``), or all of them.

    Attributes:
        job: the client's declared job; series: the folders (``None``: the whole device).
    """

    __slots__ = ("job", "series")

    def __init__(self, job: str, series: frozenset[str] | None):
        self.job = job
        self.series = series

    @property
    def everything(self) -> bool:
        return self.series is None

    def allows(self, gen_id: str) -> bool:
        """True when generation ``gen_id`` is in this scope (its path under one of the folders)."""
        if self.series is None:
            return True
        path = generation_path(gen_id).strip("/")
        for s in self.series:
            if (s == "" and "/" not in path) or (s and path.startswith(s + "/")):
                return True
        return False

    def check(self, gen_id: str, what: str) -> None:
        """Raise unless ``gen_id`` is in scope.

        Raises:
            AccessDeniedError: one line naming the job, the generation and what to do: for a root-series
                id (``step-1``) asked for by a job with a series, the id it has in that series
                (``jobs%2Fb%2Fstep-1``, :func:`retainz.ids.series_generation_id`), since the job was
                declared and only the id was not of its series.
        """
        if not self.allows(gen_id):
            where = "the root series" if self.job == "" else f"series {self.job!r}"
            path = generation_path(gen_id)
            todo = "declare its job (RETAINZ_JOB) or have the operator grant it (retainz serve --grant JOB=SERIES, --allow-all)"
            if self.job != "" and "/" not in path.strip("/"):
                try:
                    todo = (f"in series {self.job!r} its id is {series_generation_id(self.job, path)!r} (or have "
                            "the operator grant it: retainz serve --grant JOB=SERIES, --allow-all)")
                except ValueError:     # a name no checkpoint directory can have: the general advice
                    pass
            raise AccessDeniedError(f"job {self.job!r} may not {what} generation {gen_id!r} ({path!r} is outside "
                                    f"{where}): {todo}")

    def to_json(self) -> list[str] | None:
        return None if self.series is None else sorted(self.series)


def scope_for(job: str, *, peer_uid: int | None, owner_uid: int, allow_all: bool = False,
              grants: dict[str, frozenset[str]] | None = None) -> Scope:
    """The scope of a client that declared ``job`` (:func:`parse_job`'s form).

    Args:
        peer_uid: the client's uid from the kernel (``SO_PEERCRED``; ``None`` when unknown: treated
            as another user).
        owner_uid: the service's own uid.
        allow_all: ``retainz serve --allow-all``.
        grants: ``{job: {series, ...}}`` from ``--grant``.

    Raises:
        AccessDeniedError: job ``*`` from a client that is neither the service's user nor root, without
            a grant of ``*``.
    """
    extra = (grants or {}).get(job, frozenset())
    if allow_all or ALL in extra:
        return Scope(job, None)
    if job == ALL:
        if peer_uid is not None and peer_uid in (0, owner_uid):
            return Scope(job, None)
        raise AccessDeniedError(f"job '*' (the whole device) is for the service's own user (uid {owner_uid}); "
                                f"this client is uid {peer_uid}: declare a job, or have the operator grant it "
                                "(retainz serve --grant '*=*' or --allow-all)")
    return Scope(job, frozenset({job, *extra}))
