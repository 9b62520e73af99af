"""HF Trainer's own checkpoint scenarios (issue 28.4) on the mount, each run also on a local directory
with the same seeds: the mount must keep the same checkpoints and give the same bytes and weights.

Each test names the upstream test it mirrors (huggingface/transformers ``tests/trainer/test_trainer.py``:
``test_checkpoint_rotation`` with and without ``load_best_model_at_end``, ``test_can_resume_training``,
``test_safe_checkpoints``); the scenarios were learnt from there, the code is ours, on a 2-layer Llama
built locally (no download).  HF Trainer writes with ``open``/``os``/``shutil`` on local paths, so
``retainz://`` is not a face it can use; transformers 5.x always saves safetensors, so the ``.bin`` case
is a Trainer whose ``_save`` writes ``pytorch_model.bin`` with ``torch.save`` (what 4.x did with
``save_safetensors=False``), resumed through Trainer's own ``.bin`` loader.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import re

import pytest

torch = pytest.importorskip("torch", reason="needs the torch extra (make setup-torch)")
pytest.importorskip("transformers", reason="needs the payload extra (make setup-torch)")
pytest.importorskip("fsspec", reason="the mount extra (make setup-mount)")

from tests.mountcheck import fsck_clean, generations, make_device, mounted, require_fuse  # noqa: E402

pytestmark = [pytest.mark.mount, pytest.mark.dcp]


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    """``{"local": a local directory, "mount": a directory of one mount}`` shared by the module's tests
    (each test uses its own output directory under them); the store is checked once unmounted."""
    require_fuse()
    base = tmp_path_factory.mktemp("hf")
    device = make_device(base, zones=96)
    (base / "local").mkdir()
    with mounted(device, base / "mnt") as mnt:
        yield {"local": base / "local", "mount": mnt}
        gc.collect()                         # the runtime's mmaps of the mount go before unmounting
    # the store holds the kept checkpoints only, each one generation (no temporary or stray files; the
    # resumed run's checkpoint-6 is a re-save, its next version #1)
    gens = generations(device)
    assert gens and all(re.fullmatch(r"(rot|resume)-[^%]+%2Fcheckpoint-\d+(#\d+)?", g) for g in gens), sorted(gens)
    assert fsck_clean(device)


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(cfg)


class _Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int, offset: int = 0):
        self.n, self.offset = n, offset

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(self.offset + i)
        ids = torch.randint(0, 64, (16,), generator=g)
        return {"input_ids": ids, "labels": ids.clone()}


def _bin_trainer_class():
    """A Trainer saving its weights as ``pytorch_model.bin`` (``torch.save`` of the state dict) with
    the config, as transformers 4.x's ``save_pretrained(safe_serialization=False)`` did."""
    from transformers import Trainer
    from transformers.utils import WEIGHTS_NAME

    class BinTrainer(Trainer):
        def _save(self, output_dir=None, state_dict=None):
            output_dir = output_dir or self.args.output_dir
            os.makedirs(output_dir, exist_ok=True)
            self.model.config.save_pretrained(output_dir)
            torch.save(state_dict or self.model.state_dict(), os.path.join(output_dir, WEIGHTS_NAME))

    return BinTrainer


def _trainer(out, max_steps: int, *, save_steps: int = 2, limit: int | None = None, best: bool = False,
             binary: bool = False):
    from transformers import Trainer, TrainingArguments

    kw = {}
    if best:      # the highest eval loss is "best": an early save, so best and last differ
        kw = {"eval_strategy": "steps", "eval_steps": save_steps, "load_best_model_at_end": True,
              "metric_for_best_model": "eval_loss", "greater_is_better": True}
    args = TrainingArguments(output_dir=str(out), save_strategy="steps", save_steps=save_steps,
                             save_total_limit=limit, max_steps=max_steps, per_device_train_batch_size=4,
                             per_device_eval_batch_size=8, learning_rate=1e-2, report_to=[], use_cpu=True,
                             logging_steps=1000, disable_tqdm=True, dataloader_num_workers=0, seed=0, **kw)
    cls = _bin_trainer_class() if binary else Trainer
    return cls(model=_tiny_llama(), args=args, train_dataset=_Tokens(64),
               eval_dataset=_Tokens(16, 1000) if best else None)


