"""Builders shared by the tests: Python lists of ids -> TensorFlow inputs,
and a `CustomOptimizer`'s computation."""

import re

import numpy as np
import tensorflow as tf


def sparse(rows, values=None, dtype=tf.int64, width=None):
  """A rank 2 SparseTensor with example b holding `rows[b]`."""
  values = rows if values is None else values
  indices = [[b, j] for b, r in enumerate(rows) for j in range(len(r))]
  flat = [v for r in values for v in r]
  width = width or max([len(r) for r in rows] + [1])
  return tf.SparseTensor(
      indices=np.asarray(indices, np.int64).reshape(-1, 2),
      values=tf.constant(flat, dtype=dtype, shape=[len(flat)]),
      dense_shape=[len(rows), width])


def ragged(rows, dtype=tf.int64):
  return tf.RaggedTensor.from_row_lengths(
      tf.constant([v for r in rows for v in r], dtype=dtype,
                  shape=[sum(len(r) for r in rows)]),
      [len(r) for r in rows])


def random_rows(rng, batch, vocab, max_len, min_len=0):
  return [
      list(rng.integers(0, vocab, size=rng.integers(min_len, max_len + 1)))
      for _ in range(batch)
  ]


def random_weights(rng, rows):
  return [list(rng.uniform(0.2, 2.0, size=len(r))) for r in rows]


def adagrad_like(gradient, embedding_table, slot_variables, learning_rate,
                 hyperparameters):
  """A `CustomOptimizer`'s computation: Adagrad with its learning rate
  scaled by the one hyperparameter (slot: the accumulator)."""
  (scale,) = hyperparameters
  accumulator = slot_variables[0] + gradient * gradient
  return (embedding_table - scale * learning_rate * gradient /
          tf.sqrt(accumulator), accumulator)


def assert_names(message, feature=None, table=None):
  """An error `message` names `feature` and `table` (None: not asked for),
  with no backslash-escaped quote (TensorFlow's Assert op escapes quotes,
  so tfemb's checks quote names in backticks). tfemb's own messages say
  "Feature `f` (table `t`)" or "Table `t`" (Python's errors may quote with
  '); TensorFlow's messages, which tfemb keeps, name a feature bare."""
  assert not re.search(r"\\['\"]", message), message
  q = "[`']"
  if table is not None:
    name = (rf"Table {q}{re.escape(table)}{q}" if feature is None else
            rf"Feature {q}{re.escape(feature)}{q} \(table "
            rf"{q}{re.escape(table)}{q}\)")
  elif feature is not None:
    name = rf"(?<![\w`']){q}?{re.escape(feature)}{q}?(?![\w`'])"
  else:
    return
  assert re.search(name, message), (name, message)
