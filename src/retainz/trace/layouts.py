"""Checkpoint layouts of real models: the files one save writes, with sizes and where each number comes from.

Every shard carries a ``source``: ``"measured: ..."`` for a length read off a real file, or
``"computed from architecture: ..."`` (with the arithmetic) for a length derived from the model's
configuration.  Nothing here is a guess presented as a measurement.

==========================  ==================================================================
name                        what
==========================  ==================================================================
``smollm2-135m-dcp``        SmolLM2-135M, model + AdamW, one rank, torch DCP FileSystemWriter
                            (measured: docs/real-payload.md)
``pythia-1b[:dp=64]``       Pythia-1B GPT-NeoX training checkpoint: layer files + ZeRO-1
                            optimizer shards (computed); model-only = the exact HF
                            ``pytorch_model.bin`` (measured: 2,090,751,965 bytes)
``llama3-8b-fsdp[:ranks=N]`` Llama-3-8B under TorchTitan FSDP2, DCP ``__{rank}_0.distcp`` per rank
                            + ``.metadata`` (computed; ``param_dtype=fp32|bf16``)
``llama3-70b-fsdp[:ranks=N]`` Llama-3-70B, the same layout rule (computed)
==========================  ==================================================================
"""

from __future__ import annotations

from dataclasses import dataclass

from retainz.spec import parse_spec

__all__ = ["ShardSpec", "Layout", "LAYOUTS", "get_layout", "list_layouts",
           "pythia_1b_params", "llama3_8b_tensors", "llama3_tensors"]


@dataclass(frozen=True)
class ShardSpec:
    """One file of a checkpoint layout.

    Attributes:
        name: file name inside the checkpoint directory.
        nbytes: length (bytes).
        source: ``"measured: ..."`` or ``"computed from architecture: ..."``.
    """

    name: str
    nbytes: int
    source: str


@dataclass(frozen=True)
class Layout:
    """The files of one checkpoint save of a model.

    Attributes:
        name: canonical name with parameters (``llama3-8b-fsdp:ranks=8,param_dtype=fp32``).
        description: what is checkpointed.
        source: summary of where the numbers come from.
        shards: a full save (model + optimizer state).
        model_only: a model-weights-only save (TorchTitan's last step, an HF export).
        notes: assumptions, one a line.
    """

    name: str
    description: str
    source: str
    shards: tuple[ShardSpec, ...]
    model_only: tuple[ShardSpec, ...]
    notes: tuple[str, ...] = ()

    @property
    def total_bytes(self) -> int:
        """Bytes of a full save."""
        return sum(s.nbytes for s in self.shards)

    @property
    def model_only_bytes(self) -> int:
        """Bytes of a model-only save."""
        return sum(s.nbytes for s in self.model_only)

    def files(self, model_only: bool = False) -> tuple[ShardSpec, ...]:
        return self.model_only if model_only else self.shards


# -- SmolLM2-135M under DCP ------------------------------------------------------------------------

SMOLLM2_DISTCP = 1_729_172_338      # measured __0_0.distcp, model + AdamW
SMOLLM2_METADATA = 298_686          # measured .metadata
SMOLLM2_MODEL_TENSOR_BYTES = 651_306_240   # 273 fp32 tensors incl. the tied duplicate
SMOLLM2_OPTIM_TENSOR_BYTES = 1_076_121_152  # exp_avg + exp_avg_sq (2 x 538,060,032) + 272 fp32 steps
SMOLLM2_MODEL_ITEMS = 273
SMOLLM2_ITEMS = 273 + 3 * 272       # model tensors + (exp_avg, exp_avg_sq, step) per unique parameter
#: Non-tensor bytes of the measured DCP data file per tensor item (container framing): 1,602 bytes.
DCP_ITEM_OVERHEAD = (SMOLLM2_DISTCP - SMOLLM2_MODEL_TENSOR_BYTES - SMOLLM2_OPTIM_TENSOR_BYTES) // SMOLLM2_ITEMS
#: .metadata bytes per (tensor item, chunk), from the measured file: 274 bytes.
DCP_METADATA_PER_CHUNK = SMOLLM2_METADATA // SMOLLM2_ITEMS

