"""`EngineAdapter`: all the Keras layer asks of an engine, on every path."""

import abc
from typing import Dict, List

import tensorflow as tf


def slots_in_order(slots: Dict[str, tf.Variable]) -> List[tf.Variable]:
  """One table's variables: parameters first, then the slots by name."""
  return [slots["parameters"]] + [
      slots[n] for n in sorted(slots) if n != "parameters"]


class EngineAdapter(abc.ABC):
  """All the layer asks of an engine, on every path.

  Attributes:
    engine: the object the layer saves as `_tpu_embedding` (the same
      checkpoint attribute on every path).
    embedding_feature: the TPU's (as resolved) or, off TPU, the argument.
    trains_in_backward: True if the embedding optimizer updates the tables
      when a gradient reaches the layer's gradient trap; False where the
      model's Keras optimizer trains them (`trainable_tables()`).
    serving_fallback: True where inputs the TPU refuses but TensorFlow's
      serving class takes follow that class (`tfemb.inputs.serving_only`),
      as in tfrs' layer off the TPU.

  The host settings (`non_finite_gradients`, `skipped_steps`,
  `dropped_ids`) are the host engine's; here, what a TPU reports.
  """

  trains_in_backward = True
  serving_fallback = False

  def __init__(self, config, embedding_feature, engine):
    self.embedding_feature = embedding_feature
    self.engine = engine
    self._config = config  # the layer's `tfemb.resolution.Resolved`
    self._feature_config = config.structure

  @abc.abstractmethod
  def build(self, input_shape, batch_size):
    """Creates the tables."""

  @abc.abstractmethod
  def lookup(self, features, weights, dummy, training):
    """The activations, with the training path through `dummy`, the trap
    weight (`tfemb.layers.gradient_trap`)."""

  @abc.abstractmethod
  def serving_tables(self):
    """The tables by the layer's `TableConfig`s, for
    `serving_embedding_lookup`."""

  def embedding_tables(self):
    """The tables by the user's `TableConfig`s."""
    tables = self.serving_tables()
    return {user: tables[ours] for user, ours in self._config.user_pairs()}

  @abc.abstractmethod
  def embedding_variables(self):
    """Tables and slots by the user's `TableConfig`s."""

  def saved_variables(self):
    """Every table and slot, in the order of Keras 3 saving."""
    return [v for slots in self.embedding_variables().values()
            for v in slots_in_order(slots)]

  def trainable_tables(self):
    """The tables the model's Keras optimizer trains: none where the
    embedding optimizer does (`trains_in_backward`)."""
    return []

  def dropped_ids(self) -> Dict[str, int]:
    """Ids dropped so far under a `SparseCoreEmbeddingConfig` with
    `allow_id_dropping`, per stacked table, where the host follows the
    SparseCore; empty elsewhere (a TPU counts none for the host)."""
    return {}

  @property
  def non_finite_gradients(self) -> str:
    """The host engine's policy for non-finite gradients; a TPU applies
    what it gets ("raise" is what it reports)."""
    return "raise"

  @non_finite_gradients.setter
  def non_finite_gradients(self, policy: str):
    del policy
    raise ValueError("non_finite_gradients is a host (CPU/GPU) setting; "
                     "TensorFlow's TPU engines have none.")

  def skipped_steps(self) -> int:
    """Steps the host engine skipped for non-finite gradients."""
    return 0

  def pull(self):
    """Before the variables' values are read: nothing where the variables
    hold them."""

  def push(self):
    """After the variables' values are written: nothing where the variables
    hold them."""
