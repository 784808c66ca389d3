"""tfemb: TensorFlow's `tf.tpu.experimental.embedding` API, with the TPU
embedding engine's exact numbers on CPU and GPU."""

# First, before TensorFlow loads: a TPU VM program's runtime settings set
# aside where a TPU is emulated (tfemb/tpu_vm.py).
from tfemb import tpu_vm
tpu_vm.prepare()
# Then: a clear error when no supported TensorFlow is installed.
from tfemb import tf_versions  # pylint: disable=g-import-not-at-top,wrong-import-position
from tfemb.configs import FeatureConfig
from tfemb.configs import QuantizationConfig
from tfemb.configs import TableConfig
from tfemb.mid_level import TPUEmbedding
# Every declared optimizer's class (`tfemb.optimizers.DECLARATIONS`): SGD,
# Adagrad, AdagradMomentum, Adam, FTRL.
from tfemb.optimizers import *  # pylint: disable=wildcard-import
from tfemb.options import Options
from tfemb.patching import patch
from tfemb.patching import unpatch
from tfemb.serving import TPUEmbeddingForServing
from tfemb.serving import serving_embedding_lookup
from tfemb.serving import export_for_serving
# TensorFlow's own classes: CustomCombiner, CustomOptimizer,
# RowIdInitializer, SparseCoreEmbeddingConfig.
from tfemb.sparsecore_configs import *  # pylint: disable=wildcard-import
from tfemb.sparsecore.engine import TPUEmbeddingV2
from tfemb.tf_conversion import to_tensorflow
from tfemb.v0 import TPUEmbeddingV0
from tfemb import compat
from tfemb import optimizers
from tfemb import options
from tfemb import sparsecore_configs
from tfemb import tpu

__version__ = "0.1.0"

# The Keras layer and the checkpoint converter, imported on first use: the
# mid-level API does not need them, and `tfemb.layers.TPUEmbedding` works
# after a plain `import tfemb`.
_LAZY_SUBPACKAGES = ("layers", "migrate")


def __getattr__(name):
  if name in _LAZY_SUBPACKAGES:
    import importlib  # pylint: disable=g-import-not-at-top
    return importlib.import_module(f"tfemb.{name}")
  raise AttributeError(f"module 'tfemb' has no attribute {name!r}")

__all__ = optimizers.__all__ + sparsecore_configs.__all__ + [
    "TableConfig", "FeatureConfig", "QuantizationConfig", "TPUEmbedding",
    "to_tensorflow", "Options", "TPUEmbeddingForServing",
    "serving_embedding_lookup", "TPUEmbeddingV0", "TPUEmbeddingV2", "patch",
    "unpatch", "export_for_serving",
]