_SMOL_MEASURED = ("measured: torch 2.13.0 DCP FileSystemWriter, SmolLM2-135M (134,515,008 params) fp32 + AdamW, "
                  "one rank (docs/real-payload.md)")


def _smollm2(params: dict[str, str]) -> Layout:
    _no_params("smollm2-135m-dcp", params)
    mo_data = SMOLLM2_MODEL_TENSOR_BYTES + SMOLLM2_MODEL_ITEMS * DCP_ITEM_OVERHEAD
    mo_meta = SMOLLM2_MODEL_ITEMS * DCP_METADATA_PER_CHUNK
    return Layout(
        "smollm2-135m-dcp",
        "SmolLM2-135M (LlamaConfig: 30 layers, hidden 576, 9 heads / 3 KV, intermediate 1536, vocab 49152, tied), "
        "model + AdamW, torch DCP, 1 rank",
        "measured (full save); model-only computed from the measured file",
        (ShardSpec("__0_0.distcp", SMOLLM2_DISTCP, _SMOL_MEASURED),
         ShardSpec(".metadata", SMOLLM2_METADATA, _SMOL_MEASURED)),
        (ShardSpec("__0_0.distcp", mo_data,
                   f"computed from architecture: {SMOLLM2_MODEL_TENSOR_BYTES:,} B of fp32 model tensors (273 incl. the "
                   f"tied duplicate) + 273 items x {DCP_ITEM_OVERHEAD:,} B per-item overhead (= (1,729,172,338 - "
                   f"651,306,240 - 1,076,121,152) / {SMOLLM2_ITEMS:,} items of the measured file)"),
         ShardSpec(".metadata", mo_meta,
                   f"computed: 273 items x {DCP_METADATA_PER_CHUNK} B (= 298,686 / {SMOLLM2_ITEMS:,} items measured)")),
        ("DCP stores the tied embedding twice (113,246,208 duplicate bytes), as measured.",),
    )


# -- Pythia-1B (GPT-NeoX) ---------------------------------------------------------------------------

PYTHIA_LAYERS, PYTHIA_HIDDEN, PYTHIA_VOCAB, PYTHIA_FFN = 16, 2048, 50304, 4 * 2048
PYTHIA_BIN = 2_090_751_965  # EleutherAI/pythia-1b commit 820a98e1 pytorch_model.bin


def pythia_1b_params() -> dict[str, int]:
    """Parameter counts of Pythia-1B (GPT-NeoX: 16 layers, hidden 2048, 8 heads, vocab 50304, FFN 8192,
    untied input/output embeddings, biases everywhere, LayerNorm with bias, rotary: no position table).

    Returns:
        ``{"embed_in", "layer", "final_norm", "embed_out", "total"}`` parameter counts.
    """
    h, f = PYTHIA_HIDDEN, PYTHIA_FFN
    layer = (2 * 2 * h                    # input + post-attention LayerNorm (weight, bias)
             + h * 3 * h + 3 * h          # query_key_value
             + h * h + h                  # attention dense
             + h * f + f                  # dense_h_to_4h
             + f * h + h)                 # dense_4h_to_h
    embed = PYTHIA_VOCAB * h
    total = embed + PYTHIA_LAYERS * layer + 2 * h + embed
    return {"embed_in": embed, "layer": layer, "final_norm": 2 * h, "embed_out": embed, "total": total}


