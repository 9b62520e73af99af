"""Who may do what through the node service (retainz.node.access, docs/node.md "Access control"): the
socket's mode and group, each client's job and what it may see and change, the operator's grants, and a
fuzzed request stream that names other jobs' generations."""

from __future__ import annotations

import grp
import os
import socket
import stat
import subprocess
import sys
import threading

import pytest

from retainz.errors import AccessDeniedError, GenerationNotFoundError
from retainz.hint import Hint
from retainz.node import NodeStore, Service, socket_path
from retainz.node.access import ALL, parse_grant, parse_job, scope_for
from retainz.node.protocol import recv_frame, send_frame
from retainz.store import Store
from retainz.zoned import FileDevice, Geometry
from tests.node.test_node import ENV, make_device

SMALL = Geometry(nr_zones=32, zone_size=4 << 20, zone_capacity=4 << 20)
A, A_NESTED, A2, B, ROOT_GEN = "jobs%2Fa%2Fstep-1", "jobs%2Fa%2Fsub%2Fx", "jobs%2Fa2%2Fstep-1", "jobs%2Fb%2Fstep-1", "step-1"


def serving(device: str, **kw):
    """An in-process Service of ``device`` (a thread); returns (service, stop)."""
    dev = FileDevice(device)
    store = Store.open(dev)
    svc = Service(store, kw.pop("path", None) or socket_path(device), **kw)
    t = threading.Thread(target=svc.serve_forever, daemon=True)
    t.start()

    def stop():
        svc.close()
        t.join()
        dev.close()
    return svc, stop


@pytest.fixture
def device(tmp_path):
    return make_device(tmp_path, SMALL)


def put(client: NodeStore, gen: str, data: bytes) -> None:
    w = client.begin_generation(gen, 1)
    w.write_shard("x", [data])
    w.commit()


def test_the_socket_is_for_its_owner_only_or_for_the_group_the_operator_names(device, tmp_path):
    svc, stop = serving(device)
    try:
        st = os.stat(svc.path)
        assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()
    finally:
        stop()
    if os.geteuid() != 0:
        pytest.skip("giving the socket to another group needs root")
    group = grp.getgrnam("daemon")
    svc, stop = serving(device, mode=0o660, group="daemon")
    try:
        st = os.stat(svc.path)
        assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == group.gr_gid
    finally:
        stop()
    assert not os.path.exists(socket_path(device))


def test_a_job_sees_and_changes_only_the_generations_of_its_series(device):
    svc, stop = serving(device)
    data = {g: os.urandom(5000 + i) for i, g in enumerate((A, A_NESTED, B, ROOT_GEN))}
    try:
        with NodeStore.connect(device, job="jobs/a") as a, NodeStore.connect(device, job="/jobs/b/") as b, \
                NodeStore.connect(device) as root, NodeStore.connect(device, job=ALL) as every:
            assert (a.scope, b.scope, root.scope, every.scope) == (["jobs/a"], ["jobs/b"], [""], None)
            put(a, A, data[A])
            put(a, A_NESTED, data[A_NESTED])          # a folder below the job's is the job's
            put(b, B, data[B])
            put(root, ROOT_GEN, data[ROOT_GEN])
            for other in (A2, B, ROOT_GEN):            # jobs/a2 starts like jobs/a but is another job
                with pytest.raises(AccessDeniedError, match="job 'jobs/a' may not write"):
                    a.begin_generation(other, 2)
            assert [g.id for g in a.generations()] == [A, A_NESTED]
            assert [g.id for g in b.generations()] == [B]
            assert [g.id for g in root.generations()] == [ROOT_GEN]
            assert sorted(g.id for g in every.generations()) == sorted(data)
            # every request naming another job's generation is refused, whether it exists or not
            for gen in (A, "jobs%2Fa%2Fnever"):
                for call in (lambda g=gen: b.generation(g), lambda g=gen: b.read_shard(g, "x"),
                             lambda g=gen: b.read_shard_extent(g, "x", 0), lambda g=gen: b.delete(g),
                             lambda g=gen: b.update_hint(g, Hint(reclaim_step=9)), lambda g=gen: root.delete(g),
                             lambda g=gen: b.begin_generation(g, 5, replace=True)):
                    with pytest.raises(AccessDeniedError, match=r"outside series 'jobs/b'|outside the root series"):
                        call()
            with pytest.raises(GenerationNotFoundError):       # inside its scope: the store's own answer
                a.generation("jobs%2Fa%2Fnever")
            a.delete(A_NESTED)
            every.delete(ROOT_GEN)                             # the whole-device view may
            for g, c in ((A, a), (B, b)):
                assert b"".join(c.read_shard(g, "x")) == data[g]
            assert sorted(g.id for g in every.generations()) == [A, B]
    finally:
        stop()


