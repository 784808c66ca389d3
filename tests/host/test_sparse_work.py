"""A training step works on the touched rows only.

The traced step is inspected: per table one `Unique` and one gather of the
parameters, the slots gathered and scattered row-wise (with TensorFlow's
ops), or one op of each fused kernel (`tfemb.kernels`); no dense read of any
table or slot, and no tensor with a dimension of the vocabulary's size.
"""

import pytest
import tensorflow as tf

import helpers
import reference
import tfemb

VOCAB = 100_003  # a size no batch-derived tensor can have by accident
# One case of each optimizer; SGD's with clipping and weight decay, which
# must touch the rows only too.
CASES = ("sgd_clip_decay",) + helpers.ONE_PER_OPTIMIZER[1:]


def traced_step(opt):
  big = tfemb.TableConfig(VOCAB, 8, name="big")
  small = tfemb.TableConfig(VOCAB + 2, 4, name="small")
  config = {
      "a": tfemb.FeatureConfig(big),
      "b": tfemb.FeatureConfig(big),
      "c": tfemb.FeatureConfig(big, max_sequence_length=3),
      "d": tfemb.FeatureConfig(small),
  }
  embedding = tfemb.TPUEmbedding(config, opt)

  @tf.function
  def step(features):
    embedding.enqueue(features, training=True)
    with tf.GradientTape() as tape:
      act = embedding.dequeue()
      tape.watch(act)
      loss = tf.add_n([tf.reduce_sum(a * a) for a in act.values()])
    embedding.apply_gradients(tape.gradient(loss, act))

  rows = [[1, 2], [3], [], [4, 4, 5]]
  features = {"a": tf.constant([1, 2, 3, 4]), "b": helpers.sparse(rows),
              "c": helpers.ragged(rows), "d": helpers.ragged(rows)}
  step(features)
  return step.get_concrete_function(features).graph


@pytest.mark.parametrize("name", CASES)
def test_step_touches_rows_not_tables(name, engine_path):
  num_slots = len(reference.initial_slots(
      *helpers.reference_optimizer(name), shape=(1, 1)))
  graph = traced_step(helpers.optimizer(name))
  ops = graph.get_operations()
  types = [op.type for op in ops]
  tables = 2
  if engine_path != "tensorflow":
    assert types.count("TfembDedupGather") == tables
    # Both tables' gradient sums and updates in one op (one optimizer): no
    # op of its own for a sum, no lock around the update.
    assert types.count("TfembApplyTables") == 1
    assert "TfembRowGradients" not in types
    assert "MutexLock" not in types
    for op_type in ("Unique", "ResourceGather", "ResourceScatterUpdate"):
      assert op_type not in types, op_type
  else:
    assert types.count("Unique") == tables
    # The lookup's rows, then under the update's lock the rows again and
    # the slots' (docs/numerics.md, "Concurrent steps").
    assert types.count("ResourceGather") == tables * (2 + num_slots)
    assert types.count("ResourceScatterUpdate") == tables * (1 + num_slots)
  assert "ReadVariableOp" not in types
  assert "AssignVariableOp" not in types
  for op in ops:
    for out in op.outputs:
      dims = out.shape.as_list() if out.shape.rank is not None else []
      assert VOCAB not in dims and VOCAB + 2 not in dims, (op.type, op.name)


def test_non_lazy_adam_is_the_one_dense_update(engine_path):
  graph = traced_step(tfemb.Adam(0.1, lazy_adam=False))
  types = [op.type for op in graph.get_operations()]
  assert types.count("AssignVariableOp") == 2 * 3