def _pythia(params: dict[str, str]) -> Layout:
    dp = _int_param("pythia-1b", params, "dp", 64, {"dp"})
    p = pythia_1b_params()
    assert p["layer"] == 50_358_272 and p["total"] == 1_011_781_632
    arch = "computed from architecture: Pythia-1B"
    shards = [ShardSpec("layer_00-model_00-model_states.pt", 2 * p["embed_in"],
                        f"{arch}: embed_in 50304 x 2048 = {p['embed_in']:,} params x 2 B (fp16)")]
    for i in range(PYTHIA_LAYERS):
        shards.append(ShardSpec(f"layer_{i + 2:02d}-model_00-model_states.pt", 2 * p["layer"],
                                f"{arch}: transformer layer = 2 LayerNorms (8,192) + QKV 2048x6144+6144 + dense "
                                f"2048x2048+2048 + 2048x8192+8192 + 8192x2048+2048 = {p['layer']:,} params x 2 B"))
    shards.append(ShardSpec("layer_19-model_00-model_states.pt", 2 * p["final_norm"],
                            f"{arch}: final LayerNorm 2 x 2048 params x 2 B"))
    shards.append(ShardSpec("layer_20-model_00-model_states.pt", 2 * p["embed_out"],
                            f"{arch}: embed_out 2048 x 50304 = {p['embed_out']:,} params x 2 B"))
    shards.append(ShardSpec("mp_rank_00_model_states.pt", 16384,
                            "assumed: DeepSpeed engine state without the module (iteration, args, RNG): 16 KiB"))
    if (12 * p["total"]) % dp:
        raise ValueError(f"layout pythia-1b: dp={dp} does not divide the optimizer state evenly")
    per = 12 * p["total"] // dp
    for r in range(dp):
        shards.append(ShardSpec(f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt", per,
                                f"computed from architecture: ZeRO stage 1 over {dp} data-parallel ranks: "
                                f"{p['total']:,} params x 12 B (fp32 master + Adam exp_avg + exp_avg_sq) / {dp}"))
    model_only = (ShardSpec("pytorch_model.bin", PYTHIA_BIN,
                            "measured: EleutherAI/pythia-1b commit 820a98e1 pytorch_model.bin, exact length "
                            "(= 1,011,781,632 fp16 params x 2 + 16 attention-mask buffers 2048x2048 bool + "
                            "79,837 B container)"),)
    return Layout(
        f"pythia-1b:dp={dp}" if dp != 64 else "pythia-1b",
        "Pythia-1B GPT-NeoX training checkpoint global_stepN (fp16 layer files + ZeRO-1 optimizer shards); "
        "model-only = the HF pytorch_model.bin",
        "layer and optimizer files computed from architecture; pytorch_model.bin measured",
        tuple(shards), model_only,
        (f"Parameters: 16 x {p['layer']:,} + 2 x {p['embed_in']:,} + 4,096 = {p['total']:,}, which equals the "
         "parameter count inside the exact pytorch_model.bin (2,090,751,965 - 67,108,864 mask bytes - 79,837) / 2.",
         "Layer file numbering assumed from GPT-NeoX's PipelineModule order (0 embedding, 1 and 18 parameter-free, "
         "2-17 transformer layers, 19 final norm, 20 output); the published files are ~101 MB each.",
         "torch.save container overhead and the rotary inv_freq buffer are not included in the layer files.",
         f"The published ZeRO shards of pythia-1b-deduped-v0 are ~191 MB; the computed {per:,} B leaves out "
         "padding and optimizer metadata."),
    )


# -- Llama-3-8B, TorchTitan FSDP2 + DCP -------------------------------------------------------------

LLAMA_LAYERS, LLAMA_DIM, LLAMA_FFN, LLAMA_HEADS, LLAMA_KV_HEADS, LLAMA_VOCAB = 32, 4096, 14336, 32, 8, 128256
#: Llama-3 architectures (Meta's published params.json / HF config.json): layers, dim, FFN hidden, heads,
#: KV heads, vocabulary.  8B: 32/4096/14336/32/8/128256; 70B: 80/8192/28672/64/8/128256.
LLAMA3_ARCH = {"8b": (32, 4096, 14336, 32, 8, 128256), "70b": (80, 8192, 28672, 64, 8, 128256)}


