"""The TPU protocol's hand-offs between `enqueue`, `dequeue` and
`apply_gradients`: a batch waits per graph (one per `tf.function` trace, or
the eager context) and per replica of this worker, as on a TPU, where each
replica dequeues what was enqueued for it."""

import weakref
from typing import Any, Callable, Dict, Tuple

import tensorflow as tf


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
