"""`tfemb.TPUEmbeddingV0`: a differentiable lookup whose `embedding_tables`
a Keras optimizer trains, as TensorFlow's V0; TensorFlow's own class under
a `TPUStrategy`.

The numbers come from the numpy reference: lookups by `reference.combine`,
and each step `w -= lr * g` with `g` the dense gradient of the looked-up
rows (`reference.contributions`, summed per id).
"""

import numpy as np
import pytest
import tensorflow as tf

import helpers
import reference
import tfemb
from tfemb.tpu import delegate
from tpu_stand_in import EmbeddingFeature
from tpu_stand_in import StandInTPUStrategy
from tpu_stand_in import use_strategy

tf_emb = tf.tpu.experimental.embedding
BATCH, LR, STEPS = 6, 0.3, 3
VOCAB, DIM = {"users": 25, "items": 15}, {"users": 4, "items": 3}


def feature_config(module=tfemb, optimizer=None):
  users = module.TableConfig(VOCAB["users"], DIM["users"], combiner="sum",
                             name="users", optimizer=optimizer)
  items = module.TableConfig(VOCAB["items"], DIM["items"], combiner="sqrtn",
                             name="items")
  return {"user": module.FeatureConfig(users),  # dense ids
          "friends": module.FeatureConfig(users),  # sparse, weighted
          "item": module.FeatureConfig(items)}  # ragged, weighted


def batches(steps=STEPS, seed=0):
  """Per step: features, weights, the activations' upstream gradient, and
  the reference's {table: {id: dense gradient}} and activations."""
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(steps):
    user = [[int(i)] for i in rng.integers(0, VOCAB["users"], size=BATCH)]
    friends = helpers.random_rows(rng, BATCH, VOCAB["users"], 4)
    item = helpers.random_rows(rng, BATCH, VOCAB["items"], 4)
    fw, iw = helpers.random_weights(rng, friends), helpers.random_weights(
        rng, item)
    grads = {"user": rng.normal(size=(BATCH, DIM["users"])),
             "friends": rng.normal(size=(BATCH, DIM["users"])),
             "item": rng.normal(size=(BATCH, DIM["items"]))}
    features = {"user": tf.constant([r[0] for r in user]),
                "friends": helpers.sparse(friends),
                "item": helpers.ragged(item)}
    weights = {"user": None,
               "friends": helpers.sparse(friends, fw, tf.float32),
               "item": helpers.ragged(iw, tf.float32)}

    def reference_step(t, user=user, friends=friends, item=item, fw=fw,
                       iw=iw, grads=grads):
      acts = {"user": reference.combine(t["users"], user, "sum"),
              "friends": reference.combine(t["users"], friends, "sum", fw),
              "item": reference.combine(t["items"], item, "sqrtn", iw)}
      rows = {
          "users": reference.row_gradients(
              reference.contributions(user, "sum", grads["user"]) +
              reference.contributions(friends, "sum", grads["friends"], fw)),
          "items": reference.row_gradients(
              reference.contributions(item, "sqrtn", grads["item"], iw))}
      return acts, rows

    grads = {k: tf.constant(v, tf.float32) for k, v in grads.items()}
    out.append((features, weights, grads, reference_step))
  return out


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_a_keras_optimizer_trains_the_tables_as_numpy_says(mode):
  config = feature_config()
  embedding = tfemb.TPUEmbeddingV0(config, tfemb.SGD(LR))
  optimizer = tf.keras.optimizers.SGD(LR)
  by_name = {t.name: v for t, v in embedding.embedding_tables.items()}
  tables = list(by_name.values())
  expected = {n: reference.Table(v.numpy(), "sgd", {})
              for n, v in by_name.items()}

  def step(features, weights, grads):
    with tf.GradientTape() as tape:
      activations = embedding(features, weights)
      loss = tf.add_n([tf.reduce_sum(activations[k] * grads[k])
                       for k in grads])
    optimizer.apply_gradients(zip(tape.gradient(loss, tables), tables))
    return activations

  if mode == "function":
    step = tf.function(step)
  for features, weights, grads, reference_step in batches():
    acts, rows = reference_step({n: t.w for n, t in expected.items()})
    got = step(features, weights, grads)
    for name, want in acts.items():
      np.testing.assert_allclose(got[name].numpy(), want, rtol=1e-5,
                                 atol=1e-6, err_msg=name)
    for name, per_id in rows.items():
      expected[name].apply(per_id, LR)
  for name, variable in by_name.items():
    np.testing.assert_allclose(variable.numpy(), expected[name].w, rtol=1e-5,
                               atol=1e-6, err_msg=name)
    assert isinstance(variable, tf.Variable) and variable.trainable


