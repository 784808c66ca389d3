"""Several training steps match the numpy reference of docs/numerics.md.

One scenario: two tables, five features of every input kind (dense, sparse
weighted, ragged weighted, ragged sequence, sparse rank 3), a table shared by
three features, duplicate ids within and across features, empty examples, and
rows that no batch touches. Run for every optimizer and option (the cases
of tests/helpers.py's `OPTIMIZERS`), eagerly and inside `tf.function`;
tables and slots are compared after every step.
"""

import numpy as np
import pytest
import tensorflow as tf

import helpers
import reference
import tfemb

BATCH, STEPS = 4, 3
SHARED_VOCAB, OTHER_VOCAB = 24, 15
TOUCHABLE = 14  # ids drawn below this; rows from here on are never touched


def make_batches(seed):
  rng = np.random.default_rng(seed)
  batches = []
  for _ in range(STEPS):
    sparse_rows = helpers.random_rows(rng, BATCH, TOUCHABLE, 4)
    ragged_rows = helpers.random_rows(rng, BATCH, TOUCHABLE, 3)
    rank3_rows = helpers.random_rows(rng, BATCH * 2, TOUCHABLE, 3)
    batches.append(dict(
        dense=list(rng.integers(0, TOUCHABLE, size=BATCH)),
        sparse=sparse_rows,
        sparse_w=helpers.random_weights(rng, sparse_rows),
        seq=helpers.random_rows(rng, BATCH, TOUCHABLE, 5),
        ragged=ragged_rows,
        ragged_w=helpers.random_weights(rng, ragged_rows),
        rank3=rank3_rows,
    ))
  return batches


def to_inputs(b):
  rank3 = helpers.sparse(b["rank3"], width=3)
  rank3 = tf.SparseTensor(
      tf.stack([rank3.indices[:, 0] // 2, rank3.indices[:, 0] % 2,
                rank3.indices[:, 1]], axis=1), rank3.values, [BATCH, 2, 3])
  features = {
      "dense": tf.constant(b["dense"], tf.int64),
      "sparse": helpers.sparse(b["sparse"]),
      "seq": helpers.ragged(b["seq"], tf.int32),
      "ragged": helpers.ragged(b["ragged"]),
      "rank3": rank3,
  }
  weights = {
      "dense": None,
      "sparse": helpers.sparse(b["sparse"], b["sparse_w"], tf.float32),
      "seq": None,
      "ragged": helpers.ragged(b["ragged_w"], tf.float32),
      "rank3": None,
  }
  return features, weights


def make_targets(seed):
  rng = np.random.default_rng(seed + 1)
  return {
      "dense": rng.normal(size=(BATCH, 4)),
      "sparse": rng.normal(size=(BATCH, 4)),
      "seq": rng.normal(size=(BATCH, 3, 4)),
      "ragged": rng.normal(size=(BATCH, 3)),
      "rank3": rng.normal(size=(BATCH, 2, 3)),
  }


class Scenario:
  """The tfemb object and its numpy twin."""

  def __init__(self, opt_name, kwargs, combiner, lr=None):
    rng = np.random.default_rng(7)
    self.init_shared = rng.normal(size=(SHARED_VOCAB, 4)) * 0.3
    self.init_other = rng.normal(size=(OTHER_VOCAB, 3)) * 0.3
    opt_kwargs = dict(kwargs)
    if lr is not None:
      opt_kwargs["learning_rate"] = lr
    self.shared = tfemb.TableConfig(
        SHARED_VOCAB, 4, initializer=tf.constant_initializer(self.init_shared),
        combiner=combiner, name="shared")
    # This table brings its own optimizer: the global one must not apply.
    self.other = tfemb.TableConfig(
        OTHER_VOCAB, 3, initializer=tf.constant_initializer(self.init_other),
        combiner="sqrtn", optimizer=tfemb.Adagrad(0.15), name="other")
    self.features = {
        "dense": tfemb.FeatureConfig(self.shared),
        "sparse": tfemb.FeatureConfig(self.shared),
        "seq": tfemb.FeatureConfig(self.shared, max_sequence_length=3),
        "ragged": tfemb.FeatureConfig(self.other),
        "rank3": tfemb.FeatureConfig(self.other),
    }
    self.embedding = tfemb.TPUEmbedding(
        self.features, getattr(tfemb, opt_name)(**opt_kwargs))
    self.ref_shared = reference.Table(self.init_shared,
                                      helpers.KIND[opt_name],
                                      helpers.reference_params(kwargs))
    self.ref_other = reference.Table(self.init_other, "adagrad", {})
    self.combiner = combiner

  def reference_step(self, b, targets, lr):
    c = self.combiner
    shared, other = self.ref_shared.w, self.ref_other.w
    act = {
        "dense": shared[np.asarray(b["dense"])],
        "sparse": reference.combine(shared, b["sparse"], c, b["sparse_w"]),
        "seq": reference.sequence(shared, b["seq"], 3),
        "ragged": reference.combine(other, b["ragged"], "sqrtn",
                                    b["ragged_w"]),
        "rank3": reference.combine(other, b["rank3"], "sqrtn").reshape(
            BATCH, 2, 3),
    }
    grad = {k: act[k] - targets[k] for k in act}
    shared_pairs = (
        reference.contributions([[i] for i in b["dense"]], c, grad["dense"])
        + reference.contributions(b["sparse"], c, grad["sparse"],
                                  b["sparse_w"])
        + reference.contributions(b["seq"], c, grad["seq"], length=3))
    other_pairs = (
        reference.contributions(b["ragged"], "sqrtn", grad["ragged"],
                                b["ragged_w"])
        + reference.contributions(b["rank3"], "sqrtn",
                                  grad["rank3"].reshape(BATCH * 2, 3)))
    self.ref_shared.apply(reference.row_gradients(shared_pairs), lr)
    self.ref_other.apply(reference.row_gradients(other_pairs), 0.15)
    return act

  def check(self):
    variables = self.embedding.variables
    for config, ref in ((self.shared, self.ref_shared),
                        (self.other, self.ref_other)):
      got = variables[config]
      np.testing.assert_allclose(got["parameters"].numpy(), ref.w,
                                 rtol=1e-5, atol=1e-6, err_msg=config.name)
      assert set(got) == set(ref.slots) | {"parameters"}
      for name, value in ref.slots.items():
        np.testing.assert_allclose(got[name].numpy(), value, rtol=1e-5,
                                   atol=1e-6,
                                   err_msg=f"{config.name}/{name}")


