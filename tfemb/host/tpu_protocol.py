"""The TPU's `enqueue` / `dequeue` / `apply_gradients` protocol over the
host engine.

`TPUProtocol` is composed over a `tfemb.host.HostEmbedding`: `enqueue`
checks and looks a batch up under the TPU's input rules
(`engine.TPU_PROTOCOL`), `dequeue` returns its activations and
`apply_gradients` its update. A batch waits per graph (one per
`tf.function` trace, or the eager context) and per replica of this worker
(`Queue`), as on a TPU, where each replica dequeues what was enqueued for
it. `tfemb.TPUEmbedding` (`tfemb.mid_level`) is the engine with this
protocol.
"""

import weakref
from typing import Any, Callable, Dict, Optional, Tuple

import tensorflow as tf

from tfemb import replicas
from tfemb.host import engine as engine_lib


def _graph_key():
  return tf.compat.v1.get_default_graph()


class Queue:
  """Enqueued batches, then the backward functions of dequeued ones."""

  def __init__(self):
    self._enqueued = weakref.WeakKeyDictionary()
    self._dequeued = weakref.WeakKeyDictionary()

  def put(self, batches: Dict[int, Tuple[Any, bool]]) -> None:
    """`{replica index: (batch, training)}`; replaces what was waiting."""
    key = _graph_key()
    self._enqueued.setdefault(key, {}).update(batches)
    for index in batches:
      self._dequeued.get(key, {}).pop(index, None)

  def take(self, index: int) -> Tuple[Any, bool]:
    pending = self._enqueued.get(_graph_key(), {})
    if index not in pending:
      raise RuntimeError(
          "dequeue called without a preceding enqueue in this function (or "
          "eagerly): call embedding.enqueue(features) first.")
    return pending.pop(index)

  def hold(self, index: int, backward: Callable[[Any], None]) -> None:
    """Keeps a dequeued training batch's `backward` for apply_gradients."""
    self._dequeued.setdefault(_graph_key(), {})[index] = backward

  def release(self, index: int):
    """The held `backward` of replica `index` (removed), or None."""
    return self._dequeued.get(_graph_key(), {}).pop(index, None)


class TPUProtocol:
  """`enqueue`, `dequeue` and `apply_gradients` on `engine`, a
  `HostEmbedding`; the methods of `tfemb.TPUEmbedding` (documented
  there)."""

  def __init__(self, engine: "engine_lib.HostEmbedding"):
    self._engine = engine
    self._queue = Queue()

  def enqueue(self, features, weights, training: bool,
              device: Optional[str]) -> None:
    engine, strategy = self._engine, self._engine.strategy
    rules = engine_lib.TPU_PROTOCOL
    if device is not None:
      # One replica's batch, given outside strategy.run (e.g. from
      # `experimental_distribute_values_from_function`).
      index = replicas.index_of_device(device, strategy)
      with tf.device(device):
        batches = {index: engine.prepare(features, weights, rules)}
    elif replicas.is_distributed(features):
      # Outside strategy.run, with a distributed batch: one per replica.
      local = replicas.split((features, weights), strategy)
      devices = replicas.local_devices(strategy)
      batches = {}
      for i, (device, (f, w)) in enumerate(zip(devices, local)):
        with tf.device(device):
          batches[i] = engine.prepare(f, w, rules)
    else:
      batches = {replicas.local_index(): engine.prepare(features, weights,
                                                        rules)}
    self._queue.put({i: (batch, bool(training))
                     for i, batch in batches.items()})

  def dequeue(self):
    self._check_built("dequeue")
    index = replicas.local_index()
    batch, training = self._queue.take(index)
    activations, backward = self._engine.activate(*batch)
    if training:
      self._queue.hold(index, backward)
    return activations

  def apply_gradients(self, gradients) -> None:
    self._check_built("apply_gradients")
    index = replicas.local_index()
    backward = self._queue.release(index)
    if backward is None:
      # TF's errors for bad gradients first.
      self._engine.check_gradients(gradients)
      raise RuntimeError(
          "apply_gradients needs a batch enqueued with training=True and "
          "dequeued in this function (or eagerly), and can be called once "
          "per enqueue.")
    try:
      backward(gradients)
    except Exception:
      self._queue.hold(index, backward)
      raise

  def _check_built(self, method: str) -> None:
    if not self._engine.built:  # TensorFlow's words
      raise RuntimeError(f"{method} called on unbuilt TPUEmbedding object. "
                         "Please either call enqueue first or manually call "
                         "the build method.")
