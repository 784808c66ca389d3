"""`tfemb.TPUEmbeddingV2`'s steps and restores are all or nothing
(docs/sparsecore.md, "Errors"): whatever fails in a step (an assert or a
hyperparameter inside a `CustomOptimizer`'s computation, a learning rate, a
`CustomCombiner`'s weights), every table, slot and combiner weight stays
bit-identical, eagerly and in `tf.function`; a refused checkpoint changes
nothing and leaves the object usable. A good step gives the numbers of a
few lines of numpy that follow docs/sparsecore.md.

Four tables, each stacked alone: "a" (Adagrad, the host's usual path), "b"
(a CustomOptimizer like Adagrad: a slot, a callable learning rate and a
callable hyperparameter), "c" (SGD, a CustomCombiner with two weights) and
"d" (a CustomOptimizer like SGD that asserts its gradients are small).
"""

import threading

import numpy as np
import pytest
import tensorflow as tf

import helpers
import reference
import tfemb
from tfemb.sparsecore import table_stacking

pytestmark = pytest.mark.requires_tensorflow("2.17")

E = tf.errors.InvalidArgumentError
BATCH, VOCAB, DIM = 3, 8, 4
LR_A, LR_C, LR_D = 0.1, 0.5, 0.2
INIT = {n: np.linspace(-1.0, 1.0, VOCAB * DIM).reshape(VOCAB, DIM) * k
        for n, k in (("a", 1.0), ("b", -0.5), ("c", 0.25), ("d", 2.0))}
IDS = {"a": [1, 2, 2], "b": [0, 3, 0], "d": [4, 5, 4]}
IDS_C = [[1, 4, 7], [4], [6, 1]]  # max_valency 2: id 7 is not looked up
COEF = np.arange(BATCH * DIM, dtype=np.float32).reshape(BATCH, DIM) / 10 - 0.5


class Knobs:
  """What the tests turn to make a step fail, and the calls per step."""

  def __init__(self):
    self.lr_b = tf.Variable(0.3)
    self.scale = tf.Variable(2.0)
    self.lr_c = tf.Variable(0.1)  # the combiner weights'
    self.limit = tf.Variable(100.0)  # d's largest gradient
    self.python_error = False
    self.calls = {"lr_b": 0, "scale": 0, "lr_c": 0}

  def learning_rate_b(self):
    self.calls["lr_b"] += 1
    return self.lr_b.read_value()

  def scale_b(self):
    self.calls["scale"] += 1
    if self.python_error:
      raise RuntimeError("the hyperparameter broke")
    tf.debugging.assert_positive(self.scale, message="scale must be > 0")
    return self.scale.read_value()

  def learning_rate_c(self):
    self.calls["lr_c"] += 1
    return self.lr_c.read_value()


def make_checked_sgd(knobs):
  def checked_sgd(gradient, embedding_table, slot_variables, learning_rate,
                  hyperparameters):
    del slot_variables, hyperparameters
    tf.debugging.assert_less(tf.reduce_max(tf.abs(gradient)), knobs.limit,
                             message="gradient too large")
    return embedding_table - learning_rate * gradient
  return checked_sgd


def weighted_combiner(valency, vectors, weights):
  mask = tf.cast(tf.range(vectors.shape[0]) < valency, tf.float32)
  return tf.reduce_sum((mask * weights)[:, None] * vectors, axis=0)


def make_embedding(knobs, lr_c=None):
  """`lr_c`: the combiner weights' learning rate, if not `knobs`'."""
  init = lambda n: tf.constant_initializer(INIT[n])
  b = tfemb.CustomOptimizer(
      helpers.adagrad_like, learning_rate=knobs.learning_rate_b,
      slot_names=["acc"],
      slot_initializers=[tf.constant_initializer(0.5)],
      hyperparameters=[knobs.scale_b])
  combiner = tfemb.CustomCombiner(
      weighted_combiner, max_valency=2, num_weights=2,
      initializer=tf.constant_initializer([1.0, 0.5]),
      combiner_weights_learning_rate=lr_c or knobs.learning_rate_c)
  tables = {
      "a": tfemb.TableConfig(VOCAB, DIM, name="a", initializer=init("a"),
                             optimizer=tfemb.Adagrad(LR_A)),
      "b": tfemb.TableConfig(VOCAB, DIM, name="b", initializer=init("b"),
                             optimizer=b),
      "c": tfemb.TableConfig(VOCAB, DIM, name="c", initializer=init("c"),
                             optimizer=tfemb.SGD(LR_C), combiner=combiner),
      "d": tfemb.TableConfig(VOCAB, DIM, name="d", initializer=init("d"),
                             optimizer=tfemb.CustomOptimizer(
                                 make_checked_sgd(knobs), learning_rate=LR_D)),
  }
  return tfemb.TPUEmbeddingV2(
      {f"f{n}": tfemb.FeatureConfig(t, output_shape=[BATCH])
       for n, t in tables.items()})


