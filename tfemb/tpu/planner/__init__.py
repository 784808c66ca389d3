"""The TPU plan: what TensorFlow's `TPUEmbedding` (embedding hardware V1)
needs on a TPU, worked out on the CPU (docs/tpu.md, "Planning a TPU").

* `memory.py`: `plan` and `TPUPlan`, bytes per table, host and chip;
* `config_proto.py`: the `TPUEmbeddingConfiguration` proto TensorFlow's
  engine would send (also the host engine's `_create_config_proto`);
* `report.py`: a plan as text;
* `cli.py`, `command_line.py`: `python -m tfemb.tpu MODULE:ATTR ...`, and
  what its commands share.
"""

from tfemb.tpu.planner.memory import TPUPlan
from tfemb.tpu.planner.memory import plan
