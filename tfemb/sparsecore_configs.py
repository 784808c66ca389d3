"""The SparseCore generation's configuration classes: TensorFlow's own.

`CustomOptimizer`, `CustomCombiner`, `RowIdInitializer` and
`SparseCoreEmbeddingConfig` hold data (or, for `RowIdInitializer`, compute
an initial value) and nothing else, so tfemb uses TensorFlow's classes as
they are: with TensorFlow 2.21, `tfemb.CustomOptimizer is
tf.tpu.experimental.embedding.CustomOptimizer`. Their signatures, defaults,
validation and errors are TensorFlow's by construction, and they need no
conversion for TensorFlow's engines.

An older TensorFlow lacks some of them, or has them without 2.21's newer
arguments (`tfemb.tf_versions.ADDED_IN`); there tfemb has 2.21's classes
(`tfemb.sparsecore_backports`), so tfemb's API stays 2.21's.
"""

import tensorflow as tf

from tfemb import sparsecore_backports
from tfemb import tf_versions

CustomCombiner = (tf_versions.newest_class("CustomCombiner") or
                  sparsecore_backports.CustomCombiner)
CustomOptimizer = (tf_versions.newest_class("CustomOptimizer") or
                   sparsecore_backports.CustomOptimizer)
# Every class `tfemb.optimizers.is_custom` takes: tfemb's, and TensorFlow's
# own where it differs (2.18 to 2.20: without `slot_dims`), which a script
# written for that TensorFlow passes.
CUSTOM_OPTIMIZER_CLASSES = tuple(
    {CustomOptimizer: None,
     getattr(tf.tpu.experimental.embedding, "CustomOptimizer",
             CustomOptimizer): None})
RowIdInitializer = tf.tpu.experimental.embedding.RowIdInitializer
SparseCoreEmbeddingConfig = (
    tf_versions.newest_class("SparseCoreEmbeddingConfig") or
    sparsecore_backports.SparseCoreEmbeddingConfig)

__all__ = ["CustomCombiner", "CustomOptimizer", "RowIdInitializer",
           "SparseCoreEmbeddingConfig"]
