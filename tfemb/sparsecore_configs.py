"""The SparseCore generation's configuration classes: TensorFlow's own.

`CustomOptimizer`, `CustomCombiner`, `RowIdInitializer` and
`SparseCoreEmbeddingConfig` hold data (or, for `RowIdInitializer`, compute
an initial value) and nothing else, so tfemb uses TensorFlow's classes as
they are: `tfemb.CustomOptimizer is
tf.tpu.experimental.embedding.CustomOptimizer`. Their signatures, defaults,
validation and errors are TensorFlow's by construction, and they need no
conversion for TensorFlow's engines.
"""

import tensorflow as tf

_tf_embedding = tf.tpu.experimental.embedding

CustomCombiner = _tf_embedding.CustomCombiner
CustomOptimizer = _tf_embedding.CustomOptimizer
RowIdInitializer = _tf_embedding.RowIdInitializer
SparseCoreEmbeddingConfig = _tf_embedding.SparseCoreEmbeddingConfig

__all__ = ["CustomCombiner", "CustomOptimizer", "RowIdInitializer",
           "SparseCoreEmbeddingConfig"]