def test_the_operator_grants_a_job_more_series_or_every_client_the_whole_device(device):
    svc, stop = serving(device, grants={"jobs/eval": frozenset({"jobs/a"})})
    try:
        with NodeStore.connect(device, job="jobs/a") as a, NodeStore.connect(device, job="jobs/b") as b:
            put(a, A, b"a" * 100)
            put(b, B, b"b" * 100)
        with NodeStore.connect(device, job="jobs/eval") as ev:
            assert ev.scope == ["jobs/a", "jobs/eval"]
            assert [g.id for g in ev.generations()] == [A]
            assert b"".join(ev.read_shard(A, "x")) == b"a" * 100
            with pytest.raises(AccessDeniedError):
                ev.generation(B)
    finally:
        stop()
    svc, stop = serving(device, allow_all=True)
    try:
        with NodeStore.connect(device, job="jobs/b") as b:
            assert b.scope is None and sorted(g.id for g in b.generations()) == [A, B]
            b.delete(A)
            assert [g.id for g in b.generations()] == [B]
    finally:
        stop()


def test_the_whole_device_view_is_for_the_services_own_user_unless_granted():
    assert scope_for(ALL, peer_uid=1000, owner_uid=1000).everything
    assert scope_for(ALL, peer_uid=0, owner_uid=1000).everything
    for peer in (1001, None):
        with pytest.raises(AccessDeniedError, match="uid 1000"):
            scope_for(ALL, peer_uid=peer, owner_uid=1000)
    assert scope_for(ALL, peer_uid=1001, owner_uid=1000, grants={ALL: frozenset({ALL})}).everything
    assert scope_for(ALL, peer_uid=1001, owner_uid=1000, allow_all=True).everything
    assert scope_for("jobs/a", peer_uid=1001, owner_uid=1000, grants={"jobs/a": frozenset({ALL})}).everything
    assert parse_job("/jobs/a/") == "jobs/a" and parse_job("") == "" and parse_job("*") == "*"
    assert parse_grant("jobs/eval=jobs/a") == ("jobs/eval", "jobs/a")
    for bad in ("jobs/*", "a/../b", "a//b", "x#1"):
        with pytest.raises(ValueError):
            parse_job(bad)
    for bad in ("jobs/eval", "jobs/eval=a/../b"):
        with pytest.raises(ValueError):
            parse_grant(bad)