def features():
  out = {f"f{n}": tf.constant(ids, tf.int64) for n, ids in IDS.items()}
  out["fc"] = tf.ragged.constant(IDS_C, dtype=tf.int64)
  return out


def gradients(scale_c=1.0, scale_d=1.0):
  return {"fa": tf.constant(COEF), "fb": tf.constant(COEF * 2),
          "fc": tf.constant(COEF * 3 * scale_c),
          "fd": tf.constant(COEF * scale_d)}


def make_step(embedding, mode):
  def step(feats, grads):
    _, preserved = embedding(feats)
    embedding.apply_gradients(grads, preserved)
  return tf.function(step) if mode == "function" else step


def combiner_weights(embedding):
  return embedding._combiners.weights["c"]  # pylint: disable=protected-access


def snapshot(embedding):
  """Every stacked variable (padding included) and combiner weights."""
  out = {(t, n): v.numpy().copy() for t, variables in
         embedding.variables.items() for n, v in variables.items()}
  out.update({("combiner", t): v.numpy().copy() for t, v in
              embedding._combiners.weights.items()})  # pylint: disable=protected-access
  return out


def assert_unchanged(embedding, before):
  after = snapshot(embedding)
  assert after.keys() == before.keys()
  for key, value in before.items():
    np.testing.assert_array_equal(after[key], value, err_msg=str(key))


def unstacked(embedding):
  """`{table: {"parameters": .., slot: ..}}` as numpy, and the combiner's
  weights under "combiner"."""
  stacking = embedding._stacking  # pylint: disable=protected-access
  out = {}
  for name, table in stacking.tables.items():
    rows = table_stacking.stacked_rows_numpy(stacking, name, np.arange(VOCAB))
    out[name] = {
        n: v.numpy()[rows, :DIM].astype(np.float64)
        for n, v in embedding.variables[table.stacked_table_name].items()}
  out["combiner"] = combiner_weights(embedding).numpy().astype(np.float64)
  return out


def numpy_step(state, knobs):
  """One step of docs/sparsecore.md's formulas on `state` (`unstacked`)."""
  coef = {n: COEF.astype(np.float64) * k for n, k in
          (("a", 1), ("b", 2), ("c", 3), ("d", 1))}

  def updated(table, kind, slots, pairs, lr):
    """`state[table]` after reference.Table's update; `slots` maps the
    reference's slot names to the table's."""
    oracle = reference.Table(state[table]["parameters"], kind, {})
    oracle.slots = {ref: state[table][ours].copy()
                    for ref, ours in slots.items()}
    oracle.apply(reference.row_gradients(pairs), lr)
    out = {k: v.copy() for k, v in state[table].items()}
    out["parameters"] = oracle.w
    out.update({ours: oracle.slots[ref] for ref, ours in slots.items()})
    return out

  new = {"a": updated("a", "adagrad", {"accumulators": "accumulators"},
                      zip(IDS["a"], coef["a"]), LR_A)}
  # adagrad_like: Adagrad at the learning rate times the scale.
  scale, lr_b = float(knobs.scale.numpy()), float(knobs.lr_b.numpy())
  new["b"] = updated("b", "adagrad", {"accumulators": "acc"},
                     zip(IDS["b"], coef["b"]), scale * lr_b)
  cw = state["combiner"]  # the combiner
  pairs, weight_grad = reference.positional_gradients(
      state["c"]["parameters"], IDS_C, cw, 2, coef["c"])
  new["c"] = updated("c", "sgd", {}, pairs, LR_C)
  # The combiner's weights: SGD (docs/sparsecore.md, `CustomCombiner`).
  new["combiner"], _ = reference.rule("sgd", {}, cw, weight_grad, {},
                                      float(knobs.lr_c.numpy()))
  new["d"] = updated("d", "sgd", {}, zip(IDS["d"], coef["d"]), LR_D)
  return new


