"""Embedding optimizers: SGD, Adagrad, AdagradMomentum, Adam, FTRL.

The classes (`parameters.py`) only hold parameters, exactly like
`tf.tpu.experimental.embedding.SGD` and friends. Each optimizer is declared
once (`declarations.py`, a `Declaration`): its name, TensorFlow's class, its
slots, its update rule (`tfemb.update_rules`), the constants its C++ row
rule reads and its fields in TensorFlow's `OptimizationParameters` proto.
The update (`tfemb.update_rules.apply`), the fused kernels (whose C++ rule
table is generated from the declarations), the TPU proto
(`tfemb.tpu.planner.config_proto`) and the Keras layer's config all read it.
`identify(optimizer)` finds the declaration of a tfemb or a TensorFlow
optimizer object. TensorFlow's `CustomOptimizer` (the SparseCore's per-row
computation; `is_custom`) has no declaration: only `TPUEmbeddingV2` runs it.
"""

from typing import Any

from tfemb.optimizers.parameters import FTRL
from tfemb.optimizers.parameters import SGD
from tfemb.optimizers.parameters import Adagrad
from tfemb.optimizers.parameters import AdagradMomentum
from tfemb.optimizers.parameters import Adam
from tfemb.optimizers.parameters import ClipValueType
from tfemb.optimizers.parameters import CountingLearningRate
from tfemb.optimizers.parameters import LearningRate
from tfemb.optimizers.parameters import _Optimizer
from tfemb.optimizers.declarations import DECLARATIONS
from tfemb.optimizers.declarations import Declaration
from tfemb.optimizers.declarations import divides_by_learning_rate
from tfemb.optimizers.declarations import identify
from tfemb.optimizers.declarations import is_lazy
from tfemb.optimizers.declarations import is_optimizer
from tfemb.optimizers.tf_methods import constructor_args
from tfemb.optimizers.tf_methods import slot_dims
from tfemb.optimizers.tf_methods import slot_initializers
from tfemb.optimizers.tf_methods import slot_names
from tfemb import sparsecore_configs
from tfemb.sparsecore_configs import CustomOptimizer

# What `from tfemb.optimizers import *` (and so `tfemb`) exports: every
# declared optimizer's class.
__all__ = [declaration.name for declaration in DECLARATIONS]


def is_custom(optimizer: Any) -> bool:
  """Whether `optimizer` is a `CustomOptimizer` (or a subclass): tfemb's,
  or any TensorFlow release's own (`sparsecore_configs.is_a`)."""
  return sparsecore_configs.is_a(optimizer, "CustomOptimizer")
