"""The TPU delegate: under `TPUStrategy`, TensorFlow's own engine does the work.

`make_tpu_embedding` converts tfemb configs to TensorFlow's
(`tfemb.tf_conversion.to_tensorflow`: lossless, shared tables stay shared,
TensorFlow's objects pass through) and returns the engine TensorFlow picks for
the TPU's embedding hardware, as tensorflow-recommenders' layer does:

| `strategy.extended.tpu_hardware_feature.embedding_feature` | engine |
|---|---|
| `V1` (embedding hardware) | `tf.tpu.experimental.embedding.TPUEmbedding` |
| `V2` (SparseCore) | `tf.tpu.experimental.embedding.TPUEmbeddingV2` |
| `UNSUPPORTED` (none) | `tf.tpu.experimental.embedding.TPUEmbeddingV0` |

Nothing else happens here: what the returned object computes is TensorFlow's.

Under a host `TPUStrategy` (`tfemb.patch(tpu=TYPE)`, `tfemb.tpu.host`)
the program's TPU branches run (`tfemb.tpu_strategies.is_tpu_strategy`),
but the engine for the type's embedding hardware is tfemb's host engine of
that generation (`tfemb.TPUEmbedding`, `tfemb.TPUEmbeddingV2`,
`tfemb.TPUEmbeddingV0`): the TPU's numbers on the CPU.

`tfemb.patch()` never changes a name TensorFlow's code reads: TensorFlow's
engine classes here are TensorFlow's, and on a TPU their construction is
TensorFlow's own (`tfemb.patching`).
"""

import inspect
from typing import Any, Callable, Dict, Optional

import tensorflow as tf

from tensorflow.python.tpu import tpu_embedding_v1  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.tpu import tpu_embedding_v2  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.tpu import tpu_embedding_v3  # pylint: disable=g-direct-tensorflow-import

from tfemb import tf_conversion
from tfemb import tf_versions
from tfemb import tpu_strategies
from tfemb.tpu.host import strategy as host_strategy

EmbeddingFeature = tf.tpu.experimental.HardwareFeature.EmbeddingFeature

# TensorFlow's engine classes, by their public names.
TENSORFLOW_ENGINES = {
    "TPUEmbedding": tpu_embedding_v2.TPUEmbedding,
    "TPUEmbeddingV2": tpu_embedding_v3.TPUEmbeddingV2,
    "TPUEmbeddingV0": tpu_embedding_v1.TPUEmbeddingV0,
}


def on_tpu(strategy: Optional[Any] = None) -> bool:
  """The one TPU-or-host decision: whether TensorFlow's TPU engines do the
  work under `strategy` (default: the current one): a TPU strategy that is
  not a host one. Asked by the mid-level classes (`delegated_on_tpu`), the
  engine factory (`make_tpu_embedding`) and the patch's entry
  (`tfemb.patching`)."""
  if strategy is None:
    strategy = tf.distribute.get_strategy()
  return (tpu_strategies.is_tpu_strategy(strategy) and
          not host_strategy.is_host_tpu_strategy(strategy))


# tfemb's host engine of each embedding feature, registered by the classes
# themselves (`delegated_on_tpu`): what a host TPUStrategy's program gets.
_HOST_ENGINES: Dict[EmbeddingFeature, type] = {}


def delegated_on_tpu(make_tpu_engine: Callable[..., Any],
                     feature: Optional[EmbeddingFeature] = None):
  """Class decorator for a mid-level class: created with arguments where
  `on_tpu()`, the class gives TensorFlow's own engine,
  `make_tpu_engine(*args, **kwargs)`, instead of an instance of itself (no
  arguments: copy or pickle re-creating an existing object). The
  `__new__` it installs shows the class's `__init__` arguments, so
  `inspect.signature`, `help()` and IDEs see the constructor's, as for
  TensorFlow's class (Python reads a class's signature from its own
  `__new__` first). With `feature`, the class is tfemb's host engine of
  that embedding hardware, which `make_tpu_embedding` gives under a host
  TPUStrategy."""

  def decorate(cls):
    def __new__(klass, *args, **kwargs):  # pylint: disable=invalid-name
      if (args or kwargs) and on_tpu():
        return make_tpu_engine(*args, **kwargs)
      return super(cls, klass).__new__(klass)

    __new__.__signature__ = inspect.signature(cls.__init__)
    cls.__new__ = staticmethod(__new__)
    if feature is not None:
      _HOST_ENGINES[feature] = cls
    return cls

  return decorate


def resolve_embedding_feature(strategy, requested=None) -> EmbeddingFeature:
  """The embedding hardware to use: the TPU's, or `UNSUPPORTED` on request.

  As tensorflow-recommenders' layer: a requested feature other than
  `UNSUPPORTED` must be the one the TPU has.
  """
  available = strategy.extended.tpu_hardware_feature.embedding_feature
  if requested is None or requested == available:
    return available
  if requested == EmbeddingFeature.UNSUPPORTED:
    return requested
  raise ValueError(
      f"embedding_feature={requested} was requested, but this TPU has "
      f"embedding feature {available}; expected {available} or "
      f"{EmbeddingFeature.UNSUPPORTED} (no embedding hardware).")