def assert_numbers(embedding, want):
  got = unstacked(embedding)
  np.testing.assert_allclose(got["combiner"], want["combiner"], rtol=1e-5,
                             atol=1e-6)
  for table in "abcd":
    for name, value in want[table].items():
      np.testing.assert_allclose(got[table][name], value, rtol=1e-5,
                                 atol=1e-6, err_msg=f"{table}/{name}")


@pytest.fixture(params=["eager", "function"])
def mode(request):
  return request.param


def trained(mode, non_finite="raise"):
  """An object after one good step (so the slots and the combiner's
  weights hold values of their own), its knobs and its step."""
  knobs = Knobs()
  embedding = make_embedding(knobs)
  embedding.non_finite_gradients = non_finite  # before the step is traced
  step = make_step(embedding, mode)
  step(features(), gradients())
  return embedding, knobs, step


# --- a good step -------------------------------------------------------------


def test_good_steps_match_numpy(engine_path, mode):
  knobs = Knobs()
  embedding = make_embedding(knobs)
  step = make_step(embedding, mode)
  embedding.build()
  want = unstacked(embedding)
  for k in range(2):
    knobs.lr_b.assign(0.3 / (k + 1))
    knobs.scale.assign(2.0 + k)
    knobs.lr_c.assign(0.1 * (k + 1))
    want = numpy_step(want, knobs)
    step(features(), gradients())
    assert_numbers(embedding, want)


def test_callables_are_called_once_per_step(mode):
  knobs = Knobs()
  embedding = make_embedding(knobs)
  embedding.build()  # else the first trace creates variables: traced twice
  step = make_step(embedding, mode)
  for _ in range(3):
    step(features(), gradients())
  calls = 3 if mode == "eager" else 1  # a tf.function calls them as traced
  assert knobs.calls == {"lr_b": calls, "scale": calls, "lr_c": calls}


# --- failing steps -----------------------------------------------------------


def test_an_assert_failing_in_a_custom_computation_changes_nothing(
    engine_path, mode):
  embedding, knobs, step = trained(mode)
  before = snapshot(embedding)
  with pytest.raises(E, match="gradient too large"):
    step(features(), gradients(scale_d=1000.0))
  assert_unchanged(embedding, before)
  want = numpy_step(unstacked(embedding), knobs)  # and the next step trains
  step(features(), gradients())
  assert_numbers(embedding, want)


# What fails: (turning a knob, the step's gradients, the error), each in a
# step already traced.
FAILING = {
    "a hyperparameter's assert": (
        lambda k: k.scale.assign(-1.0), {}, "scale must be > 0"),
    "a non-finite custom computation": (
        lambda k: k.scale.assign(np.inf), {},
        r"Table \W*b\W*: the update would make a row"),
    "a custom learning rate": (
        lambda k: k.lr_b.assign(np.nan), {},
        r"Table \W*b\W*: the learning rate must be a finite float scalar"),
    "the combiner weights' learning rate": (
        lambda k: k.lr_c.assign(np.nan), {},
        r"Table \W*c\W*: the combiner_weights_learning_rate of its "
        "CustomCombiner must be a finite float scalar"),
    "non-finite combiner weights": (
        lambda k: k.lr_c.assign(3e38), {"scale_c": 1e3},
        r"Table \W*c\W*: the update would make a row"),
}


@pytest.mark.parametrize("case", sorted(FAILING))
def test_a_failing_step_changes_nothing(mode, case):
  turn, grads, message = FAILING[case]
  embedding, knobs, step = trained(mode)
  before = snapshot(embedding)
  turn(knobs)
  with pytest.raises(E, match=message):
    step(features(), gradients(**grads))
  assert_unchanged(embedding, before)


