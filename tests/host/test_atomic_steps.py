"""A training step is all or nothing (docs/numerics.md, "Errors",
"Learning rates" and "Non-finite gradients"): whatever fails in a step (a
learning rate, a learning-rate callable, a lookup with validation off, an
update that would overflow a table or a slot), every table and slot stays
bit-identical, on every host path, eagerly and in `tf.function`; and the
next good step gives the numbers of an independent numpy reference.
"""

import threading

import numpy as np
import pytest
import tensorflow as tf

import reference
import tfemb

E = tf.errors.InvalidArgumentError
INIT_A = np.linspace(-1.0, 1.0, 6 * 3).reshape(6, 3)
INIT_B = np.linspace(0.5, -0.5, 5 * 2).reshape(5, 2)
IDS_A = [1, 2, 2]
IDS_B = [0, 3]


def make_embedding(opt_b, opt_a=None, validate=True):
  a = tfemb.TableConfig(6, 3, name="a",
                        initializer=tf.constant_initializer(INIT_A),
                        optimizer=opt_a or tfemb.Adagrad(0.1))
  b = tfemb.TableConfig(5, 2, name="b",
                        initializer=tf.constant_initializer(INIT_B),
                        optimizer=opt_b)
  return tfemb.TPUEmbedding(
      {"fa": tfemb.FeatureConfig(a),
       "fb": tfemb.FeatureConfig(b, validate_weights_and_indices=validate)},
      None)


def features(ids_b=None):
  return {"fa": tf.constant(IDS_A, tf.int64),
          "fb": tf.constant(IDS_B if ids_b is None else ids_b, tf.int64)}


def gradients(scale_a=1.0, scale_b=1.0):
  grad_a = np.arange(1, 10, dtype=np.float32).reshape(3, 3) / 10
  grad_b = np.array([[0.5, -1.0], [2.0, 0.25]], np.float32)
  return {"fa": tf.constant(grad_a * scale_a),
          "fb": tf.constant(grad_b * scale_b)}


def make_step(embedding, mode):
  def step(feats, grads):
    embedding.enqueue(feats, training=True)
    embedding.dequeue()
    embedding.apply_gradients(grads)
  return tf.function(step) if mode == "function" else step


def snapshot(embedding):
  return {(table.name, name): v.numpy().copy()
          for table, variables in embedding.variables.items()
          for name, v in variables.items()}


def assert_unchanged(embedding, before):
  after = snapshot(embedding)
  assert after.keys() == before.keys()
  for key, value in before.items():
    np.testing.assert_array_equal(after[key], value, err_msg=str(key))


def trained(embedding, step, before_fn):
  """A good step first (so the slots hold values of their own)."""
  embedding.build()
  step(features(), gradients())
  before_fn()
  return snapshot(embedding)


@pytest.fixture(params=["eager", "function"])
def mode(request):
  return request.param


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_learning_rate_changes_nothing(engine_path, mode, bad):
  rate = tf.Variable(0.2)
  embedding = make_embedding(tfemb.SGD(lambda: rate.read_value()))
  step = make_step(embedding, mode)
  before = trained(embedding, step, lambda: rate.assign(bad))
  with pytest.raises(E, match=r"Table \W*b\W*: the learning rate must be a "
                     "finite float scalar"):
    step(features(), gradients())
  assert_unchanged(embedding, before)


def test_ftrl_needs_a_positive_learning_rate(engine_path, mode):
  rate = tf.Variable(0.2)
  embedding = make_embedding(tfemb.FTRL(lambda: rate.read_value()))
  step = make_step(embedding, mode)
  before = trained(embedding, step, lambda: rate.assign(0.0))
  with pytest.raises(E, match=r"Table \W*b\W*: the learning rate must be a "
                     "finite and > 0 float scalar"):
    step(features(), gradients())
  assert_unchanged(embedding, before)


def test_non_scalar_learning_rate_is_refused_naming_the_table(
    engine_path, mode):
  embedding = make_embedding(tfemb.SGD(lambda: tf.constant([0.1, 0.2])))
  step = make_step(embedding, mode)
  embedding.build()
  before = snapshot(embedding)
  with pytest.raises(ValueError, match=r"Table \W*b\W*: .* scalar, got shape"):
    step(features(), gradients())
  assert_unchanged(embedding, before)


def test_learning_rate_callable_raising_changes_nothing(engine_path, mode):
  calls = []

  def rate():
    calls.append(1)
    if len(calls) > 1:  # the first step traces or runs once
      raise RuntimeError("schedule broke")
    return 0.2

  embedding = make_embedding(tfemb.SGD(rate))
  step = make_step(embedding, mode)
  before = trained(embedding, step, lambda: None)
  if mode == "function":  # the callable ran at tracing: a new trace
    step = make_step(embedding, mode)
  with pytest.raises(RuntimeError, match="schedule broke"):
    step(features(), gradients())
  assert_unchanged(embedding, before)


def test_failing_lookup_without_validation_changes_nothing(engine_path,
                                                           mode):
  embedding = make_embedding(tfemb.Adagrad(0.3), validate=False)
  step = make_step(embedding, mode)
  before = trained(embedding, step, lambda: None)
  with pytest.raises(E):  # id 7 is beyond table b's 5 rows
    step(features(ids_b=[0, 7]), gradients())
  assert_unchanged(embedding, before)


# --- non-finite updates -------------------------------------------------------

# (optimizer of b, gradient scale of b): finite gradients whose update
# overflows b's parameters or one of its slots.
OVERFLOWS = {
    "sgd-parameters": (lambda: tfemb.SGD(1e10), 1e30),
    "adagrad-accumulators": (lambda: tfemb.Adagrad(0.1), 1e20),
    "adam-velocities": (lambda: tfemb.Adam(0.1), 1e30),
    "ftrl-accumulators": (lambda: tfemb.FTRL(0.1), 1e20),
}


