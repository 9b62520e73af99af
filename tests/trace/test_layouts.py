"""Checkpoint layouts: totals equal the documented numbers, and every size says where it comes from."""

from __future__ import annotations

import pytest

from retainz.trace.layouts import (
    DCP_ITEM_OVERHEAD,
    LAYOUTS,
    get_layout,
    list_layouts,
    llama3_8b_tensors,
    pythia_1b_params,
)


def test_smollm2_dcp_is_the_measured_files():
    lay = get_layout("smollm2-135m-dcp")
    assert [(s.name, s.nbytes) for s in lay.shards] == [("__0_0.distcp", 1_729_172_338), (".metadata", 298_686)]
    assert lay.total_bytes == 1_729_471_024
    assert all(s.source.startswith("measured:") for s in lay.shards)
    assert all(s.source.startswith("computed") for s in lay.model_only)


def test_smollm2_model_only_is_model_tensors_plus_overhead():
    # 1,729,172,338 - 651,306,240 - 1,076,121,152 = 1,744,946 non-tensor bytes over 1,089 tensor items
    assert DCP_ITEM_OVERHEAD == 1602
    lay = get_layout("smollm2-135m-dcp")
    assert lay.model_only[0].nbytes == 651_306_240 + 273 * 1602


def test_pythia_1b_parameter_count_matches_the_exact_pytorch_model_bin():
    p = pythia_1b_params()
    assert p["layer"] == 50_358_272
    assert p["total"] == 1_011_781_632
    # fp16 parameters + 16 attention-mask buffers of 2048x2048 bools + container = the exact file length
    assert 2 * p["total"] + 16 * 2048 * 2048 + 79_837 == 2_090_751_965


def test_pythia_1b_layout_files():
    lay = get_layout("pythia-1b")
    names = [s.name for s in lay.shards]
    layers = [s for s in lay.shards if s.name.startswith("layer_")]
    assert len(layers) == 19
    assert [s.name for s in layers][:3] == ["layer_00-model_00-model_states.pt", "layer_02-model_00-model_states.pt",
                                            "layer_03-model_00-model_states.pt"]
    assert {s.nbytes for s in layers[1:17]} == {100_716_544}  # ~101 MB each, as published
    assert layers[0].nbytes == layers[-1].nbytes == 206_045_184
    zero = [s for s in lay.shards if s.name.startswith("zero_pp_rank_")]
    assert len(zero) == 64 and {s.nbytes for s in zero} == {189_709_056}  # published ~191 MB
    assert names[-1] == "zero_pp_rank_63_mp_rank_00_optim_states.pt"
    assert sum(s.nbytes for s in layers) == 2 * 1_011_781_632
    assert lay.total_bytes == 2 * 1_011_781_632 + 16_384 + 12 * 1_011_781_632
    assert all(s.source.startswith(("computed from architecture", "assumed")) for s in lay.shards)
    assert [(s.name, s.nbytes) for s in lay.model_only] == [("pytorch_model.bin", 2_090_751_965)]
    assert lay.model_only[0].source.startswith("measured:")


