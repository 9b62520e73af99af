"""Training runtimes, unmodified, on a ``retainz mount``: torch.save/torch.load (mmap), safetensors,
HF Trainer (tiny 2-layer Llama built locally: save_steps, save_total_limit=2, resume_from_checkpoint),
TorchTitan's CheckpointManager (DCP, keep_latest_k purge, load discovery) and Lightning's
ModelCheckpoint (save_top_k rotation).  Every runtime writes plain paths; the store sees generations."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="needs the torch extra (make setup-torch)")
pytest.importorskip("fsspec", reason="the mount extra (make setup-mount)")

from tests.mountcheck import (  # noqa: E402
    ROOT,
    env,
    fsck_clean,
    generations,
    make_device,
    mounted,
    paths,
    require_fuse,
)

pytestmark = [pytest.mark.mount, pytest.mark.dcp]


@pytest.fixture(autouse=True)
def _fuse():
    require_fuse()


def test_torch_save_load_mmap_and_safetensors(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    device = make_device(tmp_path)
    torch.manual_seed(0)
    sd = {"w": torch.randn(1024, 1024), "b": torch.randn(1024), "step": torch.tensor(7)}   # ~4 MiB
    with mounted(device, tmp_path / "mnt") as mnt:
        os.makedirs(mnt / "ckpt" / "step-7")
        torch.save(sd, mnt / "ckpt" / "step-7" / "model.pt")
        save_file({k: v for k, v in sd.items() if k != "step"}, mnt / "ckpt" / "weights.safetensors")
        back = torch.load(mnt / "ckpt" / "step-7" / "model.pt", mmap=True, weights_only=True)
        assert all(torch.equal(back[k], sd[k]) for k in sd)
        st = load_file(mnt / "ckpt" / "weights.safetensors")
        assert torch.equal(st["w"], sd["w"])
        with safe_open(mnt / "ckpt" / "weights.safetensors", framework="pt") as f:   # random access
            assert torch.equal(f.get_slice("w")[512:520], sd["w"][512:520])
        del back, st
        gc.collect()                               # drop the mmaps before unmounting
    # step-7 has no commit point of its own: it commits when read back; safetensors writes a temporary
    # file and renames it before closing it: that generation commits under its final name (issue 27.5(b):
    # no temporary id, no layout shard)
    gens = paths(device)
    assert sorted(gens) == ["ckpt/step-7", "ckpt/weights.safetensors"]
    assert gens["ckpt/step-7"].id == "ckpt%2Fstep-7" and gens["ckpt/step-7"].step == 7
    assert gens["ckpt/weights.safetensors"].id == "@ckpt%2Fweights.safetensors"
    assert list(gens["ckpt/weights.safetensors"].shards) == ["file"]
    with mounted(device, tmp_path / "mnt") as mnt:
        back = torch.load(mnt / "ckpt" / "step-7" / "model.pt", mmap=True, weights_only=True)
        assert torch.equal(back["w"], sd["w"])
        del back
        gc.collect()
    assert fsck_clean(device)


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(cfg)


class _Data(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        ids = torch.randint(0, 64, (16,), generator=g)
        return {"input_ids": ids, "labels": ids.clone()}


def _trainer(out, max_steps):
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(output_dir=str(out), save_strategy="steps", save_steps=2, save_total_limit=2,
                             max_steps=max_steps, per_device_train_batch_size=4, learning_rate=1e-3,
                             report_to=[], use_cpu=True, logging_steps=1000, disable_tqdm=True,
                             dataloader_num_workers=0, seed=0)
    return Trainer(model=_tiny_llama(), args=args, train_dataset=_Data())


def test_hf_trainer_save_total_limit_and_resume(tmp_path):
    pytest.importorskip("transformers", reason="needs the payload extra (make setup-torch)")
    device = make_device(tmp_path, zones=64)
    with mounted(device, tmp_path / "mnt", "--retention", "hf:save_steps=2,save_total_limit=2") as mnt:
        out = mnt / "hf"
        t = _trainer(out, 6)
        t.train()
        assert sorted(os.listdir(out)) == ["checkpoint-4", "checkpoint-6"]      # save_total_limit=2
        assert json.loads((out / "checkpoint-6" / "trainer_state.json").read_text())["global_step"] == 6
        w6 = {k: v.clone() for k, v in t.model.state_dict().items()}
        t2 = _trainer(out, 8)
        t2.train(resume_from_checkpoint=True)       # get_last_checkpoint: checkpoint-6, through the mount
        assert t2.state.global_step == 8
        assert sorted(os.listdir(out)) == ["checkpoint-6", "checkpoint-8"]
        # the resumed run started from checkpoint-6's weights: load them back and compare
        from safetensors.torch import load_file

        saved6 = load_file(out / "checkpoint-6" / "model.safetensors")
        assert all(torch.equal(saved6[k], w6[k]) for k in saved6)
        del t, t2, saved6
        gc.collect()                               # the runtime's mmaps of the mount go before unmounting
    gens = generations(device)
    assert sorted(gens) == ["hf%2Fcheckpoint-6", "hf%2Fcheckpoint-8"]
    g = gens["hf%2Fcheckpoint-8"]
    assert {"model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json"} <= set(g.shards)
    assert g.step == 8 and g.hint.reclaim_step == 12          # HF rule: retired by the save 2 intervals later
    assert fsck_clean(device)


def test_torchtitan_checkpoint_manager(tmp_path):
    pytest.importorskip("torchtitan", reason="needs the runtimes extra (make setup-torch)")
    device = make_device(tmp_path)
    with mounted(device, tmp_path / "mnt") as mnt:
        r = subprocess.run([sys.executable, str(ROOT / "tests/workers/mount_torchtitan.py"), str(mnt / "ckpt"),
                            str(tmp_path / "pg")], capture_output=True, text=True, timeout=300, env=env(), cwd=ROOT)
        assert r.returncode == 0, r.stderr[-4000:]
        res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["after"]["10"] == ["step-10"] and res["after"]["20"] == ["step-10", "step-20"]
    # keep_latest_k=2: the save at 30 purges step-10 (purge thread); the last step (40) saves without a purge
    assert res["final"] == ["step-20", "step-30", "step-40"]
    assert res["load_step"] == 40 and res["loaded"] is True and res["weights_equal"] is True
    gens = generations(device)
    assert sorted(gens) == ["ckpt%2Fstep-20", "ckpt%2Fstep-30", "ckpt%2Fstep-40"]
    assert ".metadata" in gens["ckpt%2Fstep-40"].shards
    assert fsck_clean(device)


def test_lightning_model_checkpoint(tmp_path):
    pl = pytest.importorskip("pytorch_lightning", reason="needs the runtimes extra (make setup-torch)")

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    device = make_device(tmp_path)
    with mounted(device, tmp_path / "mnt") as mnt:
        ckpt = pl.callbacks.ModelCheckpoint(dirpath=str(mnt / "lightning"), every_n_train_steps=2, save_top_k=1,
                                            filename="{epoch}-{step}")
        data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
        model = Tiny()
        trainer = pl.Trainer(max_steps=8, callbacks=[ckpt], logger=False, enable_progress_bar=False,
                             enable_model_summary=False, default_root_dir=str(tmp_path), accelerator="cpu")
        trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=2))
        assert os.listdir(mnt / "lightning") == ["epoch=0-step=8.ckpt"]
        back = torch.load(mnt / "lightning" / "epoch=0-step=8.ckpt", weights_only=False)
        assert back["global_step"] == 8
        assert torch.equal(back["state_dict"]["layer.weight"], model.layer.weight.detach())
    gens = generations(device)
    assert sorted(gens) == ["@lightning%2Fepoch=0-step=8.ckpt"]
    assert gens["@lightning%2Fepoch=0-step=8.ckpt"].step == 8
    assert fsck_clean(device)
