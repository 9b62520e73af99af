"""Deterministic training, checkpoint capture and the bit-identical resume check.

``capture`` (one process):

1. build the model (:mod:`.model`) and ``torch.optim.AdamW``; train ``steps`` updates on the corpus;
2. ``dcp.save`` model, optimizer, RNG state and step through :class:`ZonedStorageWriter` onto a
   FileDevice, as generation ``step-{steps}``: the checkpoint under test;
3. run one more update uninterrupted and save the result as ``step-{steps+1}``: the reference;
4. in a *fresh process* (``python -m retainz.experiments.payload.train resume``): build the model,
   ``dcp.load`` ``step-{steps}``, restore model, optimizer and RNG state, run one update, load the
   reference and compare the loss and every parameter and optimizer-state tensor byte for byte;
5. write ``result.json`` (the verdict and timings) and ``layout.json`` (the captured shard sizes, in the
   shape of :class:`retainz.trace.layouts.Layout`, labelled as measured).

Determinism: ``torch.use_deterministic_algorithms(True)``, ``torch.set_num_threads(threads)``, fixed
seeds.  The batch offsets are drawn from the *global* torch RNG, so the resume is only bit-identical if
the RNG state was checkpointed and restored (it is part of the check).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

__all__ = ["PayloadConfig", "capture", "resume_and_compare", "load_tokens"]


@dataclass
class PayloadConfig:
    """One payload run.

    Attributes:
        layers: decoder layers (30 = full SmolLM2-135M; CI uses 2).
        steps: AdamW updates before the checkpoint.
        init: ``"random"`` or ``"gguf"``.
        seed: seed of the init and of the global RNG.
        batch: sequences per update.
        seq: tokens per sequence.
        lr: AdamW learning rate.
        threads: ``torch.set_num_threads``.
        cache: folder of the fetched sources (:mod:`.sources`).
        max_tokens: tokens of the corpus used (its start), ``0`` for all 1,564,850.
        restore_rng: restore the global RNG state on resume (False only to show the check fails).
        retention: the retention rule the checkpoints are saved under (its hints steer placement).
    """

    layers: int = 30
    steps: int = 2
    init: str = "random"
    seed: int = 0
    batch: int = 2
    seq: int = 128
    lr: float = 1e-3
    threads: int = 2
    cache: str = "cache/payload"
    max_tokens: int = 0
    restore_rng: bool = True
    retention: str = "torchtitan:interval=1,keep_latest_k=2"


def _determinism(cfg: PayloadConfig) -> None:
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(cfg.threads)


def load_tokens(cfg: PayloadConfig) -> torch.Tensor:
    """The corpus as SmolLM2 token ids (int64), tokenized once and cached next to the sources."""
    from retainz.experiments.payload import sources

    cache = Path(cfg.cache)
    path = cache / "shakespeare-smollm2-tokens.pt"
    if not path.exists():
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(sources.tokenizer_dir(cache) / "tokenizer.json"))
        ids: list[int] = []
        for f in sources.corpus_files(cache):
            ids.extend(tok.encode(f.read_text(encoding="utf-8", errors="replace")).ids)
        tmp = path.with_suffix(".part")
        torch.save(torch.tensor(ids, dtype=torch.int64), tmp)
        tmp.rename(path)
    tokens = torch.load(path, weights_only=True)
    return tokens[:cfg.max_tokens] if cfg.max_tokens else tokens


def _build(cfg: PayloadConfig, init: str | None = None):
    from retainz.experiments.payload import sources
    from retainz.experiments.payload.model import build_model

    init = init or cfg.init
    model = build_model(cfg.layers, init=init, seed=cfg.seed,
                        gguf=sources.gguf_path(Path(cfg.cache)) if init == "gguf" else None)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.1)
    return model, opt


def _update(model, opt, tokens: torch.Tensor, cfg: PayloadConfig) -> float:
    starts = torch.randint(0, len(tokens) - cfg.seq - 1, (cfg.batch,))  # the global RNG: must be restored
    x = torch.stack([tokens[s:s + cfg.seq] for s in starts.tolist()])
    loss = model(input_ids=x, labels=x).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(loss.detach())


def _state(model, opt, step: int, loss: float) -> dict:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd, "rng": torch.get_rng_state(), "step": step, "loss": loss}


def _flatten(d, prefix=""):
    out = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}{k}."))
    elif isinstance(d, (list, tuple)):
        for i, v in enumerate(d):
            out.update(_flatten(v, f"{prefix}{i}."))
    else:
        out[prefix[:-1]] = d
    return out


def _geometry_for(nbytes: int):
    from retainz.zoned import Geometry

    zone = 64 << 20
    zones = math.ceil(nbytes * 2.6 / zone) + 3 + 2 + 4   # two saves + slack, meta zones, GC reserve
    return Geometry(nr_zones=zones, zone_size=zone, zone_capacity=zone, max_open=14, max_active=14)


def capture(cfg: PayloadConfig, device: str, out: Path, *, force: bool = False) -> dict:
    """Run the whole check (see the module docstring); returns the result written to ``result.json``.

    Raises:
        GenerationExistsError: ``device`` already holds the checkpoint ids this run writes
            (``step-{steps}``, ``step-{steps + 1}``) and ``force`` is False (checked before training).
            With ``force`` those generations are deleted first.
    """
    from torch.distributed import checkpoint as dcp

    from retainz.errors import GenerationExistsError
    from retainz.experiments.payload.model import INIT_LABELS
    from retainz.integrations.dcp import ZonedStorageWriter
    from retainz.jobs import stores

    device = str(device)
    if stores.present(device):
        ids = (f"step-{cfg.steps}", f"step-{cfg.steps + 1}")
        with stores.using(device) as store:
            held = [g.id for g in store.generations() if g.id in ids]
            if held and not force:
                raise GenerationExistsError(
                    f"device {device} already holds checkpoint {held[0]}: use a new --device, remove it, "
                    "or pass --force to replace it")
            for gid in held:
                store.delete(gid)
    _determinism(cfg)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    tokens = load_tokens(cfg)
    model, opt = _build(cfg)
    torch.manual_seed(cfg.seed)
    losses = [_update(model, opt, tokens, cfg) for _ in range(cfg.steps)]
    t_train = time.perf_counter() - t0

    nparams = sum(p.numel() for p in model.parameters())
    geometry = None if stores.present(device) else _geometry_for(nparams * 4 * 5)
    rule = cfg.retention
    state = _state(model, opt, cfg.steps, losses[-1] if losses else float("nan"))
    t1 = time.perf_counter()
    dcp.save(state, storage_writer=ZonedStorageWriter(device, retention=rule, retire=False, geometry=geometry),
             checkpoint_id=f"step-{cfg.steps}")
    t_save = time.perf_counter() - t1
    del state

    ref_loss = _update(model, opt, tokens, cfg)                      # the uninterrupted update
    dcp.save(_state(model, opt, cfg.steps + 1, ref_loss),
             storage_writer=ZonedStorageWriter(device, retention=rule, retire=False), checkpoint_id=f"step-{cfg.steps + 1}")
    del model, opt

    t2 = time.perf_counter()
    env = dict(os.environ, PYTHONHASHSEED="0")
    proc = subprocess.run([sys.executable, "-m", "retainz.experiments.payload.train", "resume",
                           "--device", device, "--config", json.dumps(asdict(cfg))],
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"resume process failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    resumed = json.loads(proc.stdout.strip().splitlines()[-1])
    t_resume = time.perf_counter() - t2

    with stores.using(device) as store:
        gens = {g.id: g for g in store.generations()}
        shards = gens[f"step-{cfg.steps}"].shards
        layout = {
            "name": f"smollm2-135m-retainz-dcp:layers={cfg.layers}",
            "description": f"SmolLM2-135M architecture ({cfg.layers} of 30 layers), model + AdamW, one rank, "
                           "RetainZ ZonedStorageWriter (raw tensor bytes)",
            "source": f"measured: retainz payload capture, torch {torch.__version__}, {INIT_LABELS[cfg.init]}",
            "shards": [{"name": s.name, "nbytes": s.size, "source": "measured: store ShardInfo.size"}
                       for s in shards.values()],
            "model_only": [],
            "notes": [f"{nparams} parameters; the tied embedding is stored twice (DCP state dict keeps both keys)"],
        }
    (out / "layout.json").write_text(json.dumps(layout, indent=2) + "\n")
    result = {
        "identical": resumed["identical"],
        "config": asdict(cfg),
        "init": INIT_LABELS[cfg.init],
        "parameters": nparams,
        "losses_before_checkpoint": losses,
        "reference_loss": ref_loss,
        "resumed_loss": resumed["loss"],
        "tensors_compared": resumed["tensors"],
        "bytes_compared": resumed["bytes"],
        "mismatches": resumed["mismatches"],
        "checkpoint_bytes": sum(s.size for s in shards.values()),
        "seconds": {"train": round(t_train, 2), "save": round(t_save, 2), "resume_process": round(t_resume, 2),
                    "load_in_resume": resumed["load_seconds"]},
        "device": device,
        "torch": torch.__version__,
    }
    (out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def resume_and_compare(cfg: PayloadConfig, device: str) -> dict:
    """In a fresh process: restore ``step-{steps}``, run one update, compare with ``step-{steps+1}``."""
    from torch.distributed import checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    from retainz.integrations.dcp import ZonedStorageReader

    _determinism(cfg)
    tokens = load_tokens(cfg)
    model, opt = _build(cfg, init="random")     # every tensor is overwritten by the restore
    state = _state(model, opt, 0, 0.0)
    t = time.perf_counter()
    dcp.load(state, storage_reader=ZonedStorageReader(device), checkpoint_id=f"step-{cfg.steps}")
    load_s = time.perf_counter() - t
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    if cfg.restore_rng:
        torch.set_rng_state(state["rng"])
    if state["step"] != cfg.steps:
        raise AssertionError(f"restored step {state['step']}, expected {cfg.steps}")
    loss = _update(model, opt, tokens, cfg)
    mine = _flatten(_state(model, opt, cfg.steps + 1, loss))
    ref_model, ref_opt = _build(cfg, init="random")
    ref = _state(ref_model, ref_opt, 0, 0.0)
    dcp.load(ref, storage_reader=ZonedStorageReader(device), checkpoint_id=f"step-{cfg.steps + 1}")
    ref = _flatten(ref)
    mismatches, tensors, nbytes = [], 0, 0
    for key in sorted(set(mine) | set(ref)):
        a, b = mine.get(key), ref.get(key)
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            tensors += 1
            nbytes += a.numel() * a.element_size()
            same = (a.dtype == b.dtype and a.shape == b.shape and torch.equal(
                a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8)))
        elif isinstance(a, float) and isinstance(b, float):
            same = a.hex() == b.hex()
        else:
            same = a == b
        if not same:
            mismatches.append(key)
    return {"identical": not mismatches, "loss": loss, "tensors": tensors, "bytes": nbytes,
            "mismatches": mismatches[:20], "load_seconds": round(load_s, 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m retainz.experiments.payload.train")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("resume", help="(internal) the fresh-process half of the check; prints JSON")
    r.add_argument("--device", required=True, help="a device file, /dev/NAME or a remote: device spec")
    r.add_argument("--config", required=True, help="PayloadConfig as JSON")
    args = ap.parse_args(argv)
    cfg = PayloadConfig(**json.loads(args.config))
    print(json.dumps(resume_and_compare(cfg, args.device)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