def make_tpu_embedding(feature_config: Any,
                       optimizer: Optional[Any],
                       pipeline_execution_with_tensor_core: bool = False,
                       strategy: Optional[tf.distribute.Strategy] = None,
                       embedding_feature: Optional[EmbeddingFeature] = None,
                       sparse_core_embedding_config: Optional[Any] = None):
  """TensorFlow's TPU embedding engine for `feature_config` and `optimizer`.

  Args:
    feature_config: a nested structure of `FeatureConfig`s (tfemb's or
      TensorFlow's), converted with `tfemb.to_tensorflow`.
    optimizer: a tfemb or TensorFlow embedding optimizer, or None.
    pipeline_execution_with_tensor_core: passed to `TPUEmbedding` and
      `TPUEmbeddingV2`; `TPUEmbeddingV0` has no such option.
    strategy: the TPU strategy whose hardware decides (default: the current
      one). TensorFlow's engines bind to the current strategy, so create the
      engine under `strategy.scope()`.
    embedding_feature: None (the TPU's), or `UNSUPPORTED` to use
      `TPUEmbeddingV0` on embedding hardware.
    sparse_core_embedding_config: passed to `TPUEmbeddingV2` only (a
      TensorFlow older than 2.17 takes none: there, anything but None
      raises `tfemb.tf_versions.TensorFlowVersionError`).

  Returns:
    A `tf.tpu.experimental.embedding.TPUEmbedding`, `TPUEmbeddingV2` or
    `TPUEmbeddingV0`.
  """
  strategy = strategy or tf.distribute.get_strategy()
  if not tpu_strategies.is_tpu_strategy(strategy):
    raise ValueError(
        f"The TPU delegate needs a TPUStrategy, got {type(strategy).__name__}; "
        "off the TPU, tfemb.TPUEmbedding is the host engine.")
  feature = resolve_embedding_feature(strategy, embedding_feature)
  if not on_tpu(strategy):  # a host TPUStrategy
    return _host_engine(feature, feature_config, optimizer,
                        pipeline_execution_with_tensor_core,
                        sparse_core_embedding_config)
  feature_config, optimizer = tf_conversion.to_tensorflow(
      (feature_config, optimizer))
  if feature == EmbeddingFeature.V1:
    return TENSORFLOW_ENGINES["TPUEmbedding"](
        feature_config, optimizer, pipeline_execution_with_tensor_core)
  if feature == EmbeddingFeature.V2:
    return make_tpu_embedding_v2(feature_config, optimizer,
                                 pipeline_execution_with_tensor_core,
                                 sparse_core_embedding_config)
  if feature == EmbeddingFeature.UNSUPPORTED:
    return TENSORFLOW_ENGINES["TPUEmbeddingV0"](feature_config, optimizer)
  raise ValueError(f"Unknown TPU embedding feature {feature!r}; expected one "
                   f"of {list(EmbeddingFeature)}.")


def _host_engine(feature: EmbeddingFeature, feature_config: Any,
                 optimizer: Optional[Any],
                 pipeline_execution_with_tensor_core: bool,
                 sparse_core_embedding_config: Optional[Any]):
  """tfemb's host engine of `feature`'s generation, under a host
  TPUStrategy (`tfemb.TPUEmbedding`, `TPUEmbeddingV2`, `TPUEmbeddingV0`)."""
  engine = _HOST_ENGINES[feature]
  if feature == EmbeddingFeature.V1:
    return engine(feature_config, optimizer,
                  pipeline_execution_with_tensor_core)
  if feature == EmbeddingFeature.V2:
    return engine(feature_config, optimizer,
                  pipeline_execution_with_tensor_core,
                  sparse_core_embedding_config)
  return engine(feature_config, optimizer)


def make_tpu_embedding_v2(feature_config: Any,
                          optimizer: Optional[Any] = None,
                          pipeline_execution_with_tensor_core: bool = False,
                          sparse_core_embedding_config: Optional[Any] = None):
  """TensorFlow's `TPUEmbeddingV2`, given each argument only where the
  installed TensorFlow's class takes it (`tfemb.tf_versions.construct`)."""
  feature_config, optimizer, sparse_core_embedding_config = (
      tf_conversion.to_tensorflow(
          (feature_config, optimizer, sparse_core_embedding_config)))
  return tf_versions.construct(
      TENSORFLOW_ENGINES["TPUEmbeddingV2"],
      dict(feature_config=feature_config, optimizer=optimizer,
           pipeline_execution_with_tensor_core=(
               pipeline_execution_with_tensor_core),
           sparse_core_embedding_config=sparse_core_embedding_config),
      "TPUEmbeddingV2", positional=True)

