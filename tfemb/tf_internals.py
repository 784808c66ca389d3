"""The private names of TensorFlow and Keras that tfemb relies on, in one
place: where a release renames one, this module is what changes (the
versions tested are those of tfemb/tf_versions.py).

* object tracking: a variable created as a child of a trackable, with
  TensorFlow's restore-on-create (`add_variable_with_custom_getter`,
  `mark_restored`, `preload_simple_restoration`, `deferred_dependencies`);
* distribution: a variable made past a strategy's creators, a strategy's
  variable partitioner, a mirrored variable's
  local copy;
* tensor conversion of tfemb's variable-like classes (TensorFlow's
  `_dense_var_to_tensor` protocol, its operator overloads, `_unique_id`);
* TensorFlow's own TPU engines, which the Keras layer drives on a TPU
  (whether built, their variables, their copies to and from the TPU), and
  what tfemb's engines, their subclasses, keep out of their way
  (`not_inherited`);
* Keras: an optimizer's learning rate as given, a layer's name.
"""

import contextlib
from typing import Any, Dict

from tensorflow.core.framework import attr_value_pb2
from tensorflow.python.ops import resource_variable_ops  # pylint: disable=g-direct-tensorflow-import

# pylint: disable=protected-access

# --- object tracking --------------------------------------------------------


def add_variable_with_custom_getter(owner, **kwargs):
  """`owner`'s child variable made by `getter`, restored on creation when
  a restore of it is pending (`Trackable._add_variable_with_custom_getter`)."""
  return owner._add_variable_with_custom_getter(**kwargs)


def mark_restored(variable, restore_uid) -> None:
  """Records that `variable` already holds the value of the restore
  `restore_uid`, so TensorFlow does not restore it again."""
  variable._maybe_initialize_trackable()
  variable._update_uid = restore_uid


def preload_simple_restoration(owner, name: str):
  """The restore-on-create initial value of `owner`'s child `name`, or
  None when no restore of it is pending."""
  return owner._preload_simple_restoration(name=name)


def deferred_dependencies(owner) -> Dict[str, Any]:
  """The restores waiting for `owner`'s children to be created."""
  return owner._deferred_dependencies


# --- distribution -----------------------------------------------------------


@contextlib.contextmanager
def kept_by_grappler(graph):
  """The ops `graph` makes here are ones TensorFlow's graph optimizer
  (Grappler) must keep as written (its `_grappler_do_not_remove`
  attribute): no reordering of sums and products, no `a / sqrt(b)` made
  `a * rsqrt(b)`."""
  keep = {"_grappler_do_not_remove": attr_value_pb2.AttrValue(b=True)}
  with graph._attr_scope(keep):  # pylint: disable=protected-access
    yield


def is_parameter_server_strategy(strategy) -> bool:
  """Whether `strategy` partitions variables over parameter servers
  (ParameterServerStrategy: only it has a variable partitioner)."""
  return hasattr(strategy.extended, "_variable_partitioner")


@contextlib.contextmanager
def variable_partitioner(strategy, partitioner):
  """`strategy` (a ParameterServerStrategy) partitions the variables
  created here with `partitioner`."""
  extended = strategy.extended
  saved = extended._variable_partitioner
  extended._variable_partitioner = partitioner
  try:
    yield
  finally:
    extended._variable_partitioner = saved


def round_robin_position(strategy) -> int:
  """Where a ParameterServerStrategy places its next variable (or shard):
  on parameter server `position % number of servers` (TF 2.21's
  `_variable_count`)."""
  return strategy.extended._variable_count


def set_round_robin_position(strategy, position: int) -> None:
  strategy.extended._variable_count = position


def local_copy(mirrored):
  """A mirrored variable's copy on the current device, else its first."""
  return mirrored._get_on_device_or_primary()


# The host's own CPU, beside the replicas' logical devices.
HOST_CPU = "/job:localhost/replica:0/task:0/device:CPU:0"


def plain_variable(**kwargs):
  """A resource variable made from a variable creator's arguments without
  the creators below (a strategy's among them): one variable where it is
  made. (`tf.Variable` would call the creators again.)"""
  return resource_variable_ops.ResourceVariable(**kwargs)


# --- tensor conversion --------------------------------------------------------


def dense_var_to_tensor(variable, dtype=None, name=None, as_ref=False):
  """TensorFlow's conversion protocol of a variable-like object."""
  return variable._dense_var_to_tensor(dtype, name, as_ref)


def overload_operators(cls) -> None:
  """Gives a variable-like class `tf.Variable`'s operators."""
  cls._OverloadAllOperators()


def unique_id(variable) -> str:
  """The id optimizers key a variable's slots on."""
  return variable._unique_id


# --- TensorFlow's TPU engines ----------------------------------------------


def tpu_engine_built(engine) -> bool:
  return engine._built


def tpu_engine_variables(engine) -> Dict[str, Dict[str, Any]]:
  """`{table name: {"parameters": .., slot: ..}}` of a built engine."""
  return engine._variables


def retrieve_from_tpu(engine) -> None:
  """The TPU's values into the engine's host variables."""
  engine._retrieve_variables()


def load_onto_tpu(engine) -> None:
  """The engine's host variables' values onto the TPU."""
  engine._load_variables()


class not_inherited:  # pylint: disable=invalid-name
  """A class attribute that reads as absent (`hasattr` is False, on the
  class and its instances), hiding the base class's.

  tfemb's engines derive from TensorFlow's, so that code asking
  `isinstance(x, tf.tpu.experimental.embedding.TPUEmbedding)` takes them
  for TensorFlow's; what TensorFlow's code finds by asking for an attribute
  and is the TPU's alone is hidden so. (TensorFlow 2.21's asynchronous
  checkpoint takes any class with `_create_copy_for_async_checkpoint` for
  a TPU's `TPUEmbedding` and copies its tables off the TPU first.)
  """

  def __set_name__(self, owner, name):
    self._name = name

  def __get__(self, instance, owner=None):
    raise AttributeError(self._name)


# --- Keras ------------------------------------------------------------------


def keras_learning_rate(optimizer, legacy: bool):
  """A Keras optimizer's learning rate as it was given (a schedule, a
  callable, or the variable holding a number)."""
  if legacy:
    return optimizer._hyper["learning_rate"]
  return optimizer._learning_rate


def set_layer_name(layer, name: str) -> None:
  """tf_keras' layer name, a read-only property."""
  layer._name = name
