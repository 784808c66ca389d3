"""The fused kernels' loops compiled for the common row widths.

For 8, 16, 32, 64 and 128 floats per row the kernels run loops compiled for
that width (`WithWidth` in tfemb/kernels/src/row_loops.h); any other
width runs the same loops with the width known at run time, which the
training tests check against the numpy reference at widths 3 and 4. Here,
for every rule: a table of a compiled width W trains as the numpy reference
says, and gives bit for bit the floats of a table of W + 1 (the run-time
loops) whose first W columns start equal and get the same gradients: the
lookups, the parameters and every slot.
"""

import numpy as np
import pytest
import tensorflow as tf

import helpers
import reference
import tfemb

WIDTHS = (8, 16, 32, 64, 128)
CASES = helpers.LAZY_OPTIMIZERS  # the kernels' rules
VOCAB, BATCH, TOUCHED, STEPS = 40, 24, 30, 3


def _tables(width, rng):
  """Per rule, a table of `width` and one of `width` + 1 columns, whose
  first `width` columns start equal."""
  tables = {}
  for case in CASES:
    start = (rng.normal(size=(VOCAB, width + 1)) * 0.3).astype(np.float32)
    for suffix, cols in (("", width), ("_wider", width + 1)):
      tables[case + suffix] = tfemb.TableConfig(
          VOCAB, cols, name=case + suffix,
          optimizer=helpers.optimizer(case),
          initializer=tf.constant_initializer(start[:, :cols]))
  return tables


@pytest.mark.parametrize("width", WIDTHS)
def test_compiled_widths_train_as_the_reference_and_the_general_loop(
    width, table_layout):
  del table_layout  # each layout: slots of their own, or beside the rows
  rng = np.random.default_rng(width)
  tables = _tables(width, rng)
  embedding = tfemb.TPUEmbedding(
      {n: tfemb.FeatureConfig(t, name=n) for n, t in tables.items()}, None)
  references = {
      case: reference.Table(
          embedding.embedding_tables[tables[case]].numpy(),
          *helpers.reference_optimizer(case))
      for case in CASES}

  @tf.function
  def step(ids, grads):
    embedding.enqueue(ids, training=True)
    activations = embedding.dequeue()
    embedding.apply_gradients(grads)
    return activations

  for _ in range(STEPS):
    ids, grads, looked_up = {}, {}, {}
    for case in CASES:
      batch = rng.integers(0, TOUCHED, BATCH)
      g = rng.normal(size=(BATCH, width + 1)).astype(np.float32) * 0.2
      ids[case], ids[case + "_wider"] = batch, batch
      grads[case], grads[case + "_wider"] = g[:, :width], g
      looked_up[case] = references[case].w[batch]
      summed = {}
      for i, row in zip(batch, g[:, :width].astype(np.float64)):
        summed[int(i)] = summed.get(int(i), 0.0) + row
      references[case].apply(summed, references[case].params["learning_rate"])
    got = step({n: tf.constant(v) for n, v in ids.items()},
               {n: tf.constant(v) for n, v in grads.items()})
    for case in CASES:
      np.testing.assert_allclose(got[case].numpy(), looked_up[case],
                                 rtol=1e-5, atol=1e-6, err_msg=case)
      np.testing.assert_array_equal(
          got[case].numpy(), got[case + "_wider"].numpy()[:, :width],
          err_msg=f"{case}: lookup")

  kinds = [op.type for op in step.get_concrete_function(
      {n: tf.TensorSpec([BATCH], tf.int64) for n in tables},
      {n: tf.TensorSpec([BATCH, t.dim], tf.float32)
       for n, t in tables.items()}).graph.get_operations()]
  assert kinds.count("TfembApplyRows") == len(tables), "not the kernels"

  variables = embedding.variables
  for case in CASES:
    narrow = variables[tables[case]]
    wider = variables[tables[case + "_wider"]]
    assert set(narrow) == set(references[case].slots) | {"parameters"}
    for name in narrow:
      np.testing.assert_array_equal(narrow[name].numpy(),
                                    wider[name].numpy()[:, :width],
                                    err_msg=f"{case}/{name}")
    np.testing.assert_allclose(narrow["parameters"].numpy(),
                               references[case].w, rtol=1e-5, atol=1e-6,
                               err_msg=case)
    for name, value in references[case].slots.items():
      np.testing.assert_allclose(narrow[name].numpy(), value, rtol=1e-5,
                                 atol=1e-6, err_msg=f"{case}/{name}")
