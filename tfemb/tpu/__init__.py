"""tfemb and the TPU, one concern per package:

* the delegate (`tfemb.tpu.delegate`: `make_tpu_embedding`, `on_tpu`):
  under a TPU's `TPUStrategy`, `tfemb.TPUEmbedding` is TensorFlow's own
  engine;
* the planner (`tfemb.tpu.planner`: `plan`): memory per table, host and
  chip, and the `TPUEmbeddingConfiguration` proto TensorFlow's
  `TPUEmbedding` would send; `python -m tfemb.tpu MODULE:ATTR ...` prints
  it;
* the host TPU (`tfemb.tpu.host`): a Cloud TPU type emulated on the CPU
  under `tfemb.patch(tpu=TYPE)`.
"""

from tfemb.tpu.delegate import on_tpu
from tfemb.tpu.delegate import make_tpu_embedding
from tfemb.tpu.planner import TPUPlan
from tfemb.tpu.planner import plan