def _weights(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _raw(t):
    return t.detach().reshape(-1).contiguous().view(torch.uint8) if t.dtype != torch.bool else t


def _bit_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(_raw(a[k]), _raw(b[k]))
                                        for k in a)


def _sha(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def _listing(out) -> list[str]:
    return sorted(os.listdir(out))


@pytest.mark.parametrize("limit, best", [(2, False), (2, True), (1, True)],
                         ids=["limit2", "limit2-best", "limit1-best"])
def test_checkpoint_rotation(roots, limit, best):
    """Mirrors test_trainer.py ``test_checkpoint_rotation``: with ``save_total_limit`` alone the newest
    checkpoints stay; with ``load_best_model_at_end`` the best one stays too (with limit 1 the last is
    kept beside it while training, to resume from, and removed when training ends).  Run by a real training (saves every step), on the
    mount and on a local directory: the same checkpoints stay, the same best one is loaded at the end."""
    kept, best_ck, end_weights = {}, {}, {}
    for where in ("local", "mount"):
        out = roots[where] / f"rot-{limit}-{best}"
        t = _trainer(out, 5, save_steps=1, limit=limit, best=best)
        t.train()
        kept[where] = _listing(out)
        best_ck[where] = t.state.best_model_checkpoint and os.path.basename(t.state.best_model_checkpoint)
        end_weights[where] = _weights(t.model)
        del t
    assert kept["mount"] == kept["local"]
    assert best_ck["mount"] == best_ck["local"]
    assert _bit_equal(end_weights["mount"], end_weights["local"])
    if best:
        assert best_ck["local"] != "checkpoint-5"                   # the scenario: best and last differ
        # limit 2: the best and the last; limit 1: the last is kept while training (to resume from) and
        # removed at the end of train() (``os.path.samefile`` against the best: stat through the mount)
        assert kept["local"] == sorted([best_ck["local"], "checkpoint-5"][:limit])
    else:
        assert kept["local"] == ["checkpoint-4", "checkpoint-5"]


@pytest.mark.parametrize("binary", [False, True], ids=["safetensors", "bin"])
def test_can_resume_training_bit_identical(roots, binary):
    """Mirrors test_trainer.py ``test_can_resume_training`` (and ``test_safe_checkpoints`` for the
    weights format): 6 steps saved every 2; a new Trainer resumed from checkpoint-4 on the mount ends
    with weights and optimizer state bit-identical to the uninterrupted run, which is itself
    bit-identical to the same run on a local directory; the checkpoint's weights file
    (``model.safetensors`` or ``pytorch_model.bin``) has the same bytes on both."""
    weights_name = "pytorch_model.bin" if binary else "model.safetensors"
    runs = {}
    for where in ("local", "mount"):
        out = roots[where] / f"resume-{weights_name}"
        t = _trainer(out, 6, binary=binary)
        t.train()
        runs[where] = (_weights(t.model), t.optimizer.state_dict(), t.state.log_history[-1]["train_loss"])
        assert _listing(out) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
        assert weights_name in _listing(out / "checkpoint-4")
        del t
    mount_out = roots["mount"] / f"resume-{weights_name}"
    assert _sha(mount_out / "checkpoint-4" / weights_name) == \
        _sha(roots["local"] / f"resume-{weights_name}" / "checkpoint-4" / weights_name)
    assert _bit_equal(runs["mount"][0], runs["local"][0])
    t = _trainer(mount_out, 6, binary=binary)
    t.train(resume_from_checkpoint=str(mount_out / "checkpoint-4"))
    assert t.state.global_step == 6
    assert _bit_equal(_weights(t.model), runs["mount"][0])
    opt = t.optimizer.state_dict()["state"]
    assert all(_bit_equal(opt[i], runs["mount"][1]["state"][i]) for i in runs["mount"][1]["state"])
    state = json.loads((mount_out / "checkpoint-6" / "trainer_state.json").read_text())
    assert state["global_step"] == 6
    del t
