"""A stand-in for a training script that checkpoints into a directory, as HF Trainer lays it out.

It trains nothing: every ``--save_steps`` steps it saves ``OUTPUT_DIR/checkpoint-STEP/`` holding the
model weights (``model.bin``: ``--model_mib`` MiB of float32 values) and, last, ``trainer_state.json``
(HF Trainer 5.x writes it last in ``Trainer._save_checkpoint``), then deletes the oldest checkpoints
beyond ``--save_total_limit`` (``Trainer._rotate_checkpoints``).  The README runs it on the mount
(``retainz mount``) in the place of your own script, which runs there unmodified.

Run it:  .venv/bin/python examples/train.py --output_dir mnt/run
"""

from __future__ import annotations

import argparse
import json
import os
import shutil

import numpy as np


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--output_dir", required=True, help="checkpoint folder (created)")
    p.add_argument("--max_steps", type=int, default=2000, help="training steps (default 2000)")
    p.add_argument("--save_steps", type=int, default=500, help="steps between saves (default 500)")
    p.add_argument("--save_total_limit", type=int, default=2, help="checkpoints kept (default 2)")
    p.add_argument("--model_mib", type=int, default=16, help="size of each save's weights in MiB (default 16)")
    args = p.parse_args(argv)
    os.makedirs(args.output_dir, exist_ok=True)
    rng = np.random.default_rng(0)
    weights = rng.standard_normal(args.model_mib << 18, dtype=np.float32)    # 4 bytes each
    saved: list[str] = []
    for step in range(args.save_steps, args.max_steps + 1, args.save_steps):
        weights += np.float32(0.01)                          # "training"
        folder = os.path.join(args.output_dir, f"checkpoint-{step}")
        os.makedirs(folder)
        weights.tofile(os.path.join(folder, "model.bin"))
        with open(os.path.join(folder, "trainer_state.json"), "w") as f:
            json.dump({"global_step": step, "max_steps": args.max_steps, "save_steps": args.save_steps}, f)
        saved.append(folder)
        while len(saved) > args.save_total_limit:
            shutil.rmtree(saved.pop(0))
        print(f"step {step}: saved {folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
