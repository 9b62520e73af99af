"""A test double for trace generation + replay (tests only, never used by ``src``).

:class:`SyntheticReplayDouble` implements the runner's Backend interface with closed-form, deterministic
metrics that honour the replay contract (waf == (host + gc) / host, a capacity stop above a
per-policy pressure, decision cost growing with zones, a zone map in the agreed format).  It lets the
runner/verify/analysis tests run fast and exercise failure paths (policy ``fail`` raises) without the
store.  The integration tests use the real backend on tiny traces.
"""

from __future__ import annotations

import json
import math
import os
import time

from retainz.experiments.runner import Backend

#: policy -> (GC overhead factor, capacity-stop pressure)
_POLICY = {"retainz": (0.02, 0.97), "oracle": (0.0, 0.99), "zenfs": (0.30, 0.90), "greedy": (0.50, 0.85),
           "common": (0.25, 0.92), "dedicated": (0.05, 0.94), "retainz-nohint": (0.35, 0.90),
           "retainz-coarse": (0.12, 0.95), "zenfs-nohint": (0.40, 0.85)}


def _policy(policy: str) -> tuple[float, float]:
    name, _, params = policy.partition(":")
    if name == "retainz-noisy":
        err = float(dict(p.split("=") for p in params.split(","))["error"])
        return 0.02 + 0.2 * err, 0.97 - 0.05 * err
    return _POLICY[name]


