"""Embedding optimizers: SGD, Adagrad, AdagradMomentum, Adam, FTRL.

The classes (`parameters.py`) only hold parameters, exactly like
`tf.tpu.experimental.embedding.SGD` and friends. Each optimizer is declared
once (`declarations.py`, a `Declaration`): its name, TensorFlow's class, its
slots, its update rule (`tfemb.update_rules`), the constants its C++ row
rule reads and its fields in TensorFlow's `OptimizationParameters` proto.
The update (`tfemb.update_rules.apply`), the fused kernels (whose C++ rule
table is generated from the declarations), the TPU proto
(`tfemb.tpu.config_proto`) and the Keras layer's config all read it.
`identify(optimizer)` finds the declaration of a tfemb or a TensorFlow
optimizer object. TensorFlow's `CustomOptimizer` (the SparseCore's per-row
computation; `is_custom`) has no declaration: only `TPUEmbeddingV2` runs it.
"""

import functools
from typing import Any, Dict

from tfemb.optimizers.parameters import FTRL
from tfemb.optimizers.parameters import SGD
from tfemb.optimizers.parameters import Adagrad
from tfemb.optimizers.parameters import AdagradMomentum
from tfemb.optimizers.parameters import Adam
from tfemb.optimizers.parameters import ClipValueType
from tfemb.optimizers.parameters import LearningRate
from tfemb.optimizers.parameters import _Optimizer
from tfemb.optimizers.declarations import DECLARATIONS
from tfemb.optimizers.declarations import Declaration
from tfemb import sparsecore_configs
from tfemb.sparsecore_configs import CustomOptimizer

# What `from tfemb.optimizers import *` (and so `tfemb`) exports: every
# declared optimizer's class.
__all__ = [declaration.name for declaration in DECLARATIONS]


@functools.lru_cache(maxsize=None)
def _by_class() -> Dict[type, Declaration]:
  by_class = {}
  for declaration in DECLARATIONS:
    by_class[declaration.cls] = declaration
    by_class[declaration.tf_class] = declaration
  return by_class


def identify(optimizer: Any) -> Declaration:
  """The declaration of `optimizer`, an instance of one of tfemb's optimizer
  classes or of TensorFlow's (`tf.tpu.experimental.embedding`), or of a
  subclass of one.

  Raises:
    ValueError: for any other object, naming the supported classes.
  """
  for cls in type(optimizer).__mro__:
    declaration = _by_class().get(cls)
    if declaration is not None:
      return declaration
  names = ", ".join(d.name for d in DECLARATIONS)
  raise ValueError(
      f"{type(optimizer)} is an unsupported optimizer class. Please pass an "
      "instance of one of the optimizer classes under tfemb or "
      f"tf.tpu.experimental.embedding: {names}.")


def is_optimizer(optimizer: Any) -> bool:
  """Whether `identify(optimizer)` knows it."""
  return any(cls in _by_class() for cls in type(optimizer).__mro__)


def is_custom(optimizer: Any) -> bool:
  """Whether `optimizer` is a `CustomOptimizer` (or a subclass): tfemb's,
  or any TensorFlow release's own (`sparsecore_configs.is_a`)."""
  return sparsecore_configs.is_a(optimizer, "CustomOptimizer")
