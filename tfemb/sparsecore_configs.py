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

from typing import Any

import tensorflow as tf

from tfemb import sparsecore_backports
from tfemb import tf_versions

CustomCombiner = (tf_versions.newest_class("CustomCombiner") or
                  sparsecore_backports.CustomCombiner)
CustomOptimizer = (tf_versions.newest_class("CustomOptimizer") or
                   sparsecore_backports.CustomOptimizer)
RowIdInitializer = tf.tpu.experimental.embedding.RowIdInitializer
SparseCoreEmbeddingConfig = (
    tf_versions.newest_class("SparseCoreEmbeddingConfig") or
    sparsecore_backports.SparseCoreEmbeddingConfig)

__all__ = ["CustomCombiner", "CustomOptimizer", "RowIdInitializer",
           "SparseCoreEmbeddingConfig"]

# Where the classes `is_a` recognises are defined: TensorFlow's TPU
# package (every release that has them: 2.18's CustomOptimizer without
# `slot_dims`, 2.20's CustomCombiner) and tfemb's copies of 2.21's.
_HOMES = ("tensorflow.python.tpu.", sparsecore_backports.__name__)


def is_a(obj: Any, name: str) -> bool:
  """Whether `obj` is a `CustomOptimizer` or `CustomCombiner` (`name`), or
  of a subclass: tfemb's, the
  installed TensorFlow's, or another TensorFlow release's (a script written
  for 2.18 to 2.20 passes that release's own class, older than tfemb's).
  By the class's name and module, so no release's class object is needed
  and `tfemb.patch` replacing TensorFlow's names changes nothing."""
  return any(c.__name__ == name and (c.__module__ + ".").startswith(_HOMES)
             for c in type(obj).__mro__)