def test_a_hyperparameter_raising_changes_nothing(mode):
  embedding, knobs, step = trained(mode)
  before = snapshot(embedding)
  knobs.python_error = True
  step = make_step(embedding, mode)  # a new trace calls the callables
  with pytest.raises(RuntimeError, match="the hyperparameter broke"):
    step(features(), gradients())
  assert_unchanged(embedding, before)


@pytest.mark.parametrize("case", ["a non-finite custom computation",
                                  "non-finite combiner weights"])
def test_a_non_finite_update_is_skipped_whole(mode, case):
  turn, grads, _ = FAILING[case]
  embedding, knobs, step = trained(mode, non_finite="skip")
  before = snapshot(embedding)
  turn(knobs)
  step(features(), gradients(**grads))
  assert_unchanged(embedding, before)
  assert embedding.skipped_steps == 1


def test_a_python_number_combiner_learning_rate_is_checked_first():
  embedding = make_embedding(Knobs(), lr_c=float("inf"))
  embedding.build()
  before = snapshot(embedding)
  with pytest.raises(ValueError,
                     match="Table .c.: the combiner_weights_learning_rate"):
    make_step(embedding, "eager")(features(), gradients())
  assert_unchanged(embedding, before)


# A CustomOptimizer's results one row, one column or one slot row short: in
# a tf.function of the right static shape ([None, dim]), wrong when it runs.
SHORT = {
    "rows": lambda w, acc: (w[1:], acc),
    "columns": lambda w, acc: (
        tf.reshape(w[:, 1:], tf.stack([tf.shape(w)[0], -1])), acc),
    "slot rows": lambda w, acc: (w, acc[1:]),
}


@pytest.mark.parametrize("case", sorted(SHORT))
def test_a_custom_result_of_another_shape_changes_nothing(engine_path, mode,
                                                          case):
  """Table "a" on the host's path, "b" a CustomOptimizer: the step is
  refused naming b before any table is written."""
  def computation(gradient, embedding_table, slot_variables, learning_rate,
                  hyperparameters):
    del hyperparameters
    return SHORT[case](embedding_table - learning_rate * gradient,
                       slot_variables[0] + gradient)

  init = lambda n: tf.constant_initializer(INIT[n])
  tables = {
      "a": tfemb.TableConfig(VOCAB, DIM, name="a", initializer=init("a"),
                             optimizer=tfemb.SGD(LR_A)),
      "b": tfemb.TableConfig(VOCAB, DIM, name="b", initializer=init("b"),
                             optimizer=tfemb.CustomOptimizer(
                                 computation, learning_rate=0.1,
                                 slot_names=["acc"],
                                 slot_initializers=[tf.zeros_initializer()])),
  }
  embedding = tfemb.TPUEmbeddingV2(
      {f"f{n}": tfemb.FeatureConfig(t, output_shape=[BATCH])
       for n, t in tables.items()})
  embedding.build()
  before = snapshot(embedding)
  step = make_step(embedding, mode)
  with pytest.raises((ValueError, E),
                     match=r"Table \W*b\W*: custom_computation returned"):
    step({n: features()[n] for n in ("fa", "fb")},
         {n: gradients()[n] for n in ("fa", "fb")})
  assert_unchanged(embedding, before)


def test_a_refused_gradient_does_not_use_up_its_batch():
  """Eagerly: a batch whose NaN gradient was refused, as one whose
  gradient's shape was, takes a corrected gradient, once."""
  knobs = Knobs()
  embedding = make_embedding(knobs)
  embedding.build()
  want = numpy_step(unstacked(embedding), knobs)
  _, preserved = embedding(features())
  with pytest.raises(E, match=r"Table \W*a\W*: non-finite"):
    embedding.apply_gradients({**gradients(), "fa": tf.fill([BATCH, DIM],
                                                            np.nan)},
                              preserved)
  with pytest.raises(ValueError, match="Found gradient of shape"):
    embedding.apply_gradients({**gradients(), "fa": tf.zeros([2, DIM])},
                              preserved)
  embedding.apply_gradients(gradients(), preserved)
  with pytest.raises(RuntimeError, match="already called for this batch"):
    embedding.apply_gradients(gradients(), preserved)
  assert_numbers(embedding, want)


