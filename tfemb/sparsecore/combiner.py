"""`CustomCombiner` on the host: the user's combiner per example.

For a feature whose table has a `CustomCombiner`, each example keeps its
first `max_valency` ids in input order (the rest are not looked up, so not
touched); their rows form `vectors` of `[max_valency, dim]` (zero beyond the
example's valency), and the activation is `combiner_computation(valency,
vectors[, weights])`, vectorized over the batch (`tf.vectorized_map`). The
gradient flows back through the computation to each kept id's row and,
with `num_weights > 0`, to the combiner's weights, which SGD trains at
`combiner_weights_learning_rate` (the slot `custom_combiner_variables`)
within the step: all or nothing with the tables' updates.
"""

from typing import Any, Callable, List, NamedTuple, Optional

import tensorflow as tf

from tfemb import inputs
from tfemb import optimizers
from tfemb import resolution
from tfemb import update_rules
from tfemb import validation
from tfemb.host import step
from tfemb.host.paths import Pending
from tfemb import sparsecore_configs

SLOT = "custom_combiner_variables"


def is_custom(combiner) -> bool:
  return sparsecore_configs.is_a(combiner, "CustomCombiner")


class Kept(NamedTuple):
  """Which ids of a batch a custom combiner sees."""
  example: tf.Tensor  # int64 [n]: each kept id's example
  position: tf.Tensor  # int64 [n]: its place among the example's ids
  valency: tf.Tensor  # int32 [batch]: min(ids of the example, max_valency)
  batch: int


def _rows_and_positions(x):
  """Each id's example and its place in the example (input order), the
  examples' id counts, the ids, and the number of examples. Dense ids: one
  example per row."""
  if not isinstance(x, (tf.SparseTensor, tf.RaggedTensor)):
    x = tf.convert_to_tensor(x)
    x = tf.RaggedTensor.from_tensor(x[:, None] if x.shape.rank == 1 else x)
  if isinstance(x, tf.SparseTensor):
    example, rows = x.indices[:, 0], tf.cast(x.dense_shape[0], tf.int64)
  else:
    example = tf.cast(x.value_rowids(), tf.int64)
    rows = tf.cast(x.nrows(), tf.int64)
  counts = tf.math.bincount(example, minlength=rows, dtype=tf.int64)
  starts = tf.cumsum(counts, exclusive=True)
  position = tf.range(tf.size(example, out_type=tf.int64)) - tf.gather(
      starts, example)
  static = x.shape[0]
  return example, position, counts, x.values, (
      rows if static is None else static)


def lookup(path, x, w, feature, batch: int):
  """`(Lookup, Kept)`: the kept ids as a lookup of one activation row each
  (the rows themselves), and where they sit."""
  where = validation.feature(path, feature.table.name)
  if w is not None:
    raise ValueError(
        f"{where}: per-id weights are not taken by a CustomCombiner (its "
        "weights are the combiner's own).")
  x = inputs.as_input(x)  # int32 ids (`input_rules.prepare`)
  checks = []
  if isinstance(x, (tf.SparseTensor, tf.RaggedTensor)):  # TF's own rules
    x, checks = inputs.structure_checked(path, x, feature.table.name)
  example, position, counts, ids, examples = _rows_and_positions(x)
  # One activation per example: as many examples as output_shape's size.
  checks = list(checks) + validation.rows(
      path, feature.table.name, examples, batch,
      f"output_shape {feature.output_shape}")
  with tf.control_dependencies(checks):
    example = tf.identity(example)
  combiner = feature.table.combiner
  keep = position < combiner.max_valency
  example, position = example[keep], position[keep]
  ids = tf.cast(ids[keep], tf.int64)
  n = tf.size(ids, out_type=tf.int64)
  valency = tf.cast(tf.minimum(counts, combiner.max_valency), tf.int32)
  as_lookup = inputs.Lookup(ids, tf.range(n), None, n, tf.reshape(n, [1]),
                            tf.TensorShape([None]), tuple(checks))
  return as_lookup, Kept(example, position, valency, batch)


def _vectors(kept: Kept, rows, max_valency, dim):
  index = tf.stack([kept.example, kept.position], axis=1)
  return tf.scatter_nd(index, rows, [kept.batch, max_valency, dim])


def combine(where: str, combiner, kept: Kept, rows, weights: Optional[Any]):
  """The activations `[batch, dim]` of the kept ids' `rows` `[n, dim]`;
  `where` names the feature in the error of a computation that returns
  another shape than `[dim]` per example."""
  dim = rows.shape[-1]
  vectors = _vectors(kept, rows, combiner.max_valency, dim)
  fn = combiner.combiner_computation
  if combiner.num_weights > 0:
    w = tf.convert_to_tensor(weights)
    out = tf.vectorized_map(lambda a: fn(a[0], a[1], w),
                            (kept.valency, vectors))
  else:
    out = tf.vectorized_map(lambda a: fn(a[0], a[1]),
                            (kept.valency, vectors))
  message = (f"{where}: the combiner_computation of its CustomCombiner must "
             f"return one vector of {dim} (the dim of the table) per "
             "example")
  if not out.shape[1:].is_compatible_with([dim]):
    raise ValueError(f"{message}; got shape {out.shape[1:]}.")
  if not out.shape[1:].is_fully_defined():
    with tf.control_dependencies(validation.assertion(
        tf.reduce_all(tf.equal(tf.shape(out)[1:], [dim])), message + ".")):
      out = tf.identity(out)
  return out


