"""experiments/layout.py's step: the order of lookups and updates
(`--order`), and the same numbers in both orders."""

import numpy as np
import pytest
import tensorflow as tf

import tfemb
from experiments import layout

VOCAB, DIM, LR = 20, 4, 0.5
IDS = [[[1, 3, 1, 7], [0, 0, 5, 2], [9, 4, 4, 4]],
       [[3, 3, 8, 1], [2, 6, 6, 0], [4, 19, 4, 11]]]  # [batch][table][id]


def _build(order):
  rng = np.random.default_rng(0)
  tables = [tfemb.TableConfig(VOCAB, DIM, name=f"t{t}",
                              optimizer=tfemb.SGD(learning_rate=LR))
            for t in range(3)]
  variables = [{"parameters": tf.Variable(tf.zeros([VOCAB, DIM]))}
               for _ in tables]
  grads = rng.standard_normal((2, 3, 4, DIM)).astype(np.float32)
  batches = [([tf.constant(ids, tf.int64) for ids in IDS[b]],
              [tf.constant(g) for g in grads[b]]) for b in range(2)]
  steps = layout.make_steps(tables, variables, batches, ["a", "b", "c"],
                            tf.constant(LR), 0, order)
  return steps, variables, grads


def _ancestors(op):
  """Names of the ops `op` waits for, through inputs and control inputs."""
  seen, todo = set(), [op]
  while todo:
    current = todo.pop()
    for parent in [t.op for t in current.inputs] + current.control_inputs:
      if parent.name not in seen:
        seen.add(parent.name)
        todo.append(parent)
  return seen


@pytest.mark.parametrize("order", layout.ORDERS)
def test_both_orders_train_the_same_numbers(order):
  steps, variables, grads = _build(order)
  steps()
  for t, table_variables in enumerate(variables):
    expected = np.zeros((VOCAB, DIM), np.float32)  # SGD from zeros
    for b in range(2):
      np.add.at(expected, IDS[b][t], -LR * grads[b, t])
    np.testing.assert_allclose(table_variables["parameters"].numpy(),
                               expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("order", layout.ORDERS)
def test_when_a_tables_update_comes(order):
  steps, _, _ = _build(order)
  graph = steps.get_concrete_function().graph
  lookups = [op for op in graph.get_operations()
             if op.type == "TfembDedupGather"]
  updates = [op for op in graph.get_operations()
             if op.type == "TfembApplyRows"]
  assert len(lookups) == len(updates) == 6
  first_update = _ancestors(updates[0])  # batch 0, table 0
  waits_for = [lookup.name in first_update for lookup in lookups[:3]]
  if order == "lookups-first":
    assert waits_for == [True, True, True]
  else:
    assert waits_for == [True, False, False]
