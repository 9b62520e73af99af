"""Trace format v1: round trips, the schema, and a line-numbered error for every kind of malformed line."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest

from retainz.cli import main
from retainz.hint import Lifetime
from retainz.trace import (
    CommitEvent,
    DeleteEvent,
    SaveEvent,
    Shard,
    TraceFormatError,
    TraceHeader,
    TraceReader,
    TraceWriter,
    actual_reclaim_steps,
    generate_trace,
    read_trace,
    write_generated,
    write_trace,
)

SCHEMA = Path(__file__).resolve().parents[2] / "docs" / "trace-v1.schema.json"

SPECS = [
    ("smollm2-135m-dcp", "torchtitan:interval=10,keep_latest_k=3,async=true"),
    ("pythia-1b", "megatron:save_interval=10,retain_interval=30,non_persistent_interval=5"),
    ("llama3-8b-fsdp:ranks=4", "lightning:every_n_train_steps=10,save_top_k=3,save_last=true"),
    ("smollm2-135m-dcp", "hf:save_steps=10,save_total_limit=2,metric=synthetic"),
    ("pythia-1b", "accelerate:save_steps=10,total_limit=2"),
    ("smollm2-135m-dcp", "orbax:latest=2,every_steps=50,save_interval_steps=5"),
]


@pytest.mark.parametrize("layout, spec", SPECS)
def test_generated_trace_round_trips(tmp_path, layout, spec):
    trace = generate_trace(layout, spec, 200, seed=4, crash_every=4)
    path = str(tmp_path / "t.jsonl")
    write_trace(path, trace)
    back = read_trace(path)
    assert back.header == trace.header
    assert back.events == trace.events
    assert any(e.type == "crash" for e in back.events)


@pytest.mark.parametrize("layout, spec", SPECS)
def test_generated_traces_match_the_json_schema(tmp_path, layout, spec):
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    path = tmp_path / "t.jsonl"
    write_generated(str(path), layout, spec, 150, seed=1, crash_every=5)
    lines = path.read_text().splitlines()
    assert len(lines) > 20
    for line in lines:
        errors = list(validator.iter_errors(json.loads(line)))
        assert not errors, (line, errors[0].message)
    # the schema is not a rubber stamp
    bad = json.loads(lines[1])
    bad["shards"][0][1] = -1
    assert list(validator.iter_errors(bad))


def test_generation_is_deterministic_for_a_seed(tmp_path):
    spec = "lightning:every_n_train_steps=10,save_top_k=3"
    a, b, c = (tmp_path / n for n in "abc")
    write_generated(str(a), "pythia-1b", spec, 2000, seed=7)
    write_generated(str(b), "pythia-1b", spec, 2000, seed=7)
    write_generated(str(c), "pythia-1b", spec, 2000, seed=8)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()


def test_trace_header_and_save_fields():
    trace = generate_trace("smollm2-135m-dcp", "torchtitan:interval=10,keep_latest_k=2", 35)
    h = trace.header
    assert (h.version, h.layout["name"], h.retention, h.seed, h.crash_every) == (
        1, "smollm2-135m-dcp", "torchtitan:interval=10,keep_latest_k=2,async=false,last_save_model_only=true", 0, None)
    assert h.schedule == {"steps": 35, "saves": 4, "base_interval": 10}
    first = trace.events[0]
    assert isinstance(first, SaveEvent)
    assert (first.name, first.step, first.cls, first.model_only) == ("step-10", 10, "interval", False)
    assert first.shards == (Shard("__0_0.distcp", 1_729_172_338), Shard(".metadata", 298_686))
    assert first.hint.reclaim_step == 30 and first.hint.lifetime == Lifetime.SHORT
    assert first.hint.condition == "after_newer:k=2,of_class=interval,timing=after_commit"
    last = trace.events[-2]
    assert last.model_only and last.hint.reclaim_step == math.inf and last.hint.lifetime == 5
    assert not any(e.type == "crash" for e in trace.events)


# -- malformed lines -----------------------------------------------------------------------------------

HEADER = {"type": "header", "version": 1, "layout": {"name": "x", "source": "test"}, "retention": "torchtitan",
          "schedule": {"steps": 100}, "seed": 0, "crash_every": None, "generator": "test"}
HINT = {"condition": {"kind": "after_newer", "k": 2, "of_class": "interval", "timing": "after_commit"},
        "predicted_reclaim_step": 30, "lifetime": "SHORT"}


def save(gen, step, **kw):
    ev = {"type": "save", "step": step, "gen": gen, "name": f"step-{step}", "class": "interval",
          "model_only": False, "shards": [["a", 10], ["b", 0]], "hint": HINT}
    ev.update(kw)
    return ev


def commit(gen, step):
    return {"type": "commit", "step": step, "gen": gen}


def delete(gen, step):
    return {"type": "delete", "step": step, "gen": gen}


def lines_of(*objs):
    return [o if isinstance(o, str) else json.dumps(o) for o in objs]


def with_hint(**kw):
    h = json.loads(json.dumps(HINT))
    h.update(kw)
    return h


def with_cond(**kw):
    return with_hint(condition={**HINT["condition"], **kw})


GOOD = [HEADER, save(0, 10), commit(0, 10), save(1, 20), commit(1, 20), save(2, 30), commit(2, 30), delete(0, 30)]

BAD = {  # name: (lines, bad line number, message fragment)
    "not json": (lines_of(HEADER, save(0, 10), "{oops"), 3, "not valid JSON"),
    "not an object": (lines_of(HEADER, "[1, 2]"), 2, "must be a JSON object"),
    "blank line": (lines_of(HEADER, save(0, 10), "", commit(0, 10)), 3, "empty line"),
    "empty file": ([], 1, "no header"),
    "unknown version": (lines_of({**HEADER, "version": 2}), 1, "unsupported trace version 2"),
    "version as string": (lines_of({**HEADER, "version": "1"}), 1, "unsupported trace version \"1\""),
    "no header": (lines_of(save(0, 10)), 1, "must be the header"),
    "header without retention": (lines_of({k: v for k, v in HEADER.items() if k != "retention"}), 1,
                                 "missing field 'retention'"),
    "second header": (lines_of(HEADER, save(0, 10), HEADER), 3, "a second header"),
    "unknown type": (lines_of(HEADER, {"type": "rename", "step": 1, "gen": 0}), 2, "unknown event type \"rename\""),
    "missing field": (lines_of(HEADER, save(0, 10), {"type": "commit", "step": 10}), 3, "missing field 'gen'"),
    "unknown field": (lines_of(HEADER, save(0, 10, color="red")), 2, "unknown field(s) 'color'"),
    "gen not an integer": (lines_of(HEADER, save("a", 10)), 2, "gen must be an integer"),
    "bool is not an integer": (lines_of(HEADER, save(0, True)), 2, "step must be an integer"),
    "negative step": (lines_of(HEADER, save(0, -5)), 2, "step must be >= 0"),
    "negative size": (lines_of(HEADER, save(0, 10, shards=[["a", -1]])), 2, "negative size -1"),
    "size not an integer": (lines_of(HEADER, save(0, 10, shards=[["a", 1.5]])), 2, "size must be an integer"),
    "empty shards": (lines_of(HEADER, save(0, 10, shards=[])), 2, "shards must be a non-empty list"),
    "malformed shard": (lines_of(HEADER, save(0, 10, shards=[["a"]])), 2, "shard 0 must be [name, bytes]"),
    "shard twice": (lines_of(HEADER, save(0, 10, shards=[["a", 1], ["a", 2]])), 2, "appears twice"),
    "empty name": (lines_of(HEADER, save(0, 10, name="")), 2, "name must be a non-empty string"),
    "model_only not bool": (lines_of(HEADER, save(0, 10, model_only=1)), 2, "model_only must be true or false"),
    "duplicate generation": (lines_of(HEADER, save(0, 10), commit(0, 10), save(0, 20)), 4, "duplicate generation 0"),
    "commit before save": (lines_of(HEADER, commit(0, 10)), 2, "commit of generation 0 before any save"),
    "commit twice": (lines_of(HEADER, save(0, 10), commit(0, 10), commit(0, 10)), 4, "which is committed"),
    "delete of unknown generation": (lines_of(HEADER, save(0, 10), commit(0, 10), delete(7, 10)), 4,
                                     "delete of unknown generation 7"),
    "delete before commit": (lines_of(HEADER, save(0, 10), delete(0, 10)), 3, "which is writing"),
    "delete twice": (lines_of(HEADER, save(0, 10), commit(0, 10), delete(0, 20), delete(0, 20)), 5, "which is deleted"),
    "steps go back": (lines_of(HEADER, save(0, 10), commit(0, 10), save(1, 5)), 4, "step 5 goes back"),
    "commit after crash": (lines_of(HEADER, save(0, 10), {"type": "crash", "step": 10, "gen": 0}, commit(0, 10)), 4,
                           "which is abandoned"),
    "crash of a committed generation": (lines_of(HEADER, save(0, 10), commit(0, 10), {"type": "crash", "step": 10, "gen": 0}),
                                        4, "not in flight"),
    "delete of an abandoned generation": (lines_of(HEADER, save(0, 10), {"type": "crash", "step": 10, "gen": 0},
                                                   delete(0, 10)), 4, "which is abandoned"),
    "hint not an object": (lines_of(HEADER, save(0, 10, hint=3)), 2, "hint must be an object or null"),
    "unknown lifetime": (lines_of(HEADER, save(0, 10, hint=with_hint(lifetime="FOREVER"))), 2, "lifetime must be one of"),
    "bad predicted step": (lines_of(HEADER, save(0, 10, hint=with_hint(predicted_reclaim_step="never"))), 2,
                           "predicted_reclaim_step must be a step number"),
    "unknown condition kind": (lines_of(HEADER, save(0, 10, hint=with_hint(condition={"kind": "maybe"}))), 2,
                               "unknown kind \"maybe\""),
    "condition k zero": (lines_of(HEADER, save(0, 10, hint=with_cond(k=0))), 2, "k must be >= 1"),
    "condition bad timing": (lines_of(HEADER, save(0, 10, hint=with_cond(timing="later"))), 2, "timing must be one of"),
    "probability out of range": (lines_of(HEADER, save(0, 10, hint=with_hint(condition={
        "kind": "uncertain", "earliest": 20, "probability": 1.5, "expected": None, "basis": ""}))), 2,
        "probability must be a number in [0, 1]"),
    "NaN": (lines_of(HEADER, '{"type": "commit", "step": NaN, "gen": 0}'), 2, "NaN is not valid JSON"),
    "duplicate key": (lines_of(HEADER, '{"type": "commit", "step": 1, "step": 2, "gen": 0}'), 2, "duplicate key 'step'"),
}


def write_lines(tmp_path, lines) -> str:
    p = tmp_path / "t.jsonl"
    p.write_text("".join(line + "\n" for line in lines))
    return str(p)


def test_the_good_trace_is_good(tmp_path):
    t = read_trace(write_lines(tmp_path, lines_of(*GOOD)))
    assert [e.type for e in t.events] == ["save", "commit", "save", "commit", "save", "commit", "delete"]
    assert t.events[-1] == DeleteEvent(30, 0)


@pytest.mark.parametrize("name", list(BAD))
def test_malformed_lines_fail_with_their_line_number(tmp_path, name):
    lines, lineno, fragment = BAD[name]
    path = write_lines(tmp_path, lines)
    with pytest.raises(TraceFormatError) as e:
        read_trace(path)
    assert e.value.line == lineno
    assert str(e.value).startswith(f"{path}:{lineno}: ")
    assert fragment in str(e.value)


def test_reader_streams_and_stops_at_the_first_bad_line(tmp_path):
    path = write_lines(tmp_path, lines_of(HEADER, save(0, 10), commit(0, 10), commit(0, 10), "{oops"))
    seen = []
    with pytest.raises(TraceFormatError) as e:
        with TraceReader(path) as r:
            for ev in r:
                seen.append(ev)
    assert seen == [read_trace(write_lines(tmp_path, lines_of(HEADER, save(0, 10)))).events[0], CommitEvent(10, 0)]
    assert e.value.line == 4


def test_writer_refuses_what_the_reader_would_refuse():
    buf = io.StringIO()
    header = TraceHeader({"name": "x"}, "torchtitan", {"steps": 10}, 0)
    w = TraceWriter(buf, header)
    w.write(SaveEvent(10, 0, "step-10", "interval", (Shard("a", 1),)))
    with pytest.raises(TraceFormatError, match="<trace>:3: delete of generation 0, which is writing"):
        w.write(DeleteEvent(10, 0))
    with pytest.raises(TraceFormatError, match="commit of generation 5 before any save"):
        w.write(CommitEvent(10, 5))


# -- CLI -------------------------------------------------------------------------------------------------

def test_cli_generate_then_validate(tmp_path, capsys):
    out = tmp_path / "t.jsonl"
    rc = main(["trace", "generate", "--layout", "llama3-8b-fsdp:ranks=2", "--retention",
               "megatron:save_interval=100,retain_interval=500", "--steps", "1000", "--seed", "3", "-o", str(out)])
    assert rc == 0
    assert "10 saves, 10 commits, 8 deletes, 0 crashes" in capsys.readouterr().out
    assert main(["trace", "validate", str(out)]) == 0
    assert "valid trace v1" in capsys.readouterr().out


def test_cli_validate_reports_the_bad_line(tmp_path, capsys):
    path = write_lines(tmp_path, lines_of(HEADER, save(0, 10), delete(0, 10)))
    assert main(["trace", "validate", path]) == 2          # bad input, as replay says for the same file
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"retainz: invalid trace: {path}:3: delete of generation 0, which is writing "
                   "(only committed generations are deleted)"]


def _binary(tmp_path):
    p = tmp_path / "model.bin"
    p.write_bytes(bytes([0xBA, 0x00, 0xFF, 0x13]) * 3000)
    return str(p)


def _truncated(tmp_path):
    good = tmp_path / "good.jsonl"
    assert main(["trace", "generate", "--layout", "smollm2-135m-dcp", "--retention",
                 "torchtitan:interval=500,keep_latest_k=2", "--steps", "3000", "-o", str(good)]) == 0
    text = good.read_text()
    p = tmp_path / "cut.jsonl"
    p.write_text(text[:text.rindex('"shards"') + 12])       # cut inside the last save's shard list
    return str(p)


@pytest.mark.parametrize("make, fragment", [
    (_binary, ":1: not a trace: byte 0xba is not UTF-8 text (a binary file?"),
    (_truncated, "(the file ends mid-line: a truncated trace?)"),
])
def test_binary_or_truncated_file_is_bad_input_named_in_one_line_by_every_command(tmp_path, capsys, make,
                                                                                   fragment):
    path = make(tmp_path)
    capsys.readouterr()
    for argv in (["trace", "validate", path], ["replay", path, "--pressure", "0.9"]):
        rc = main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2, argv                                   # one convention: bad input is 2
        assert len(err) == 1 and f"{path}:" in err[0] and fragment in err[0], (argv, err)
        assert "at at" not in err[0] and "codec" not in err[0]


def test_json_error_names_the_column_once(tmp_path, capsys):
    path = write_lines(tmp_path, lines_of(HEADER, '{"type": "save", "step": "abc'))
    assert main(["trace", "validate", path]) == 2
    err = capsys.readouterr().err
    assert f"{path}:2: not valid JSON at column 26: Unterminated string starting there" in err


@pytest.mark.parametrize("argv, fragment", [
    (["--layout", "nosuch", "--retention", "hf", "--steps", "10"], "unknown layout 'nosuch'; valid layouts"),
    (["--layout", "pythia-1b", "--retention", "hf:limit=2", "--steps", "10"], "unknown key 'limit'; valid keys"),
    (["--layout", "pythia-1b", "--retention", "zfs:a=1", "--steps", "10"], "unknown retention rule 'zfs'"),
    (["--layout", "pythia-1b", "--retention", "hf", "--steps", "-3"], "argument --steps: -3 must be at least 1"),
])
def test_cli_generate_bad_input_exits_2_with_one_line(tmp_path, capsys, argv, fragment):
    rc = main(["trace", "generate", *argv, "-o", str(tmp_path / "t.jsonl")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and fragment in err[0]


def test_cli_lists_layouts_and_rules(capsys):
    assert main(["trace", "layouts"]) == 0
    out = capsys.readouterr().out
    for fragment in ("smollm2-135m-dcp", "1,729,172,338", "pythia-1b", "2,090,751,965", "llama3-8b-fsdp:ranks=8",
                     "measured:", "computed from architecture:"):
        assert fragment in out
    assert main(["trace", "rules"]) == 0
    out = capsys.readouterr().out
    for fragment in ("torchtitan:", "megatron:", "lightning:", "hf:", "accelerate:", "orbax:",
                     "keep_latest_k (int, default 10)", "save_interval (int, required)"):
        assert fragment in out


def test_actual_reclaim_steps_match_exact_predictions():
    trace = generate_trace("pythia-1b", "megatron:save_interval=10,retain_interval=30", 100, crash_every=4)
    actual = actual_reclaim_steps(trace.events)
    crashed = {e.gen for e in trace.events if e.type == "crash"}
    assert crashed and all(actual[g] < math.inf for g in crashed)
    for e in trace.events:
        if e.type == "save" and e.gen not in crashed:
            assert actual[e.gen] == e.hint.reclaim_step
    assert sorted(g for g, s in actual.items() if s == math.inf) == [
        e.gen for e in trace.events if e.type == "save" and e.step in (30, 60, 90, 100) and e.gen not in crashed]


def test_deeply_nested_line_is_a_line_numbered_error_not_a_crash(tmp_path):
    from retainz.trace.format import TraceFormatError
    from retainz.trace.io import read_trace

    good = tmp_path / "g.jsonl"
    from retainz.trace.generate import write_generated

    write_generated(str(good), "smollm2-135m-dcp", "torchtitan:interval=10,keep_latest_k=2", 30)
    bad = tmp_path / "deep.jsonl"
    bad.write_text(good.read_text().splitlines()[0] + "\n" + "[" * 200_000 + "\n")
    with pytest.raises(TraceFormatError, match=r"deep.jsonl:2: .*nested too deeply"):
        read_trace(str(bad))