def backward(where: str, combiner, kept: Kept, rows, weights, grad):
  """`(row gradients [n, dim], weight gradient or None)` of the activations'
  gradient `grad` `[batch, dim]`."""
  watched = [rows] + ([weights] if combiner.num_weights > 0 else [])
  with tf.GradientTape() as tape:
    for t in watched:
      tape.watch(t)
    value = weights.read_value() if combiner.num_weights > 0 else None
    activations = combine(where, combiner, kept, rows, value)
  grads = tape.gradient(activations, watched, output_gradients=grad)
  row_grads = tf.zeros_like(rows) if grads[0] is None else grads[0]
  if combiner.num_weights > 0:
    return row_grads, (tf.zeros_like(value) if grads[1] is None else
                       tf.convert_to_tensor(grads[1]))
  return row_grads, None


def weights_update(table, weights: tf.Variable, grad) -> step.Update:
  """SGD on the combiner's `weights` with their summed gradient `grad`, as
  an update of the step: its learning rate checked before any write (a
  finite float scalar), the new weights computed under the step's lock
  from their value then, and written only with the rest of the step."""
  lr, checks = update_rules.checked_rate(
      table.combiner.combiner_weights_learning_rate,
      f"{validation.table(table.name)}: the combiner_weights_learning_rate "
      "of its CustomCombiner")

  def prepare():
    new = weights.read_value() - lr * grad
    return Pending(validation.all_finite(new), lambda: weights.assign(new))

  return step.Update(table.name, checks, prepare)


class CustomCombiners:
  """An engine's features whose tables have a `CustomCombiner`: the ids
  each example's combiner sees, its activations, and the gradient of its
  rows and weights.

  `features`: their flat indices; `weights`: each table's combiner weights
  (`<table>/custom_combiner_variables`), by table name, once `create`d.
  """

  def __init__(self, config: resolution.Resolved):
    self._config = config
    self.features = [i for i, f in enumerate(config.features)
                     if is_custom(f.table.combiner)]
    self.weights = {}

  def create(self, track: Callable[[tf.Variable, str], tf.Variable]):
    """Creates the weights of each table whose combiner has some;
    `track(variable, name)` makes the variable the engine's child."""
    for table in self._config.tables:
      combiner = table.combiner
      if is_custom(combiner) and combiner.num_weights > 0:
        initializer = optimizers.slot_initializers(combiner)[0]
        name = f"{table.name}/{SLOT}"
        self.weights[table.name] = track(
            tf.Variable(initializer((combiner.num_weights,), tf.float32),
                        name=name), name)

  def _where(self, i: int) -> str:
    return validation.feature(self._config.paths[i],
                              self._config.features[i].table.name)

  def _weights(self, table) -> Optional[tf.Variable]:
    return self.weights[table.name] if table.combiner.num_weights else None

  def lookup(self, flat, flat_weights, output_shapes):
    """`({feature: Lookup}, {feature: Kept})` of the batch's flat inputs."""
    lookups, kept = {}, {}
    for i in self.features:
      lookups[i], kept[i] = lookup(
          self._config.paths[i], flat[i], flat_weights[i],
          self._config.features[i], output_shapes[i].num_elements())
    return lookups, kept

  def combine(self, flat, kept, output_shapes):
    """`flat` with each custom feature's rows combined per example, and
    those rows, by feature."""
    rows = {}
    for i in self.features:
      rows[i] = flat[i]
      table = self._config.features[i].table
      flat[i] = tf.reshape(
          combine(self._where(i), table.combiner, kept[i], rows[i],
                  self._weights(table)),
          output_shapes[i].concatenate([table.dim]))
    return flat, rows

  def backward(self, flat_grads, kept, rows, output_shapes
              ) -> List[step.Update]:
    """Replaces each custom feature's activation gradient in `flat_grads`
    with its rows'; returns the weights' updates (SGD on the global
    batch's gradient)."""
    updates = []
    for i in self.features:
      table = self._config.features[i].table
      grad = flat_grads[i]
      if grad is None:
        grad = tf.zeros(output_shapes[i].concatenate([table.dim]))
      flat_grads[i], weight_grad = backward(
          self._where(i), table.combiner, kept[i], rows[i],
          self._weights(table), tf.reshape(grad, [-1, table.dim]))
      if weight_grad is not None:
        updates.append((table, weight_grad))
    context = tf.distribute.get_replica_context()
    more = []
    for table, weight_grad in updates:
      # Summed outside the step's lock, which one replica may hold while
      # another waits for it here.
      if context is not None and context.num_replicas_in_sync > 1:
        weight_grad = context.all_reduce("sum", weight_grad)
      more.append(weights_update(table, self.weights[table.name],
                                 weight_grad))
    return more