@pytest.mark.skipif(os.geteuid() != 0, reason="a client of another uid needs root to make")
def test_a_client_of_another_user_is_refused_the_whole_device_by_its_kernel_credentials(device, tmp_path):
    """The uid comes from SO_PEERCRED, not from the request: a forked client that became nobody asks
    for job '*' and is refused; as a job it is served (metadata only: it cannot open the device file)."""
    import tempfile

    run = tempfile.mkdtemp(prefix="retainz-peer-")       # under /tmp: a path nobody can reach
    os.chmod(run, 0o777)
    path = os.path.join(run, "node.sock")
    svc, stop = serving(device, path=path, mode=0o666)
    try:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:          # the child: become nobody, then talk to the service
            try:
                os.setgid(65534)
                os.setuid(65534)
                out = []
                for job in ("*", "jobs/n"):
                    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    s.connect(path)
                    send_frame(s, {"op": "hello", "protocol": 1, "job": job})
                    rep = recv_frame(s, 1 << 20)
                    out.append(f"{rep['ok']} {rep.get('error')} {rep.get('scope')}")
                    if rep["ok"]:
                        send_frame(s, {"op": "begin", "gen": "jobs%2Fn%2Fs", "step": 1})
                        wr = recv_frame(s, 1 << 20)["writer"]
                        send_frame(s, {"op": "commit", "writer": wr})
                        out.append(str(recv_frame(s, 1 << 20)["ok"]))
                    s.close()
                os.write(w, "\n".join(out).encode())
            except BaseException as e:
                os.write(w, f"child: {e!r}".encode())
            finally:
                os._exit(0)
        os.close(w)
        with os.fdopen(r) as f:
            got = f.read().splitlines()
        os.waitpid(pid, 0)
        assert got == ["False AccessDeniedError None", "True None ['jobs/n']", "True"]
        assert [g.id for g in svc.store.generations()] == ["jobs%2Fn%2Fs"]
    finally:
        stop()
        os.rmdir(run)


