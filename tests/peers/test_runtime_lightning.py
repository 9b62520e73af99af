"""Lightning's ModelCheckpoint (pytorch-lightning, unmodified) writing to a retainz:// dirpath: each
checkpoint file is a generation, and its save_top_k=1 rotation (no monitor) deletes the previous file
through fsspec ``rm`` after each new save."""

from __future__ import annotations

import pytest

pl = pytest.importorskip("pytorch_lightning", reason="needs the runtimes extra (make setup-torch)")
import fsspec  # noqa: E402
import torch  # noqa: E402

from retainz.jobs import stores  # noqa: E402

pytestmark = pytest.mark.dcp


class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Recorder(pl.Callback):
    """Records the device's generations at the start of each batch (after the previous batch's save)."""

    def __init__(self, device):
        self.device, self.seen = device, {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        with stores.using(self.device) as store:
            self.seen[trainer.global_step] = sorted(g.id for g in store.generations())


def test_model_checkpoint_rotation_on_retainz(tmp_path):
    from retainz.integrations.fsspec_fs import RetainZFileSystem
    from retainz.store import Store
    from retainz.zoned import FileDevice, Geometry

    device = str(tmp_path / "dev.img")
    dev = FileDevice.create(device, Geometry(nr_zones=32, zone_size=1 << 20, zone_capacity=1 << 20))
    Store.format(dev).close()
    dev.close()
    fsspec.config.conf["retainz"] = {"retention": "lightning:every_n_train_steps=2,save_top_k=1,metric=none"}
    try:
        ckpt = pl.callbacks.ModelCheckpoint(dirpath=f"retainz://{device}/lightning", every_n_train_steps=2,
                                            save_top_k=1, filename="{epoch}-{step}")
        rec = Recorder(device)
        data = torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randn(8, 1))
        trainer = pl.Trainer(max_steps=8, callbacks=[rec, ckpt], logger=False, enable_progress_bar=False,
                             enable_model_summary=False, default_root_dir=str(tmp_path), accelerator="cpu")
        trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=1))
        fid = lambda s: f"@lightning%2Fepoch=0-step={s}.ckpt"  # noqa: E731
        # global_step g at a batch start: the saves up to step g are done; each new save removed the
        # previous file (save_top_k=1, no monitor)
        assert rec.seen == {0: [], 1: [], 2: [fid(2)], 3: [fid(2)], 4: [fid(4)], 5: [fid(4)], 6: [fid(6)],
                            7: [fid(6)]}
        with stores.using(device) as store:
            gens = {g.id: g for g in store.generations()}
        assert list(gens) == [fid(8)]
        assert gens[fid(8)].step == 8 and gens[fid(8)].hint.reclaim_step == 10
        assert ckpt.best_model_path.endswith("lightning/epoch=0-step=8.ckpt")
        # the file is a real Lightning checkpoint: read it back through fsspec and torch.load
        with fsspec.open(ckpt.best_model_path, "rb") as f:
            state = torch.load(f, weights_only=False)
        assert state["global_step"] == 8 and "state_dict" in state
    finally:
        fsspec.config.conf.pop("retainz", None)
        RetainZFileSystem.close_all()
