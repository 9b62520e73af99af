"""The runtimes' retention rules, modelled on what their sources do (each rule's ``source``
names the runtime and its configuration; versions read: torchtitan b5bcd76 and v0.2.2, Megatron-LM d98e8a6,
nvidia-resiliency-ext d8686d9, pytorch-lightning 7f0c343, NeMo 8cfedd7, transformers 4.57.6, accelerate 1.15.0).

Each rule is a frozen dataclass of the runtime's configuration; its session knows the save schedule,
the condition it can hint for each save, and when (relative to which save, and in which order) the
runtime deletes.  Command-line names:

* ``torchtitan:interval=500,keep_latest_k=10[,async=true][,last_save_model_only=true]``
* ``megatron:save_interval=1000[,retain_interval=5000][,non_persistent_interval=100][,non_persistent=global|local]``
* ``lightning:every_n_train_steps=500[,save_top_k=1][,metric=synthetic|none|FILE][,mode=min|max][,save_last=false]``
* ``hf:save_steps=500[,save_total_limit=3][,metric=synthetic|FILE][,greater_is_better=false]``
* ``accelerate:save_steps=500[,total_limit=3]``
* ``orbax:[latest=3][,every_steps=10000][,save_interval_steps=1]``

One module per runtime family (imported here in this order, which is the order the rules register
in): :mod:`.rules_torchtitan`, :mod:`.rules_megatron`, :mod:`.rules_lightning`, :mod:`.rules_hf`,
:mod:`.rules_accelerate`, :mod:`.rules_orbax`; shared helpers in :mod:`.rules_common`.
"""

from __future__ import annotations

# The import order is the order the rules register in (``retainz trace rules`` lists them so).
# isort: off
from retainz.retention.rules_torchtitan import TorchTitan
from retainz.retention.rules_megatron import Megatron
from retainz.retention.rules_lightning import Lightning
from retainz.retention.rules_hf import HFTrainer
from retainz.retention.rules_accelerate import Accelerate
from retainz.retention.rules_orbax import Orbax
# isort: on

__all__ = ["TorchTitan", "Megatron", "Lightning", "HFTrainer", "Accelerate", "Orbax"]