@pytest.mark.parametrize("config", ["same", "another"])
def test_a_batch_of_another_object_is_refused(mode, config):
  """`b.apply_gradients(grads, preserved of a)` (and `b.dequeue` of a's
  enqueue) is refused naming both objects' tables; neither changes."""
  knobs = Knobs()
  a = make_embedding(knobs)
  b = make_embedding(knobs) if config == "same" else stacked_ab()
  a.build()
  b.build()
  before_a, before_b = snapshot(a), snapshot(b)

  def step():
    _, preserved = a(features())
    b.apply_gradients(gradients(), preserved)

  def dequeue():
    b.dequeue(a.enqueue(features()))

  for call in (step, dequeue):
    with pytest.raises(ValueError, match=(
        r"come from another TPUEmbeddingV2 object \(tables \['a', 'b', "
        r"'c', 'd'\]\); expected .*this object's.* \(tables \[")):
      (tf.function(call) if mode == "function" else call)()
  assert_unchanged(a, before_a)
  assert_unchanged(b, before_b)


# --- concurrent steps --------------------------------------------------------


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_threads_lose_no_custom_update(mode):
  """Each step reads the rows it updates under the step's lock."""
  threads, steps, lr = 4, 10, 0.01
  table = tfemb.TableConfig(
      VOCAB, DIM, name="t", initializer=tf.constant_initializer(INIT["a"]),
      optimizer=tfemb.CustomOptimizer(
          lambda g, w, s, lr, h: w - lr * g, learning_rate=lr))
  embedding = tfemb.TPUEmbeddingV2(
      {"f": tfemb.FeatureConfig(table, output_shape=[BATCH])})
  step = make_step(embedding, mode)
  ids = tf.constant(IDS["a"], tf.int64)
  grads = tf.constant(COEF)
  step({"f": ids}, {"f": grads})  # traced once, before the threads

  def train():
    for _ in range(steps):
      step({"f": ids}, {"f": grads})

  workers = [threading.Thread(target=train) for _ in range(threads)]
  for worker in workers:
    worker.start()
  for worker in workers:
    worker.join()
  # SGD is linear: n steps of one gradient are one step at n times the rate.
  oracle = reference.Table(INIT["a"], "sgd", {})
  oracle.apply(reference.row_gradients(zip(IDS["a"], COEF)),
               (threads * steps + 1) * lr)
  want = oracle.w
  stacking = embedding._stacking  # pylint: disable=protected-access
  rows = table_stacking.stacked_rows_numpy(stacking, "t", np.arange(VOCAB))
  got = embedding.variables["t"]["parameters"].numpy()[rows, :DIM]
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# --- restores ----------------------------------------------------------------


def stacked_ab(dim_b=4, optimizer=None, extra_table=False, weights=0):
  """Tables "a" and "b", stacked as "a_b" (and "c" with them); with
  `weights`, "a" has a CustomCombiner of that many weights."""
  combiner = "mean" if not weights else tfemb.CustomCombiner(
      weighted_combiner, max_valency=2, num_weights=weights,
      initializer=tf.constant_initializer(0.5))
  tables = [tfemb.TableConfig(6, 4, name="a", combiner=combiner,
                              initializer=tf.constant_initializer(1.0)),
            tfemb.TableConfig(5, dim_b, name="b",
                              initializer=tf.constant_initializer(2.0))]
  if extra_table:
    tables.append(tfemb.TableConfig(4, 4, name="c"))
  return tfemb.TPUEmbeddingV2(
      {f"f{t.name}": tfemb.FeatureConfig(t, output_shape=[2])
       for t in tables}, optimizer or tfemb.Adagrad(0.1))


def unstacked_ab(dim_b=4, optimizer_b=None, extra_table=False):
  """Tables "a" and "b" of the first generation (a checkpoint of unstacked
  tables)."""
  tables = [tfemb.TableConfig(6, 4, name="a"),
            tfemb.TableConfig(5, dim_b, name="b", optimizer=optimizer_b)]
  if extra_table:
    tables.append(tfemb.TableConfig(4, 4, name="c"))
  return tfemb.TPUEmbedding({f"f{t.name}": tfemb.FeatureConfig(t)
                             for t in tables}, tfemb.Adagrad(0.1))


