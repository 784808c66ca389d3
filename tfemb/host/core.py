"""What both engine generations share around a step: how their tables are
built once, and the non-finite policy's controls.

`tfemb.host.engine.HostEmbedding` (the first generation's protocol) and
`tfemb.sparsecore.engine.TPUEmbeddingV2` (the SparseCore's) create their
tables with `build_once` and expose the policy of `step.NonFinitePolicy`
through `NonFiniteControls`, so a table built inside `strategy.run` and a
step's non-finite handling behave the same in both.
"""

from typing import Callable

import tensorflow as tf

from tfemb.host import step


def build_once(create: Callable[..., None]) -> None:
  """Runs `create` (which makes the tables and slots) once.

  Inside `strategy.run` of a strategy other than the default one (a model
  built in its first step: tf_keras' `fit` of an unbuilt subclassed model,
  Keras 3's `fit` of a distributed dataset, a first lookup in a custom
  step), every replica waits while `create` runs once, across replicas
  (`merge_call`); anywhere else it runs outside any `tf.function` being
  traced (`tf.init_scope`). `create` takes and ignores the strategy that
  `merge_call` passes.
  """
  create = tf.autograph.experimental.do_not_convert(create)
  if tf.distribute.has_strategy() and not (
      tf.distribute.in_cross_replica_context()):
    tf.distribute.get_replica_context().merge_call(create)
  else:
    with tf.init_scope():
      create()


class NonFiniteControls:
  """`non_finite_gradients` and `skipped_steps` of an engine whose steps
  take the policy `self._policy` (a `step.NonFinitePolicy`)."""

  _policy: step.NonFinitePolicy

  @property
  def non_finite_gradients(self) -> str:
    """What a step with a NaN or Inf embedding gradient, or whose update
    would make a table or slot NaN or Inf, does.

    "raise" (default): an InvalidArgumentError naming the table, and no
    table or slot changes. "skip": no table or slot changes, the step is
    counted in `skipped_steps`, and training goes on.
    """
    return self._policy.mode

  @non_finite_gradients.setter
  def non_finite_gradients(self, policy: str):
    self._policy.mode = policy

  @property
  def skipped_steps(self) -> int:
    """Steps skipped for non-finite gradients or updates (policy
    "skip")."""
    return self._policy.skipped_steps
