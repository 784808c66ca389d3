"""The Keras layer's engines, one small adapter per path.

The layer talks to its engine through an adapter, so its own code is the
same everywhere. `EngineAdapter` (`base.py`) declares what every adapter
gives the layer; the layer uses nothing else. `make_adapter` picks one.

| path | adapter | engine |
|---|---|---|
| any non-TPU strategy | `HostAdapter` | `tfemb.TPUEmbedding` (the host engine) |
| off the TPU, asked for V2 | `HostV2Adapter` | `tfemb.TPUEmbeddingV2` (the SparseCore's numbers on the host) |
| TPU, embedding hardware `V1` | `TPUV1Adapter` | `tf.tpu.experimental.embedding.TPUEmbedding` |
| TPU, SparseCore (`V2`) | `TPUV2Adapter` | `TPUEmbeddingV2` |
| TPU, `UNSUPPORTED` | `TPUV0Adapter` | `TPUEmbeddingV0` |

The TPU adapters (`tpu.py`) follow tensorflow-recommenders' layer call for
call (`_tpu_embedding_lookup`, `build`, `embedding_tables`). The SparseCore's
stacked tables are `stacked.py`'s, on both paths. Every path that trains in
the backward pass does so through one gradient trap
(`tfemb.layers.gradient_trap`).
"""

from tfemb.layers.adapters.base import EngineAdapter
from tfemb.layers.adapters.host import HostAdapter
from tfemb.layers.adapters.host import HostV2Adapter
from tfemb.layers.adapters.tpu import TPUV0Adapter
from tfemb.layers.adapters.tpu import TPUV1Adapter
from tfemb.layers.adapters.tpu import TPUV2Adapter
from tfemb.tpu import delegate

EmbeddingFeature = delegate.EmbeddingFeature


def make_adapter(tpu_branches, config, optimizer, strategy,
                 pipeline_execution_with_tensor_core=False,
                 embedding_feature=None, sparse_core_embedding_config=None
                 ) -> EngineAdapter:
  """The adapter for `strategy`: a host engine unless `tpu_branches`.

  Args:
    tpu_branches: whether `strategy` is a TPU strategy
      (`tfemb.tpu_strategies.is_tpu_strategy`: a TPU's or a host one; the
      engine is then the TPU's or tfemb's).
    config: the layer's `tfemb.resolution.Resolved` configuration (named
      tables with their optimizers), which the host engines take as it is.
    optimizer: the layer's embedding optimizer (or None).
    strategy: the strategy the layer is created under.
    pipeline_execution_with_tensor_core: passed to the engine.
    embedding_feature: None (the TPU's) or the feature to use on a TPU.
    sparse_core_embedding_config: for `TPUEmbeddingV2`.
  """
  if not tpu_branches:
    if (embedding_feature == EmbeddingFeature.V2 or
        sparse_core_embedding_config is not None):
      return HostV2Adapter.create(
          config, pipeline_execution_with_tensor_core, embedding_feature,
          sparse_core_embedding_config)
    return HostAdapter.create(config, pipeline_execution_with_tensor_core,
                              embedding_feature)
  feature = delegate.resolve_embedding_feature(strategy, embedding_feature)
  adapter = {EmbeddingFeature.V1: TPUV1Adapter,
             EmbeddingFeature.V2: TPUV2Adapter,
             EmbeddingFeature.UNSUPPORTED: TPUV0Adapter}[feature]
  return adapter(config, optimizer, strategy,
                 pipeline_execution_with_tensor_core, feature,
                 sparse_core_embedding_config)
