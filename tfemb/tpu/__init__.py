"""tfemb on the TPU: the delegate to TensorFlow's engines, and the offline plan.

* `make_tpu_embedding`, `on_tpu` (`tfemb.tpu.delegate`): under a
  `TPUStrategy`, `tfemb.TPUEmbedding` is TensorFlow's own engine.
* `plan` (`tfemb.tpu.planning`): memory per table, host and chip, and the
  `TPUEmbeddingConfiguration` proto TensorFlow's `TPUEmbedding` would send;
  `python -m tfemb.tpu MODULE:ATTR ...` prints it.
"""

from tfemb.tpu.delegate import on_tpu
from tfemb.tpu.delegate import make_tpu_embedding
from tfemb.tpu.planning import TPUPlan
from tfemb.tpu.planning import plan
