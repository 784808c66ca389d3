"""What a host step whose update is not finite does ("raise" or "skip"),
and the lock its update takes (`tfemb.host.update_lock`): the policy
`tfemb.host.step.apply` runs every step's update under."""

from typing import Any, List, Sequence

import tensorflow as tf

from tfemb import validation
from tfemb.host import update_lock
from tfemb.host.paths import ShardUpdate


class NonFinitePolicy:
  """What a step whose update is not finite does, and the lock its update
  takes.

  A step is not finite when an embedding gradient is NaN or Inf, or when
  the update would make a row of a table or of a slot NaN or Inf (e.g. an
  accumulator overflowing). "raise" (default): an InvalidArgumentError
  naming the table, and no table or slot changes. "skip": no table or slot
  changes, the step is counted in `skipped_steps`, and training goes on.
  """

  def __init__(self, strategy):
    self._strategy = strategy
    self._mode = "raise"
    self._skipped = None
    self._lock = update_lock.UpdateLock(strategy)

  @property
  def mode(self) -> str:
    return self._mode

  @mode.setter
  def mode(self, mode: str):
    if mode not in ("raise", "skip"):
      raise ValueError("non_finite_gradients must be 'raise' or 'skip', "
                       f"got {mode!r}.")
    self._mode = mode
    if mode == "skip" and self._skipped is None:
      with tf.init_scope(), self._strategy.scope():
        # Aggregation NONE: every replica counts in its own copy (they all
        # see the same global gradient, so they agree).
        self._skipped = tf.Variable(0, dtype=tf.int64, trainable=False,
                                    name="skipped_steps")

  @property
  def raising(self) -> bool:
    return self._mode == "raise"

  @property
  def skipped_steps(self) -> int:
    return 0 if self._skipped is None else int(self._skipped.numpy())

  def checks(self, finite: Sequence[Any], names: Sequence[str]) -> List[Any]:
    """Under "raise", an error naming the first table whose new rows or
    slots (`finite`, by table) are not all finite."""
    return self._refusals(finite, [
        f"{validation.table(name)}: the update would make a row of the "
        "table or of a slot non-finite (NaN or Inf); no table was updated."
        for name in names])

  def run(self, finite: Sequence[Any], write, raising: bool,
          counted: bool = True) -> tf.Tensor:
    """`write()` if `raising` (the checks refuse a non-finite step), else
    only if every table's gradient and update is finite; else the step is
    skipped, and `counted` in `skipped_steps` under "skip"."""
    if raising:
      return write()

    def skip():
      if not counted or self._skipped is None:
        return tf.constant(False)
      with tf.control_dependencies([self._skipped.assign_add(1)]):
        return tf.constant(False)

    return tf.cond(tf.reduce_all(finite), write, skip)

  def shard_checks(self, parts: Sequence[ShardUpdate],
                   finite: Sequence[Any]) -> List[Any]:
    """Under "raise", an error naming the first shard of a table whose new
    rows or slots (`finite`, by part) are not all finite: that shard was
    not updated, the step's other shards were."""
    return self._refusals(finite, [
        f"{validation.table(part.table)}: the update would make a row of "
        "the table or of a slot non-finite (NaN or Inf) in its shard "
        f"{part.shard} of {part.shards} (on {part.device}); that shard was "
        "not updated, the other shards of the step were." for part in parts])

  def _refusals(self, finite: Sequence[Any],
                messages: Sequence[str]) -> List[Any]:
    """Under "raise", an assertion per `finite` that fails with its
    message."""
    if not self.raising:
      return []
    return [check for ok, message in zip(finite, messages)
            for check in validation.assertion(ok, message)]

  def run_per_server(self, parts: Sequence[ShardUpdate]
                     ) -> List[tf.Tensor]:
    """Each part's update under this object's lock on its parameter server
    (`tfemb.host.update_lock`): whether each was finite, and written. Call
    it inside `update_lock.in_order`."""
    return self._lock.run_per_server([(p.device, p.apply) for p in parts])

  def serialized(self, fn) -> tf.Tensor:
    """`fn()` under this object's lock (`tfemb.host.update_lock`): one
    update at a time reads, computes and writes the rows, whatever the
    threads or workers running steps; `fn` returns a tensor that waits for
    every write, returned here."""
    return self._lock.run(fn)