def fill(embedding, value):
  """Every variable set to `value` (+ 0.5 for the slots)."""
  embedding.build()
  for variables in embedding.variables.values():
    for name, v in variables.items():
      v.assign(tf.fill(v.shape, value + (0.0 if name == "parameters" else
                                         0.5)))


def saved(embedding, tmp_path, name, value=7.0):
  fill(embedding, value)
  return tf.train.Checkpoint(embedding=embedding).save(str(tmp_path / name))


def assert_all(embedding, value):
  for table, variables in embedding.variables.items():
    for name, v in variables.items():
      expected = value + (0.0 if name == "parameters" else 0.5)
      np.testing.assert_array_equal(v.numpy(), np.full(v.shape, expected,
                                                       np.float32),
                                    err_msg=f"{table}/{name}")


# The checkpoint refused, before or after build, naming what differs: (its
# object, the error).
REFUSED = {
    "another optimizer": (lambda: stacked_ab(optimizer=tfemb.Adam(0.1)),
                          "slot 'momenta' of table 'a_b'"),
    "b has another dim": (lambda: stacked_ab(dim_b=2),
                          r"Table 'b': expected shape \[5, 4\]"),
    "another table": (lambda: stacked_ab(extra_table=True),
                      "embedding table 'c'"),
    "b has another dim, unstacked": (
        lambda: unstacked_ab(dim_b=2), r"Table 'b': expected shape \[5, 4\]"),
    "b has no slot, unstacked": (
        lambda: unstacked_ab(optimizer_b=tfemb.SGD(0.1)),
        "'a_b/accumulators' needs 'b/accumulators'"),
    "another table, unstacked": (lambda: unstacked_ab(extra_table=True),
                                 "embedding table 'c'"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_refused_restore_changes_nothing(tmp_path, case):
  source, message = REFUSED[case]
  bad = saved(source(), tmp_path, "bad")
  good = saved(stacked_ab(), tmp_path, "good", 3.0)
  embedding = stacked_ab()
  fill(embedding, 5.0)
  with pytest.raises(ValueError, match=message):
    tf.train.Checkpoint(embedding=embedding).restore(bad)
  assert_all(embedding, 5.0)
  tf.train.Checkpoint(embedding=embedding).restore(good).assert_consumed()
  assert_all(embedding, 3.0)


@pytest.mark.parametrize("case", sorted(REFUSED))
@pytest.mark.parametrize("then", ["build", "restore"])
def test_a_refused_restore_before_build_leaves_the_object_usable(
    tmp_path, case, then):
  source, message = REFUSED[case]
  bad = saved(source(), tmp_path, "bad")
  good = saved(stacked_ab(), tmp_path, "good", 3.0)
  embedding = stacked_ab()
  with pytest.raises(ValueError, match=message):
    tf.train.Checkpoint(embedding=embedding).restore(bad)
  if then == "build":  # nothing of the refused checkpoint is waiting
    embedding.build()
    fresh = stacked_ab()
    fresh.build()
    assert_unchanged(embedding, snapshot(fresh))
    tf.train.Checkpoint(embedding=embedding).restore(good).assert_consumed()
  else:  # a good restore, deferred until the tables are created
    tf.train.Checkpoint(embedding=embedding).restore(good)
    embedding.build()
  assert_all(embedding, 3.0)


@pytest.mark.parametrize("built", [True, False])
def test_other_combiner_weights_are_refused_whole(tmp_path, built):
  bad = tf.train.Checkpoint(embedding=stacked_ab(weights=3))
  bad.embedding.build()
  bad = bad.save(str(tmp_path / "bad"))
  embedding = stacked_ab(weights=2)
  if built:
    embedding.build()
    before = snapshot(embedding)
  with pytest.raises(ValueError,
                     match="Table 'a': expected 2 CustomCombiner weights"):
    tf.train.Checkpoint(embedding=embedding).restore(bad)
  embedding.build()
  if built:
    assert_unchanged(embedding, before)
  weights = embedding._combiners.weights["a"]  # pylint: disable=protected-access
  np.testing.assert_array_equal(weights.numpy(), [0.5, 0.5])
