"""Configs resolved once, as TensorFlow's `TPUEmbedding.__init__` reads them.

`resolve(feature_config, optimizer)` gives every engine (the host engine,
the Keras layer, the TPU plan and the proto builder) the same view of a
configuration:

* features in `tf.nest` order, with their joined paths;
* tables in order of first use, unnamed ones named `table_<i>`, tables
  without an optimizer given the global one; names must be unique.

TensorFlow writes the names and the global optimizer into the user's
`TableConfig`s. Here they go into copies (`copy.copy`, so a TensorFlow
config stays a TensorFlow config with all its fields): the user's objects
are never changed, and the same `TableConfig` may serve several engines
with different global optimizers.
"""

import copy
from typing import Any, Callable, List, NamedTuple, Optional

import tensorflow as tf
from tensorflow.python.util import nest  # pylint: disable=g-direct-tensorflow-import

from tfemb import optimizers


class Resolved(NamedTuple):
  """A configuration as an engine sees it.

  `features`, `paths` and `table_index` are parallel, in `tf.nest` order;
  `tables` and `user_tables` parallel, in order of first use. `features`
  are copies of the user's whose `table` is the resolved copy.
  """
  structure: Any  # the resolved features, in the user's structure
  paths: List[str]
  features: List[Any]
  table_index: List[int]  # per feature: its table's index
  tables: List[Any]  # resolved copies: named, with an optimizer (or None)
  user_tables: List[Any]  # the user's TableConfigs, as given
  # Per table: the stack whose optimizer (and learning rate) it shares, as
  # the SparseCore stacks tables (`tfemb.sparsecore.trained_config`); None:
  # every table its own.
  stacks: Optional[List[str]] = None
  given: Any = None  # the feature_config as given (TF's `_feature_config`)

  def user_pairs(self) -> List[Any]:
    """`[(user's TableConfig, its resolved copy)]`, in table order."""
    return list(zip(self.user_tables, self.tables))

  def table_of(self, user_table) -> Any:
    """The resolved copy of one of the user's `TableConfig`s."""
    for user, ours in zip(self.user_tables, self.tables):
      if user is user_table:
        return ours
    raise KeyError(user_table)


def _check_feature(path, feature):
  if not hasattr(feature, "table") or not hasattr(feature,
                                                  "max_sequence_length"):
    raise TypeError(f"feature_config[{path!r}] must be a FeatureConfig, got "
                    f"{type(feature).__name__}.")


def resolve(feature_config: Any,
            optimizer: Optional[Any],
            normalize: Optional[Callable[[Any], Any]] = None) -> Resolved:
  """Resolves `feature_config` with `optimizer` as the global optimizer.

  Args:
    feature_config: a nested structure of `FeatureConfig`s (tfemb's or
      TensorFlow's).
    optimizer: the optimizer of tables without their own, or None. A
      `CustomOptimizer` is accepted here (as a table's own too); the
      engines that cannot run it refuse it.
    normalize: turns an optimizer in another form (e.g. a Keras optimizer,
      for the Keras layer) into an embedding optimizer; applied to
      `optimizer` and to every table's own. By default optimizers must
      already be embedding optimizers (tfemb's or TensorFlow's).

  An engine given a `Resolved` (the Keras layer's, which resolves with
  its optimizer translation) takes it as it is: one resolution per layer,
  one `TableConfig` copy per table.

  Raises:
    TypeError: an entry of `feature_config` is not a FeatureConfig.
    ValueError: an unsupported optimizer, or two tables of the same name.
  """
  if isinstance(feature_config, Resolved):
    return feature_config
  flat = nest.flatten_with_joined_string_paths(feature_config)
  for path, feature in flat:
    _check_feature(path, feature)
  if normalize is not None:
    optimizer = normalize(optimizer)
  user_tables: List[Any] = []
  for _, feature in flat:
    if not any(feature.table is t for t in user_tables):
      user_tables.append(feature.table)
  tables, names = [], []
  for i, user_table in enumerate(user_tables):
    table = copy.copy(user_table)
    own = user_table.optimizer
    if normalize is not None and own is not None:
      own = normalize(own)
    table.optimizer = optimizer if own is None else own
    if table.optimizer is not None and not (
        optimizers.is_optimizer(table.optimizer) or
        optimizers.is_custom(table.optimizer)):
      raise ValueError(
          f"{type(table.optimizer)} is an unsupported optimizer class. "
          "Please pass an instance of one of the optimizer classes under "
          "tfemb or tf.tpu.experimental.embedding.")
    if not hasattr(table, "dtype"):  # TensorFlow's before 2.20: float32
      table.dtype = tf.float32
    if table.name is None:
      table.name = f"table_{i}"
    if table.name in names:
      raise ValueError("Tables must have a unique name. "
                       f"Multiple tables with name {table.name} found.")
    names.append(table.name)
    tables.append(table)
  table_index, features = [], []
  for _, feature in flat:
    t = next(i for i, u in enumerate(user_tables) if feature.table is u)
    resolved_feature = copy.copy(feature)
    resolved_feature.table = tables[t]
    table_index.append(t)
    features.append(resolved_feature)
  return Resolved(
      structure=nest.pack_sequence_as(feature_config, features),
      paths=[path for path, _ in flat],
      features=features,
      table_index=table_index,
      tables=tables,
      user_tables=user_tables,
      given=feature_config)


def _learning_rates(tables: List[Any], keep: Callable[[Any], bool]):
  """The learning rates of `tables`' optimizers that `keep` accepts, once
  each, in table order."""
  rates: List[Any] = []
  for table in tables:
    rate = getattr(table.optimizer, "learning_rate", None)
    if keep(rate) and not any(rate is r for r in rates):
      rates.append(rate)
  return rates


def dynamic_learning_rates(tables: List[Any]) -> List[Callable[[], Any]]:
  """The callable learning rates of `tables`' optimizers, once each, in
  table order (TensorFlow numbers its dynamic learning rates so)."""
  return _learning_rates(tables, callable)


def counting_learning_rates(
    tables: List[Any]) -> List[optimizers.CountingLearningRate]:
  """The learning rates of `tables` that count training steps themselves
  (`optimizers.CountingLearningRate`: `advance()` after each update; the
  Keras layer's translated rates), once each."""
  return _learning_rates(
      tables, lambda rate: isinstance(rate, optimizers.CountingLearningRate))