@pytest.mark.parametrize("case", sorted(OVERFLOWS))
def test_overflowing_update_raises_and_changes_nothing(engine_path, mode,
                                                       case):
  make_opt, scale = OVERFLOWS[case]
  embedding = make_embedding(make_opt())
  step = make_step(embedding, mode)
  before = trained(embedding, step, lambda: None)
  with pytest.raises(E, match=r"Table \W*b\W*: the update would make a row "
                     "of the table or of a slot non-finite"):
    step(features(), gradients(scale_b=scale))
  assert_unchanged(embedding, before)


@pytest.mark.parametrize("case", sorted(OVERFLOWS))
def test_overflowing_update_is_skipped(engine_path, mode, case):
  make_opt, scale = OVERFLOWS[case]
  embedding = make_embedding(make_opt())
  embedding.non_finite_gradients = "skip"
  step = make_step(embedding, mode)
  before = trained(embedding, step, lambda: None)
  step(features(), gradients(scale_b=scale))
  assert embedding.skipped_steps == 1
  assert_unchanged(embedding, before)


def assert_good_steps(embedding, steps):
  """Adagrad 0.1 on a, 0.2 on b: the tables after `steps` good steps
  equal the numpy reference's."""
  ref_a = reference.Table(INIT_A, "adagrad", {})
  ref_b = reference.Table(INIT_B, "adagrad", {})
  grads = {k: v.numpy().astype(np.float64) for k, v in gradients().items()}
  for _ in range(steps):
    ref_a.apply(reference.row_gradients(zip(IDS_A, grads["fa"])), 0.1)
    ref_b.apply(reference.row_gradients(zip(IDS_B, grads["fb"])), 0.2)
  variables = embedding.variables
  for name, ref in (("a", ref_a), ("b", ref_b)):
    np.testing.assert_allclose(variables[name]["parameters"].numpy(), ref.w,
                               rtol=1e-5, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(variables[name]["accumulators"].numpy(),
                               ref.slots["accumulators"], rtol=1e-5,
                               atol=1e-6, err_msg=name)


def test_steps_after_refused_ones_match_the_reference(engine_path, mode):
  """Adagrad on both tables: a good step, a step refused for b's overflow
  (nothing written, a's update included), a good step."""
  embedding = make_embedding(tfemb.Adagrad(0.2), tfemb.Adagrad(0.1))
  step = make_step(embedding, mode)
  step(features(), gradients())
  with pytest.raises(E, match=r"Table \W*b\W*: the update"):
    step(features(), gradients(scale_b=1e20))
  step(features(), gradients())
  assert_good_steps(embedding, 2)


def test_a_refused_gradient_does_not_use_up_its_batch(engine_path):
  """Eagerly (in a tf.function a failing step fails the whole call): a
  batch whose NaN gradient was refused, as one whose gradient's shape was,
  takes a corrected gradient, once."""
  embedding = make_embedding(tfemb.Adagrad(0.2), tfemb.Adagrad(0.1))
  embedding.enqueue(features(), training=True)
  embedding.dequeue()
  with pytest.raises(E, match=r"Table \W*b\W*: non-finite"):
    embedding.apply_gradients(gradients(scale_b=np.nan))
  with pytest.raises(ValueError, match="Found gradient of shape"):
    embedding.apply_gradients({"fa": gradients()["fa"],
                               "fb": tf.zeros([3, 2])})
  embedding.apply_gradients(gradients())
  with pytest.raises(RuntimeError, match="once per enqueue"):
    embedding.apply_gradients(gradients())
  assert_good_steps(embedding, 1)


def test_mirrored_step_with_an_overflowing_update_changes_nothing(
    engine_path):
  """2 replicas: each sees the global gradient, so both refuse the step."""
  tf.distribute.MirroredStrategy._collective_key_base = 9000  # pylint: disable=protected-access
  strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  with strategy.scope():
    embedding = make_embedding(tfemb.Adagrad(0.3))

  @tf.function
  def step(scale_b):
    def replica_step():
      embedding.enqueue(features(), training=True)
      embedding.dequeue()
      grads = gradients()
      grads["fb"] = grads["fb"] * scale_b
      embedding.apply_gradients(grads)

    strategy.run(replica_step)

  step(tf.constant(1.0))
  before = snapshot(embedding)
  with pytest.raises(E, match=r"Table \W*b\W*: the update would make a row"):
    step(tf.constant(1e20))
  assert_unchanged(embedding, before)


def test_an_error_kept_by_the_caller_does_not_keep_the_lock(engine_path):
  """Eagerly: the next step runs while the refused step's error (and its
  traceback) is still held."""
  embedding = make_embedding(tfemb.Adagrad(0.2))
  step = make_step(embedding, "eager")
  step(features(), gradients())
  with pytest.raises(E) as kept:
    step(features(), gradients(scale_b=1e20))
  done = []
  thread = threading.Thread(
      target=lambda: done.append(step(features(), gradients())), daemon=True)
  thread.start()
  thread.join(60)
  assert done, f"the step after {kept.type.__name__} did not finish"


@pytest.mark.parametrize("rate", [np.nan, np.inf])
def test_constant_non_finite_learning_rate_is_refused(engine_path, mode,
                                                      rate):
  embedding = make_embedding(tfemb.SGD(rate))
  step = make_step(embedding, mode)
  embedding.build()
  before = snapshot(embedding)
  with pytest.raises(ValueError, match=r"Table \W*b\W*: the learning rate must "
                     "be a finite float scalar, got"):
    step(features(), gradients())
  assert_unchanged(embedding, before)