class SyntheticReplayDouble(Backend):
    """Closed-form stand-in for ``retainz trace generate`` + ``retainz.trace.replay.replay``."""

    name = "synthetic-double"

    def __init__(self, delay: float = 0.0):
        self.delay = delay

    def generate_trace(self, spec, path: str) -> None:
        with open(path, "w") as f:
            f.write(json.dumps({"version": 1, "double": True, **spec.__dict__}) + "\n")
            for s in range(0, spec.steps, max(1, spec.steps // 10)):
                f.write(json.dumps({"ev": "save", "step": s}) + "\n")

    def replay(self, trace_path: str, case, workdir: str) -> dict:
        i = case.inputs
        if self.delay:
            time.sleep(self.delay)
        if i["policy"].startswith("fail"):
            raise ValueError("injected failure for policy fail")
        with open(trace_path) as f:
            header = json.loads(f.readline())
        assert header["layout"] == i["layout"]
        overhead, stop_p = _policy(i["policy"])
        scale = eval(i["scale"])  # noqa: S307 - "1/1024" from our own manifest
        gen_bytes = int(2 * 10**9 * scale) // 4096 * 4096
        gens = i["steps"] // 500
        host = gen_bytes * gens
        cap = i["zone_capacity"]
        peak_live = gen_bytes * 11
        zones = i["zones"] if i["zones"] is not None else math.ceil(peak_live / (cap * i["pressure"]))
        zones += i["reserve_zones"]
        p = i["pressure"] if i["pressure"] is not None else min(0.95, peak_live / (zones * cap))
        gc = int(host * overhead * p**4) // 4096 * 4096
        stop = None
        if p > stop_p:
            stop = int(i["steps"] * (1 - (p - stop_p))) // 500 * 500
        decisions = gens * (gen_bytes // cap + 1)
        per = 1e-6 * (zones if i["policy"] == "zenfs" else math.log2(zones + 1))
        if i["verify_summaries"]:
            per += 2e-7 * zones
        out = {
            "host_bytes": host, "gc_bytes": gc, "waf": (host + gc) / host, "resets": host // cap,
            "finishes": gens // 3, "dead_space_byte_steps": int(host * overhead * 1000),
            "unused_capacity_bytes": gens * 4096, "unused_capacity_byte_steps": gens * 4096 * 500,
            "peak_occupancy": int(peak_live * (1 + overhead)), "capacity_stop_step": stop,
            # the store's causes: ZenFS has no admission control, so its stops are the allocation's
            "capacity_stop_cause": None if stop is None else
            ("allocation" if i["policy"].startswith("zenfs") else "admission"),
            "capacity_stop_state": None if stop is None else
            {"empty_zones": 0, "open_free_bytes": int(cap * overhead) // 4096 * 4096,
             "dead_bytes": int(host * overhead) // 4096 * 4096, "live_bytes": peak_live},
            "generations_committed": gens if stop is None else stop // 500, "decisions": decisions,
            "decision_cpu_seconds": decisions * per, "trace_sha256": None, "worker_pid": os.getpid(),
            "geometry": {"zones": zones, "zone_size": i["zone_size"], "zone_capacity": cap,
                         "max_active": i["max_active"], "max_open": i["max_open"],
                         "reserve_zones": i["reserve_zones"]},
        }
        if i["device"] == "file":
            out["payload_bytes_written"] = host
            out["bytes_verified"] = host
        if i["zone_map"]:
            nb, nz = min(20, gens), min(zones, 16)
            live = [[(b * 7 + z * 13) % 60 for z in range(nz)] for b in range(nb)]
            dead = [[int(overhead * 100 * ((b + z) % 3)) % 40 for z in range(nz)] for b in range(nb)]
            unused = [[(5 if (b + z) % 5 == 0 else 0) for z in range(nz)] for b in range(nb)]
            out["zone_map"] = {"format": 1, "steps": [(b + 1) * i["steps"] // nb for b in range(nb)],
                               "zones": zones, "groups": nz, "live": live, "dead": dead, "unused": unused}
        del out["trace_sha256"]
        return out


def records(d: str) -> dict:
    """The records of ``d`` as verify and analysis read them: ``*.json`` files, not the hidden ``.tmp-*``
    file a worker killed mid-write (Ctrl-C) can leave behind."""
    return {n[:-5]: json.load(open(os.path.join(d, n))) for n in os.listdir(d)
            if n.endswith(".json") and not n.startswith(".")}


#: ``python -c`` script: ``retainz run MANIFEST OUT`` with this double (argv: delay, manifest, out, extra args).
INTERRUPTIBLE = """
import sys
from retainz.cli import main
import retainz.experiments.runner as runner
from tests.replay_double import SyntheticReplayDouble

runner.RetainZBackend = lambda: SyntheticReplayDouble(delay=float(sys.argv[1]))
sys.exit(main(["run", sys.argv[2], "--output", sys.argv[3], "--jobs", "2", "--no-progress"] + sys.argv[4:]))
"""


def interrupt_then_resume(tmp_path, defaults: dict, extra: list[str], *, appear: float, stop: float,
                          resume: float) -> None:
    """Ctrl-C a ``retainz run`` of 20 one-second cases once a record exists, then ``--resume`` it.

    Asserts: exit 130 with "interrupted", 1..19 complete ok records kept, the resumed run completes all
    20 and they verify.  ``extra``: more ``retainz run`` arguments (an executor); timeouts in seconds."""
    import signal
    import subprocess
    import sys

    from retainz.experiments.verify import verify_dir
    from tests.interrupts import default_sigint

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    m = {"manifest": "t", "format": 1, "defaults": defaults,
         "blocks": [{"experiment": "pressure", "axes": {"policy": ["retainz", "zenfs", "greedy", "common"],
                                                        "pressure": [0.5, 0.6, 0.7, 0.8, 0.9]}}]}
    (tmp_path / "m.json").write_text(json.dumps(m))
    out = tmp_path / "out"
    argv = [sys.executable, "-c", INTERRUPTIBLE, "1.0", str(tmp_path / "m.json"), str(out), *extra]
    p = subprocess.Popen(argv, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=default_sigint)
    try:
        deadline = time.monotonic() + appear
        while time.monotonic() < deadline and not (out.is_dir() and records(out)):
            time.sleep(0.05)
        assert records(out), "no record appeared"
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=stop)   # 20 cases x 1 s on 2 workers would take 10 s more
    finally:
        p.kill()
        p.wait()
    assert p.returncode == 130, err
    assert "interrupted" in err
    kept = records(out)
    assert 1 <= len(kept) < 20
    assert all(r["status"] == "ok" for r in kept.values())
    done = subprocess.run(argv[:3] + ["0", str(tmp_path / "m.json"), str(out), *extra, "--resume"], cwd=root,
                          capture_output=True, text=True, timeout=resume)
    assert done.returncode == 0, done.stderr
    assert len(records(out)) == 20
    assert verify_dir(str(out)) == (20, [])

