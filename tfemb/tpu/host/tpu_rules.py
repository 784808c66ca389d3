"""What a TPU refuses and the host engines, by themselves, would take:
refused under a host TPUStrategy as TensorFlow's engines refuse it on a
TPU, with TensorFlow's words (docs/tpu.md, "What the host TPU refuses as
a TPU does"). A program that passes on the host TPU then passes these
checks on a TPU too.

For `TPUEmbedding` (embedding hardware V1), as TensorFlow 2.21's
`tpu_embedding_v2.py` checks an `enqueue`:

* inside `strategy.run`, the enqueue must be traced in the replica
  function's own graph, not in a `tf.function` or control flow inside it
  (`_raise_error_for_incorrect_control_flow_context`);
* its inputs must not be a batch a distributed dataset fetched to the
  TPU's devices, which a dataset does unless its `InputOptions` say
  `experimental_fetch_to_device=False` (`_raise_error_for_inputs_not_on_cpu`):
  the replicas' devices stand for the TPU's, so a batch `next(iterator)`
  placed on them is refused where TensorFlow's check sees a device
  (eagerly, and the outputs of an iterator a `tf.function` captured; not
  those of an iterator it takes as its argument, nor the conditional's an
  iterator of partial batches returns, which name none in TensorFlow's own
  iterator too);
* inside `strategy.run`, its inputs must be the replica function's
  arguments, not computed from them (`_raise_error_for_non_direct_inputs`).

And its `build` needs every output shape, and configures the TPU's one
embedding engine (`tfemb.tpu.host.system.configure_embedding_engine`).
"""

import weakref
from typing import Any, Sequence

import tensorflow as tf
from tensorflow.python.util import nest  # pylint: disable=g-direct-tensorflow-import

from tfemb import shapes
from tfemb.tpu.host import strategy as host_strategy
from tfemb.tpu.host import system


def applies_to(strategy: Any) -> bool:
  """Whether an engine created under `strategy` runs on a host TPU."""
  return host_strategy.is_host_tpu_strategy(strategy)


def check_build(strategy: Any, paths: Sequence[str],
                output_shapes: Sequence[Any]) -> None:
  """Before a `TPUEmbedding` under `strategy` builds its tables (its
  features `paths` and their `output_shapes`): the TPU's embedding engine
  free, every output shape known, then the engine configured."""
  if applies_to(strategy):
    system.check_embedding_engine_free()
    shapes.check_fully_defined(paths, output_shapes)
    system.configure_embedding_engine()


# The tensors `next(iterator)` of a distributed dataset fetched to the
# replicas' devices, by id() (tensors are not hashable).
_fetched_to_device = weakref.WeakValueDictionary()


def fetches_to_device(options: Any) -> bool:
  """Whether a distributed dataset made with `options` (InputOptions or
  None) places its batches on the replicas' devices."""
  return options is None or options.experimental_fetch_to_device


def record_fetched_to_device(values: Any) -> None:
  """`values`, a distributed iterator's `next`, are on the TPU's devices."""
  for tensor in nest.flatten(values, expand_composites=True):
    if isinstance(tensor, tf.Tensor):
      _fetched_to_device[id(tensor)] = tensor


def check_enqueue(strategy: Any, features: Any, paths: Sequence[str]) -> None:
  """Before a `TPUEmbedding` under `strategy` enqueues `features` (of its
  features `paths`)."""
  if not applies_to(strategy):
    return
  call = host_strategy.replica_call()
  if call is not None:
    _check_control_flow(call)
  _check_on_host(features, paths)
  if call is not None:
    _check_direct(call, features)


def _check_control_flow(call: host_strategy.ReplicaCall) -> None:
  graph = tf.compat.v1.get_default_graph()
  if graph is not call.graph:
    raise RuntimeError(
        "Current graph {} does not match graph which contains "
        "TPUReplicateContext {}. This is most likely due to the fact that "
        "enqueueing embedding data is called inside control flow or a "
        "tf.function inside `strategy.run`. This is not supported because "
        "outside compilation fails to extract the enqueue ops as the head of "
        "a computation.".format(graph, call.graph))


def _check_on_host(features: Any, paths: Sequence[str]) -> None:
  for path, feature in zip(paths, nest.flatten(features)):
    for tensor in nest.flatten(feature, expand_composites=True):
      if (_fetched_to_device.get(id(tensor)) is tensor and tensor.device):
        raise ValueError(
            "Received input tensor {} which is on a TPU input device {}. "
            "Input tensors for TPU embeddings must be placed on the CPU. "
            "Please ensure that your dataset is prefetching tensors to the "
            "host by setting the 'experimental_fetch_to_device' option of "
            "the dataset distribution function. See the documentation of the "
            "enqueue method for an example.".format(path, tensor.device))


def _check_direct(call: host_strategy.ReplicaCall, features: Any) -> None:
  for path, tensor in nest.flatten_with_joined_string_paths(
      features, expand_composites=True):
    if not isinstance(tensor, tf.Tensor) or id(tensor) in call.inputs or (
        tensor.op.type == "Placeholder"):
      continue
    raise ValueError(
        "Received input tensor {} which is the output of op {} (type {}) "
        "which does not have the `_tpu_input_identity` attr. Please "
        "ensure that the inputs to this layer are taken directly from "
        "the arguments of the function called by "
        "strategy.run. Two possible causes are: dynamic batch size "
        "support or you are using a keras layer and are not passing "
        "tensors which match the dtype of the `tf.keras.Input`s."
        "If you are triggering dynamic batch size support, you can "
        "disable it by passing tf.distribute.RunOptions("
        "experimental_enable_dynamic_batch_size=False) to the options "
        "argument of strategy.run().".format(path, tensor.op.name,
                                             tensor.op.type))