def llama3_tensors(size: str = "8b") -> list[tuple[str, tuple[int, ...]]]:
    """TorchTitan's Llama-3 parameters for ``size`` (``"8b"`` or ``"70b"``): (name, shape) in order.

    8B: 291 tensors, 8,030,261,248 parameters; 70B: 723 tensors, 70,553,706,496 parameters (the
    published counts).

    Raises:
        KeyError: an unknown size."""
    layers, d, f, heads, kv_heads, v = LLAMA3_ARCH[size]
    kv = kv_heads * (d // heads)  # 8 KV heads x head_dim 128 = 1024
    out: list[tuple[str, tuple[int, ...]]] = [("tok_embeddings.weight", (v, d))]
    for i in range(layers):
        p = f"layers.{i}."
        out += [(p + "attention.wq.weight", (d, d)), (p + "attention.wk.weight", (kv, d)),
                (p + "attention.wv.weight", (kv, d)), (p + "attention.wo.weight", (d, d)),
                (p + "feed_forward.w1.weight", (f, d)), (p + "feed_forward.w2.weight", (d, f)),
                (p + "feed_forward.w3.weight", (f, d)),
                (p + "attention_norm.weight", (d,)), (p + "ffn_norm.weight", (d,))]
    out += [("norm.weight", (d,)), ("output.weight", (v, d))]
    return out


def llama3_8b_tensors() -> list[tuple[str, tuple[int, ...]]]:
    """TorchTitan's Llama-3-8B parameters: (name, shape), 291 tensors, 8,030,261,248 parameters."""
    return llama3_tensors("8b")


def _rows_on_rank(rows: int, ranks: int, rank: int) -> int:
    """Rows of a dim-0 FSDP2 shard (torch.chunk: ceil(rows / ranks) per rank, the remainder last)."""
    chunk = -(-rows // ranks)
    return max(0, min(chunk, rows - rank * chunk))


def _llama(params: dict[str, str], size: str = "8b") -> Layout:
    base = f"llama3-{size}-fsdp"
    ranks = _int_param(base, params, "ranks", 8, {"ranks", "param_dtype"})
    dtype = params.get("param_dtype", "fp32")
    if dtype not in ("fp32", "bf16"):
        raise ValueError(f"layout {base}: param_dtype must be fp32 or bf16, got {dtype!r}")
    pbytes = 4 if dtype == "fp32" else 2
    tensors = llama3_tensors(size)
    total_params = sum(_numel(s) for _, s in tensors)
    assert (len(tensors), total_params) in ((291, 8_030_261_248), (723, 70_553_706_496))
    layers, dim, ffn, heads, kv_heads, vocab = LLAMA3_ARCH[size]
    n = len(tensors)
    shards, model_only = [], []
    for r in range(ranks):
        elems = sum(_rows_on_rank(s[0], ranks, r) * _numel(s[1:]) for _, s in tensors)
        items = sum(1 for _, s in tensors if _rows_on_rank(s[0], ranks, r))
        full = elems * (pbytes + 8) + 3 * items * DCP_ITEM_OVERHEAD
        steps = ""
        if r == 0:  # replicated AdamW step scalars, deduplicated onto one rank (assumed rank 0)
            full += n * (4 + DCP_ITEM_OVERHEAD)
            steps = f" + {n} replicated fp32 step scalars x (4 + {DCP_ITEM_OVERHEAD}) B (dedup: rank 0)"
        shards.append(ShardSpec(
            f"__{r}_0.distcp", full,
            f"computed from architecture: {elems:,} local elements x ({pbytes} B {dtype} param + 8 B fp32 AdamW "
            f"exp_avg/exp_avg_sq) + {3 * items} tensor items x {DCP_ITEM_OVERHEAD} B DCP overhead{steps}"))
        model_only.append(ShardSpec(
            f"__{r}_0.distcp", elems * 4 + items * DCP_ITEM_OVERHEAD,
            f"computed from architecture: {elems:,} local elements x 4 B (export_dtype float32) + {items} items x "
            f"{DCP_ITEM_OVERHEAD} B"))
    meta = (3 * n * ranks + n) * DCP_METADATA_PER_CHUNK
    shards.append(ShardSpec(".metadata", meta,
                            f"computed (rough): ({3 * n} sharded items x {ranks} chunks + {n} step items) x "
                            f"{DCP_METADATA_PER_CHUNK} B per chunk entry (from the measured SmolLM2 .metadata)"))
    model_only.append(ShardSpec(".metadata", n * ranks * DCP_METADATA_PER_CHUNK,
                                f"computed (rough): {n} items x {ranks} chunks x {DCP_METADATA_PER_CHUNK} B"))
    name = f"{base}:ranks={ranks}" + (f",param_dtype={dtype}" if dtype != "fp32" else "")
    return Layout(
        name,
        f"Llama-3-{size.upper()} ({layers} layers, dim {dim}, FFN {ffn}, {heads} heads / {kv_heads} KV, vocab {vocab}, "
        f"untied), TorchTitan FSDP2 over "
        f"{ranks} ranks, {dtype} params + fp32 AdamW, DCP FileSystemWriter",
        "computed from architecture",
        tuple(shards), tuple(model_only),
        (f"{total_params:,} parameters in {n} tensors, each sharded on dim 0 (FSDP2 Shard(0), torch.chunk sizes).",
         "One data file per rank (__{rank}_0.distcp: single_file_per_rank, one writer thread); "
         "train_state, lr_scheduler and dataloader entries (a few KB) are left out.",
         f"Per-item DCP overhead {DCP_ITEM_OVERHEAD} B and .metadata {DCP_METADATA_PER_CHUNK} B per chunk entry are "
         "derived from the measured SmolLM2-135M files.",
         "The model-only save (TorchTitan's last step) holds fp32 params only (export_dtype float32)."),
    )


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for x in shape:
        n *= x
    return n


# -- registry -------------------------------------------------------------------------------------------

def _no_params(name: str, params: dict[str, str]) -> None:
    if params:
        raise ValueError(f"layout {name} takes no parameters, got {', '.join(params)}")


def _int_param(name: str, params: dict[str, str], key: str, default: int, allowed: set[str],
               lo: int = 1, hi: int = 1024) -> int:
    """The integer parameter ``key`` (``default`` when absent), checked to lie in ``lo..hi``."""
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise ValueError(f"layout {name}: unknown parameter {unknown[0]!r}; valid: {', '.join(sorted(allowed))}")
    raw = params.get(key)
    if raw is None:
        return default
    try:
        v = int(raw)
    except ValueError:
        raise ValueError(f"layout {name}: {key} expects an integer, got {raw!r}") from None
    if not lo <= v <= hi:
        raise ValueError(f"layout {name}: {key} must be in {lo}..{hi}, got {v}")
    return v


#: name -> (builder, one-line summary).
LAYOUTS = {
    "smollm2-135m-dcp": (_smollm2, "SmolLM2-135M model + AdamW under torch DCP, 1 rank (measured)"),
    "pythia-1b": (_pythia, "Pythia-1B GPT-NeoX layer files + ZeRO-1 shards (computed); pytorch_model.bin (measured)"),
    "llama3-8b-fsdp": (_llama, "Llama-3-8B TorchTitan FSDP2 DCP over N ranks (computed); :ranks=N,param_dtype=fp32|bf16"),
    "llama3-70b-fsdp": (lambda p: _llama(p, "70b"),
                        "Llama-3-70B TorchTitan FSDP2 DCP over N ranks (computed); :ranks=N,param_dtype=fp32|bf16"),
}


def get_layout(spec: str) -> Layout:
    """Build a layout from ``NAME[:key=value,...]``.

    Raises:
        ValueError: unknown layout (lists the valid ones) or a bad parameter.
    """
    name, pairs = parse_spec(spec, "layout")
    if name not in LAYOUTS:
        raise ValueError(f"unknown layout {name!r}; valid layouts: {', '.join(LAYOUTS)}")
    return LAYOUTS[name][0](dict(pairs))


def list_layouts() -> list[Layout]:
    """Every layout at its default parameters."""
    return [get_layout(n) for n in LAYOUTS]
