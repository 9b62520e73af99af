"""The real-payload lane: SmolLM2-135M architecture (2 of 30 layers) through the DCP plugin onto a
FileDevice; the resumed update in a fresh process must equal the uninterrupted one bit for bit.

The full-size run is the same command with ``--layers 30`` (docs/user-guide.md, "The real-payload check").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="needs the payload extra (make setup-torch)")
pytest.importorskip("transformers", reason="needs the payload extra (make setup-torch)")


pytestmark = pytest.mark.payload
ROOT = Path(__file__).resolve().parents[2]
CACHE = os.environ.get("RETAINZ_PAYLOAD_CACHE", str(ROOT / "cache/payload"))


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("payload")
    proc = subprocess.run([sys.executable, "-m", "retainz.cli", "payload", "capture", "--layers", "2",
                           "--steps", "2", "--cache", CACHE, "--device", str(tmp / "dev.img"),
                           "--out", str(tmp / "out")], capture_output=True, text=True, cwd=ROOT, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return tmp, json.loads((tmp / "out/result.json").read_text()), proc.stdout


def test_resumed_update_is_bit_identical(captured):
    _, result, stdout = captured
    assert result["identical"] is True and result["mismatches"] == []
    assert result["resumed_loss"] == result["reference_loss"]
    # 2 layers: embeddings 49152*576 + per layer (4 attention + 3 MLP matrices + 2 norms) + final norm
    per_layer = 576 * 576 * 2 + 576 * 192 * 2 + 576 * 1536 * 3 + 576 * 2
    assert result["parameters"] == 49152 * 576 + 2 * per_layer + 576
    # every model and optimizer tensor was compared: model state (incl. the tied lm_head), AdamW
    # exp_avg, exp_avg_sq and step per parameter, and the RNG state
    n_param_tensors = 2 * 9 + 2
    assert result["tensors_compared"] == (n_param_tensors + 1) + 3 * n_param_tensors + 1
    assert result["bytes_compared"] > 4 * result["parameters"] * 3
    assert "bit-identical resumed update" in stdout
    assert result["init"].startswith("random init")


def test_layout_lists_the_captured_shards(captured):
    tmp, result, _ = captured
    layout = json.loads((tmp / "out/layout.json").read_text())
    names = [s["name"] for s in layout["shards"]]
    assert names == ["__0_0.distcp", ".metadata"]
    assert sum(s["nbytes"] for s in layout["shards"]) == result["checkpoint_bytes"]
    assert layout["shards"][0]["nbytes"] > result["bytes_compared"] - 10_000
    assert all(s["source"].startswith("measured") for s in layout["shards"])
    assert layout["name"] == "smollm2-135m-retainz-dcp:layers=2"


def test_check_fails_without_rng_restore(captured):
    """The check has teeth: resuming without the RNG state draws other batches and diverges."""
    from retainz.experiments.payload.train import PayloadConfig

    tmp, result, _ = captured
    cfg = replace(PayloadConfig(**result["config"]), restore_rng=False)
    proc = subprocess.run([sys.executable, "-m", "retainz.experiments.payload.train", "resume", "--device",
                           str(tmp / "dev.img"), "--config", json.dumps(asdict(cfg))],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    verdict = json.loads(proc.stdout.strip().splitlines()[-1])
    assert verdict["identical"] is False
    assert "model.model.embed_tokens.weight" in verdict["mismatches"]
    assert verdict["loss"] != result["reference_loss"]


def test_capture_twice_on_one_device_refuses_up_front(captured):
    tmp, _, _ = captured
    proc = subprocess.run([sys.executable, "-m", "retainz.cli", "payload", "capture", "--layers", "2",
                           "--steps", "2", "--cache", CACHE, "--device", str(tmp / "dev.img"),
                           "--out", str(tmp / "again")], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 2
    assert proc.stderr == (f"retainz: error: device {tmp / 'dev.img'} already holds checkpoint step-2: use a new "
                           "--device, remove it, or pass --force to replace it\n")
    assert not (tmp / "again" / "result.json").exists()