def test_pythia_dp_parameter():
    lay = get_layout("pythia-1b:dp=32")
    assert lay.name == "pythia-1b:dp=32"
    assert {s.nbytes for s in lay.shards if s.name.startswith("zero_")} == {12 * 1_011_781_632 // 32}
    with pytest.raises(ValueError, match="does not divide"):
        get_layout("pythia-1b:dp=7")
    assert sum(s.name.startswith("zero_") for s in get_layout("pythia-1b:dp=1").shards) == 1


def test_llama3_8b_architecture():
    tensors = llama3_8b_tensors()
    assert len(tensors) == 291
    numel = {name: (s[0] * s[1] if len(s) == 2 else s[0]) for name, s in tensors}
    assert sum(numel.values()) == 8_030_261_248
    assert numel["layers.0.attention.wk.weight"] == 1024 * 4096  # 8 KV heads x 128
    assert numel["output.weight"] == numel["tok_embeddings.weight"] == 128_256 * 4096


@pytest.mark.parametrize("ranks", [1, 2, 6, 7, 8, 64])
def test_llama3_8b_fsdp_shards_partition_the_state(ranks):
    lay = get_layout(f"llama3-8b-fsdp:ranks={ranks}")
    data = [s for s in lay.shards if s.name.endswith(".distcp")]
    assert [s.name for s in data] == [f"__{r}_0.distcp" for r in range(ranks)]
    assert lay.shards[-1].name == ".metadata"
    items = 3 * 291 * ranks + 291  # every rank holds a slice of every tensor (3 items each) + rank 0's steps
    tensor_bytes = sum(s.nbytes for s in data) - items * DCP_ITEM_OVERHEAD
    assert tensor_bytes == 12 * 8_030_261_248 + 291 * 4  # fp32 param + exp_avg + exp_avg_sq, fp32 steps
    model = [s for s in lay.model_only if s.name.endswith(".distcp")]
    assert sum(s.nbytes for s in model) - 291 * ranks * DCP_ITEM_OVERHEAD == 4 * 8_030_261_248
    assert all(s.source.startswith("computed") for s in lay.shards + lay.model_only)


def test_llama3_8b_default_and_bf16():
    assert get_layout("llama3-8b-fsdp").name == "llama3-8b-fsdp:ranks=8"
    fp32 = get_layout("llama3-8b-fsdp:ranks=8")
    bf16 = get_layout("llama3-8b-fsdp:ranks=8,param_dtype=bf16")
    assert fp32.total_bytes - bf16.total_bytes == 2 * 8_030_261_248
    assert fp32.total_bytes == 96_376_784_040


def test_uneven_sharding_gives_the_remainder_to_the_last_ranks():
    lay = get_layout("llama3-8b-fsdp:ranks=6")  # 4096 and 1024 rows do not divide by 6
    sizes = [s.nbytes for s in lay.shards[:-1]]
    assert sizes[0] > sizes[1] >= sizes[-1]


@pytest.mark.parametrize("spec, fragment", [
    ("nosuch", "unknown layout 'nosuch'; valid layouts: smollm2-135m-dcp, pythia-1b, llama3-8b-fsdp"),
    ("llama3-8b-fsdp:ranks=x", "ranks expects an integer"),
    ("llama3-8b-fsdp:ranks=0", "ranks must be in 1..1024"),
    ("llama3-8b-fsdp:nodes=2", "unknown parameter 'nodes'"),
    ("llama3-8b-fsdp:param_dtype=fp8", "param_dtype must be fp32 or bf16"),
    ("smollm2-135m-dcp:ranks=2", "takes no parameters"),
    ("pythia-1b:dp", "expected key=value"),
    ("pythia-1b:dp=0", "layout pythia-1b: dp must be in 1..1024, got 0"),
    ("pythia-1b:dp=-2", "layout pythia-1b: dp must be in 1..1024, got -2"),
    ("pythia-1b:dp=2048", "layout pythia-1b: dp must be in 1..1024, got 2048"),
    ("pythia-1b:dp=1.5", "layout pythia-1b: dp expects an integer, got '1.5'"),
    ("llama3-8b-fsdp:ranks=-1", "layout llama3-8b-fsdp: ranks must be in 1..1024, got -1"),
    ("llama3-8b-fsdp:ranks=1025", "layout llama3-8b-fsdp: ranks must be in 1..1024, got 1025"),
])
def test_bad_layout_specs(spec, fragment):
    with pytest.raises(ValueError) as e:
        get_layout(spec)
    assert fragment in str(e.value)


def test_every_layout_lists_its_sources():
    assert [lay.name.split(":")[0] for lay in list_layouts()] == list(LAYOUTS)
    for lay in list_layouts():
        for s in lay.shards + lay.model_only:
            assert s.nbytes >= 0 and s.source.split(":")[0].split(" ")[0] in ("measured", "computed", "assumed")
