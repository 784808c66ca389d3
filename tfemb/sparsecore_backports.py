"""TensorFlow 2.21's SparseCore config classes, for an older TensorFlow.

`tfemb.sparsecore_configs` uses TensorFlow's own `CustomOptimizer`,
`CustomCombiner` and `SparseCoreEmbeddingConfig` where the installed
TensorFlow has them with 2.21's arguments (`tfemb.tf_versions`), and these
otherwise: the same constructors, attributes and checks as 2.21's
(`tensorflow/python/tpu/tpu_embedding_v2_utils.py` and
`tpu_embedding_v3.py`), so a script written for 2.21 runs on the host with
any supported TensorFlow. `tfemb.to_tensorflow` turns them into the
installed TensorFlow's classes for its TPU engines, or raises a
`tfemb.tf_versions.TensorFlowVersionError` where that TensorFlow has no
such class or argument.
"""

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from tensorflow.python.tpu import tpu_embedding_v2_utils  # pylint: disable=g-direct-tensorflow-import


class CustomOptimizer(tpu_embedding_v2_utils._Optimizer):  # pylint: disable=protected-access
  """`tf.tpu.experimental.embedding.CustomOptimizer` of TensorFlow 2.21: a
  per-row `custom_computation(gradient, embedding_table, slot_variables,
  learning_rate, hyperparameters)` returning the updated row and slots."""

  def __init__(
      self,
      custom_computation: Callable[..., Any],
      learning_rate: Union[float, Callable[[], float]] = 0.01,
      slot_names: Optional[List[str]] = None,
      slot_initializers: Optional[List[Any]] = None,
      hyperparameters: Optional[List[Union[float, Callable[[], float]]]] = None,
      slot_dims: Optional[List[int]] = None,
  ):
    super().__init__(
        learning_rate,
        use_gradient_accumulation=False,
        clip_weight_min=None,
        clip_weight_max=None,
        weight_decay_factor=None,
        multiply_weight_decay_factor_by_learning_rate=None,
        clipvalue=None,
        slot_variable_creation_fn=None,
        low_dimensional_packing_status=False,
    )
    self._slot_names_attr = tuple(slot_names if slot_names else ())
    self._slot_initializers_attr = tuple(
        slot_initializers if slot_initializers else ())
    self._slot_dims_attr = tuple(slot_dims if slot_dims else ())
    num_slot_names = len(self._slot_names_attr)
    num_slot_initializers = len(self._slot_initializers_attr)
    if num_slot_names != num_slot_initializers:
      raise ValueError(
          f"The number of slot_names ({num_slot_names}) must match"
          " the number of slot_initializers"
          f" ({num_slot_initializers}).")
    if self._slot_dims_attr:
      if len(self._slot_dims_attr) != num_slot_names:
        raise ValueError(
            f"The number of slot_dims ({len(self._slot_dims_attr)}) must match "
            f"the number of slot_names ({num_slot_names}).")
      for i, dim in enumerate(self._slot_dims_attr):
        if dim not in (1, 2):
          raise ValueError(
              f"Unsupported slot dim '{dim}' for slot"
              f" '{self._slot_names_attr[i]}'. Only 1D and 2D are supported.")
    self._hyperparameters = tuple(hyperparameters if hyperparameters else ())
    self._custom_computation = custom_computation

  def _slot_names(self) -> List[str]:
    return list(self._slot_names_attr)

  def _slot_initializers(self) -> List[Any]:
    return list(self._slot_initializers_attr)

  def _load(self):
    raise NotImplementedError(
        "Custom optimizer does not support load op since it is only used for"
        " TPUEmbeddingV2.")

  def _retrieve(self):
    raise NotImplementedError(
        "Custom optimizer does not support retrieve op since it is only used"
        " for TPUEmbeddingV2.")

  @property
  def hyperparameters(self) -> Tuple[Any, ...]:
    return self._hyperparameters

  @property
  def custom_computation(self) -> Callable[..., Any]:
    return self._custom_computation

  @property
  def slot_dims(self) -> Tuple[int, ...]:
    return self._slot_dims_attr

  def _constructor_args(self) -> Dict[str, Any]:
    """The arguments that rebuild it (`tfemb.to_tensorflow`)."""
    return dict(custom_computation=self._custom_computation,
                learning_rate=self.learning_rate,
                slot_names=list(self._slot_names_attr) or None,
                slot_initializers=list(self._slot_initializers_attr) or None,
                hyperparameters=list(self._hyperparameters) or None,
                slot_dims=list(self._slot_dims_attr) or None)


class CustomCombiner:
  """`tf.tpu.experimental.embedding.CustomCombiner` of TensorFlow 2.21: a
  per-example `combiner_computation(valency, vectors[, weights])`."""

  CUSTOM_COMBINER_SLOT_NAME = "custom_combiner_variables"

  def __init__(
      self,
      combiner_computation: Callable[..., Any],
      max_valency: int,
      num_weights: int = 0,
      initializer: Optional[Any] = None,
      combiner_weights_learning_rate: Union[float, Callable[[], float]] = 0.01,
  ):
    self.slot_variable_creation_fn = None
    self.combiner = "custom_combiner_" + str(hash(combiner_computation))
    self.combiner_computation = combiner_computation
    self.max_valency = max_valency
    self.num_weights = num_weights
    self.combiner_weights_learning_rate = combiner_weights_learning_rate
    if num_weights > 0 and initializer is None:
      raise ValueError(
          "When `num_weights` is greater than 0, `initializer` must be set.")
    self._slot_names_attr = tuple([self.CUSTOM_COMBINER_SLOT_NAME])
    self._slot_initializers_attr = tuple(
        [initializer] if initializer is not None else ())

  def _slot_names(self) -> List[str]:
    return list(self._slot_names_attr) if self.num_weights > 0 else []

  def _slot_initializers(self) -> List[Any]:
    return list(self._slot_initializers_attr) if self.num_weights > 0 else []

  def __str__(self) -> str:
    return self.combiner

  # As TensorFlow's slot-holding classes compare and hash.
  def __eq__(self, other: Any) -> bool:
    if isinstance(other, self.__class__):
      return all(a == b for a, b in zip(self.__dict__.items(),
                                        other.__dict__.items()))
    return False

  def __hash__(self) -> int:
    return hash(tuple(self.__dict__.items()))

  def _constructor_args(self) -> Dict[str, Any]:
    """The arguments that rebuild it (`tfemb.to_tensorflow`)."""
    initializers = self._slot_initializers_attr
    return dict(combiner_computation=self.combiner_computation,
                max_valency=self.max_valency, num_weights=self.num_weights,
                initializer=initializers[0] if initializers else None,
                combiner_weights_learning_rate=(
                    self.combiner_weights_learning_rate))


@dataclasses.dataclass(frozen=True)
class SparseCoreEmbeddingConfig:
  """`tf.tpu.experimental.embedding.SparseCoreEmbeddingConfig` of
  TensorFlow 2.21."""

  disable_table_stacking: bool = False
  max_ids_per_chip_per_sample: int = 64
  max_ids_per_table: Optional[Dict[str, int]] = None
  max_unique_ids_per_table: Optional[Dict[str, int]] = None
  allow_id_dropping: bool = False
  initialize_tables_on_host: bool = True
  enable_fast_table_initialization: bool = False

  def _constructor_args(self) -> Dict[str, Any]:
    """The arguments that rebuild it (`tfemb.to_tensorflow`)."""
    return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


CLASSES = (CustomOptimizer, CustomCombiner, SparseCoreEmbeddingConfig)