def train_step_fn(embedding, targets):
  def step(features, weights):
    embedding.enqueue(features, weights, training=True)
    with tf.GradientTape() as tape:
      activations = embedding.dequeue()
      tape.watch(activations)
      loss = tf.add_n([
          0.5 * tf.reduce_sum((activations[k] - targets[k]) ** 2)
          for k in activations
      ])
    embedding.apply_gradients(tape.gradient(loss, activations))
    return activations
  return step


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("case", list(helpers.OPTIMIZERS))
def test_steps_match_reference(case, mode, engine_path):
  opt_name, kwargs = helpers.OPTIMIZERS[case]
  combiner = ["mean", "sum", "sqrtn"][
      list(helpers.OPTIMIZERS).index(case) % 3]
  s = Scenario(opt_name, kwargs, combiner)
  targets = {k: tf.constant(v, tf.float32) for k, v in make_targets(0).items()}
  step = train_step_fn(s.embedding, targets)
  if mode == "function":
    step = tf.function(step)
  for b in make_batches(0):
    features, weights = to_inputs(b)
    got = step(features, weights)
    expected = s.reference_step(b, make_targets(0), kwargs["learning_rate"])
    for k in expected:
      np.testing.assert_allclose(got[k].numpy(), expected[k], rtol=1e-5,
                                 atol=1e-6, err_msg=k)
    s.check()


@pytest.mark.parametrize("combiner", ["mean", "sum", "sqrtn"])
def test_every_combiner(combiner, engine_path):
  s = Scenario("Adagrad", dict(learning_rate=0.2), combiner)
  targets = {k: tf.constant(v, tf.float32) for k, v in make_targets(3).items()}
  step = tf.function(train_step_fn(s.embedding, targets))
  for b in make_batches(3):
    step(*to_inputs(b))
    s.reference_step(b, make_targets(3), 0.2)
    s.check()


@pytest.mark.parametrize("case", list(helpers.OPTIMIZERS))
def test_untouched_rows_stay_bit_identical(case, engine_path):
  opt_name, kwargs = helpers.OPTIMIZERS[case]
  s = Scenario(opt_name, kwargs, "mean")
  before = {n: v.numpy().copy()
            for n, v in s.embedding.variables[s.shared].items()}
  targets = {k: tf.constant(v, tf.float32) for k, v in make_targets(1).items()}
  step = tf.function(train_step_fn(s.embedding, targets))
  for b in make_batches(1):
    step(*to_inputs(b))
  after = s.embedding.variables[s.shared]
  for name, value in before.items():
    # (Non-lazy Adam too: a row no batch ever touched keeps m = v = 0, so
    # its zero-gradient updates leave it exactly as it was.)
    np.testing.assert_array_equal(after[name].numpy()[TOUCHABLE:],
                                  value[TOUCHABLE:], err_msg=name)
    assert not np.array_equal(after[name].numpy()[:TOUCHABLE],
                              value[:TOUCHABLE]), name


def test_dynamic_learning_rate_is_read_every_step(engine_path):
  lr = tf.Variable(0.3)
  s = Scenario("Adam", dict(learning_rate=None), "mean",
               lr=lambda: lr * 1.0)
  targets = {k: tf.constant(v, tf.float32) for k, v in make_targets(2).items()}
  step = tf.function(train_step_fn(s.embedding, targets))
  for value, b in zip([0.3, 0.05, 0.6], make_batches(2)):
    lr.assign(value)
    step(*to_inputs(b))
    s.reference_step(b, make_targets(2), value)
    s.check()


def test_none_gradient_counts_as_zero_gradient(engine_path):
  # As on the TPU: the rows of a feature with no gradient are still touched,
  # so Adam's moments decay there.
  s = Scenario("Adam", dict(learning_rate=0.1), "mean")
  b = make_batches(4)[0]
  features, weights = to_inputs(b)
  targets = {k: v.astype(np.float32) for k, v in make_targets(4).items()}
  s.embedding.enqueue(features, weights, training=True)
  activations = s.embedding.dequeue()
  grads = {k: activations[k] - targets[k] for k in activations}
  grads = {k: (None if k in ("sparse", "rank3") else v)
           for k, v in grads.items()}
  s.embedding.apply_gradients(grads)
  # The reference: zero gradient for those two features.
  zero_targets = make_targets(4)
  act = {
      "sparse": reference.combine(s.ref_shared.w, b["sparse"], "mean",
                                  b["sparse_w"]),
      "rank3": reference.combine(s.ref_other.w, b["rank3"], "sqrtn").reshape(
          BATCH, 2, 3),
  }
  zero_targets.update(act)  # act - target == 0 for them
  s.reference_step(b, zero_targets, 0.1)
  s.check()