def test_retainz_serve_refuses_a_malformed_grant_or_an_unknown_group_in_one_line(device):
    for args, what in ((["--grant", "jobs/eval"], "expected JOB=SERIES"), (["--grant", "a=b/../c"], "series"),
                       (["--group", "no-such-group-29"], "no such group")):
        r = subprocess.run([sys.executable, "-m", "retainz.cli", "serve", device, *args], env=ENV,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and what in r.stderr, (args, r.stderr)
        assert not os.path.exists(socket_path(device))


def test_a_fuzzed_request_stream_naming_other_jobs_generations_changes_nothing_of_theirs(device):
    """Malformed frames, wrong types, huge lengths and sizes, handles and crcs that were never handed
    out, and requests naming the generations of another job: the service answers each (never an
    InternalError), the other job's generations stay byte for byte, and fsck stays clean."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    svc, stop = serving(device)
    try:
        theirs = {A: os.urandom(70_000), B: os.urandom(3 << 20)}
        with NodeStore.connect(device, job="jobs/a") as a, NodeStore.connect(device, job="jobs/b") as b:
            put(a, A, theirs[A])
            put(b, B, theirs[B])
        ops = ["hello", "begin", "open_shard", "claim", "written", "close_shard", "abort_shard", "commit", "abort",
               "leave", "delete", "list", "generation", "locations", "update_hint", "advance", "df", "gc", "bye"]
        ids = st.sampled_from([A, B, "jobs%2Fa", "jobs%2Ff%2Fg", "jobs%2Ff%2Fh", "step-1", "../x", "", "x" * 256])
        scalar = st.one_of(st.none(), st.booleans(), st.integers(-2, 1 << 70), st.integers(0, 6),
                           st.floats(allow_nan=False, allow_infinity=False),
                           st.text(max_size=20), st.just(float(1 << 80)), ids)
        value = st.one_of(scalar, st.lists(st.integers(-1, 1 << 33), max_size=70), st.dictionaries(
            st.sampled_from(["reclaim_step", "lifetime", "condition"]), scalar, max_size=3))
        keys = st.sampled_from(["gen", "step", "hint", "declared_size", "replace", "writer", "name", "size",
                                "shard", "nbytes", "crcs", "start", "count", "force", "job", "join", "protocol"])

        def request(op, extra):
            req = {**extra, "op": op}
            if op == "hello" and req.get("job") == ALL:
                req["job"] = "jobs/f"      # the whole-device view is this user's right; the fuzz is a job
            return req

        reqs = st.builds(request, st.sampled_from(ops), st.dictionaries(keys, value, max_size=5))
        frame = st.one_of(reqs, reqs, reqs, st.binary(max_size=30).map(lambda b: ("raw", b)),
                          st.integers(0, (1 << 32) - 1).map(lambda n: ("len", n)))

        @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None,
                  derandomize=True)
        @given(st.sampled_from(["jobs/f", "", "jobs/a2"]), st.lists(frame, min_size=1, max_size=30))
        def run(job, frames):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(60)
            s.connect(svc.path)
            try:
                send_frame(s, {"op": "hello", "protocol": 1, "job": job})
                assert recv_frame(s, 1 << 20)["ok"] is True
                for f in frames:
                    try:          # the service hangs up after a frame that breaks the framing
                        if isinstance(f, dict):
                            send_frame(s, f)
                        elif f[0] == "raw":
                            s.sendall(len(f[1]).to_bytes(4, "little") + f[1])
                        else:
                            s.sendall(f[1].to_bytes(4, "little"))
                            if 0 < f[1] <= 64 << 10:
                                s.shutdown(socket.SHUT_WR)    # a frame cut short
                        r = recv_frame(s, 16 << 20)
                    except OSError:
                        return
                    if r is None:
                        return
                    assert type(r.get("ok")) is bool and r.get("error") != "InternalError", (f, r)
                    assert r["ok"] or ("\n" not in r["message"] and r["message"]), r
            finally:
                s.close()

        run()
        with NodeStore.connect(device, job=ALL) as every:
            for gen, want in theirs.items():
                assert b"".join(every.read_shard(gen, "x")) == want
            assert {g.id for g in every.generations()} >= set(theirs)
            a_or_b = scope_for("jobs/a", peer_uid=0, owner_uid=0, grants={"jobs/a": frozenset({"jobs/b"})})
            assert {g.id for g in every.generations() if a_or_b.allows(g.id)} == set(theirs)   # none new there
            rep = every.fsck()
            assert rep.ok, rep.problems
        assert svc.store.recompute_table().key() == svc.store.table.key()
    finally:
        stop()
    dev = FileDevice(device)         # and the device as a fresh open sees it: recovery and fsck clean
    with Store.open(dev) as store:
        assert store.fsck().ok
        for gen, want in theirs.items():
            assert b"".join(store.read_shard(gen, "x")) == want
    dev.close()


def test_a_store_command_naming_a_root_id_under_a_job_is_told_the_id_in_its_series(device, tmp_path, capsys,
                                                                                 monkeypatch):
    """``RETAINZ_JOB=jobs/b retainz put DEV step-1 FILE`` through a service: the refusal gives the id the
    generation has in the job's series (``jobs%2Fb%2Fstep-1``), which then works; it told the client to
    declare its job (RETAINZ_JOB), which it had (a fresh-user trial)."""
    from retainz.cli import main

    src = tmp_path / "model.bin"
    src.write_bytes(b"m" * 10_000)
    svc, stop = serving(device)
    try:
        monkeypatch.setenv("RETAINZ_JOB", "jobs/b")
        capsys.readouterr()
        assert main(["put", device, "step-1", str(src), "--step", "1"]) == 1
        err = capsys.readouterr().err
        assert err == ("retainz: error: job 'jobs/b' may not write generation 'step-1' ('step-1' is outside "
                       "series 'jobs/b'): in series 'jobs/b' its id is 'jobs%2Fb%2Fstep-1' (or have the "
                       "operator grant it: retainz serve --grant JOB=SERIES, --allow-all)\n"), err
        assert main(["put", device, "jobs%2Fb%2Fstep-1", str(src), "--step", "1"]) == 0
        capsys.readouterr()
        assert main(["ls", device]) == 0
        assert capsys.readouterr().out.startswith("jobs%2Fb%2Fstep-1\tstep 1\t")
    finally:
        stop()
    # another job's generation (not a root id) keeps the advice to declare the job or be granted it
    with pytest.raises(AccessDeniedError, match=r"outside series 'jobs/b'\): declare its job \(RETAINZ_JOB\)"):
        scope_for("jobs/b", peer_uid=os.geteuid(), owner_uid=os.geteuid()).check(A, "delete")