def test_slots_exist_and_the_checkpoint_is_tensorflows(tmp_path):
  """The embedding optimizer's slots are created, as TensorFlow's V0 does,
  and the checkpoint restores into TensorFlow's serving class."""
  embedding = tfemb.TPUEmbeddingV0(feature_config(), tfemb.Adagrad(0.1, 0.4))
  tables = {t.name: t for t in embedding.embedding_tables}
  rng = np.random.default_rng(5)
  for variable in embedding.embedding_tables.values():
    variable.assign(rng.uniform(-1, 1, variable.shape))
  slots = embedding.variables[tables["users"]]
  assert sorted(slots) == ["accumulators", "parameters"]
  np.testing.assert_array_equal(slots["accumulators"].numpy(),
                                np.full((VOCAB["users"], DIM["users"]), 0.4, np.float32))
  path = tf.train.Checkpoint(embedding=embedding).save(str(tmp_path / "c"))
  serving = tf_emb.TPUEmbeddingForServing(feature_config(tf_emb),
                                          tf_emb.Adagrad(0.1, 0.4))
  status = tf.train.Checkpoint(embedding=serving).restore(path)
  serving.build()
  status.assert_consumed()
  for table, variable in serving.embedding_tables.items():
    np.testing.assert_array_equal(
        variable.numpy(), embedding.embedding_tables[table.name].numpy())


@pytest.mark.parametrize("hardware", [EmbeddingFeature.V1,
                                      EmbeddingFeature.V2,
                                      EmbeddingFeature.UNSUPPORTED])
def test_under_a_tpu_strategy_it_is_tensorflows_v0(monkeypatch, hardware):
  calls = []

  def recorder(*args):
    calls.append(args)
    return "tensorflow's TPUEmbeddingV0"

  monkeypatch.setitem(delegate.TENSORFLOW_ENGINES, "TPUEmbeddingV0", recorder)
  use_strategy(monkeypatch, StandInTPUStrategy(hardware))
  config, optimizer = feature_config(), tfemb.Adagrad(0.1)
  result = tfemb.TPUEmbeddingV0(config, optimizer=optimizer)
  assert result == "tensorflow's TPUEmbeddingV0" and len(calls) == 1
  handed_config, handed_optimizer = calls[0]
  assert isinstance(handed_optimizer, tf_emb.Adagrad)
  assert handed_optimizer.learning_rate == 0.1
  assert all(isinstance(f, tf_emb.FeatureConfig)
             for f in tf.nest.flatten(handed_config))
  assert handed_config["user"].table is handed_config["friends"].table


def test_tensorflows_v0_accepts_the_hand_over(monkeypatch):
  use_strategy(monkeypatch, StandInTPUStrategy(EmbeddingFeature.V1))
  embedding = tfemb.TPUEmbeddingV0(feature_config(), tfemb.SGD(0.1))
  assert type(embedding) is tf_emb.TPUEmbeddingV0
  assert sorted(t.name for t in embedding._table_config) == [  # pylint: disable=protected-access
      "items", "users"]


def test_off_the_tpu_it_is_tfembs_class_on_any_strategy():
  strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
  with strategy.scope():
    embedding = tfemb.TPUEmbeddingV0(feature_config(), None)
  assert isinstance(embedding, tfemb.TPUEmbeddingV0)


# --- TensorFlow's errors ---------------------------------------------------


def test_an_optimizer_of_another_kind_is_refused_as_tensorflow_does():
  with pytest.raises(ValueError, match="unsupported optimizer class"):
    tfemb.TPUEmbeddingV0(feature_config(), tf.keras.optimizers.SGD())


@pytest.mark.parametrize("features, weights, message", [
    ({"user": tf.constant([1, 2])}, None, "same nested structure"),
    ({"user": tf.constant([1, 2]), "friends": tf.constant([1, 2]),
      "item": tf.constant([1, 2])},
     {"user": tf.constant([1.0, 2.0]), "friends": None, "item": None},
     "Weight specified for user, but input is dense"),
    ({"user": np.array([1, 2]), "friends": tf.constant([1, 2]),
      "item": tf.constant([1, 2])}, None,
     r"Input user is type <class 'numpy.ndarray'>\. Tensor, SparseTensor or "
     "RaggedTensor expected"),
], ids=["not_every_feature", "weighted_dense", "numpy_ids"])
def test_bad_lookups_raise_tensorflows_errors(features, weights, message):
  embedding = tfemb.TPUEmbeddingV0(feature_config(), None)
  with pytest.raises(ValueError, match=message):
    embedding(features, weights)
