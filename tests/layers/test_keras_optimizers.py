"""translate_keras_optimizer: a tfemb layer trained with the translated
optimizer ends where a plain Keras Embedding trained by the Keras optimizer
ends, when every row is touched every step (where lazy and dense updates
agree). Runs for the optimizer families of the active `tf.keras`: Keras 3,
or tf_keras and tf_keras legacy under `TF_USE_LEGACY_KERAS=1`.
"""

import os

import numpy as np
import pytest
import tensorflow as tf

import reference
import tfemb
import tfemb.layers
from tfemb import resolution

keras = tf.keras
LEGACY = os.environ.get("TF_USE_LEGACY_KERAS", "0").lower() in ("1", "true")
VOCAB, DIM, STEPS = 16, 3, 4
RNG = np.random.default_rng(5)
INIT = RNG.normal(size=(VOCAB, DIM))
KERNEL = RNG.normal(size=(DIM, 1))


def schedule():
  return keras.optimizers.schedules.ExponentialDecay(0.2, decay_steps=2,
                                                     decay_rate=0.5)


# (id, family, class name, kwargs factory). kwargs are a factory because a
# schedule object must not be shared by two optimizers.
COMMON_CASES = [
    ("sgd", "SGD", lambda: dict(learning_rate=0.1)),
    ("sgd_clip", "SGD", lambda: dict(learning_rate=0.5, clipvalue=0.01)),
    ("sgd_schedule", "SGD", lambda: dict(learning_rate=schedule())),
    ("adagrad", "Adagrad", lambda: dict(learning_rate=0.2)),
    ("adagrad_init", "Adagrad", lambda: dict(
        learning_rate=schedule(), initial_accumulator_value=0.5)),
    ("adam", "Adam", lambda: dict(learning_rate=0.05)),
    ("adam_eps", "Adam", lambda: dict(learning_rate=0.05, beta_1=0.8,
                                      beta_2=0.95, epsilon=1e-3)),
    ("adam_schedule", "Adam", lambda: dict(learning_rate=schedule())),
    ("ftrl", "Ftrl", lambda: dict(
        learning_rate=0.1, l1_regularization_strength=0.01,
        l2_regularization_strength=0.02, beta=0.5)),
    ("ftrl_power", "Ftrl", lambda: dict(
        learning_rate=0.1, learning_rate_power=-0.3,
        initial_accumulator_value=0.3)),
]
NEW_ONLY_CASES = [  # Keras 3 and tf_keras' new optimizers (weight_decay)
    ("sgd_decay", "SGD", lambda: dict(learning_rate=0.1, weight_decay=0.05)),
    ("adagrad_decay", "Adagrad", lambda: dict(learning_rate=0.2,
                                              weight_decay=0.1)),
    ("adam_decay", "Adam", lambda: dict(learning_rate=0.05,
                                        weight_decay=0.1)),
]
LEGACY_ONLY_CASES = [  # tf_keras legacy: time-based decay
    ("sgd_time_decay", "SGD", lambda: dict(learning_rate=0.1, decay=0.3)),
    ("adam_time_decay", "Adam", lambda: dict(learning_rate=0.05, decay=0.2)),
]

if LEGACY:
  FAMILIES = {"tf_keras": keras.optimizers,
              "tf_keras_legacy": keras.optimizers.legacy}
else:
  FAMILIES = {"keras3": keras.optimizers}

CASES = []
for family in FAMILIES:
  extra = LEGACY_ONLY_CASES if family == "tf_keras_legacy" else NEW_ONLY_CASES
  for case in COMMON_CASES + extra:
    CASES.append(pytest.param(family, *case[1:], id=f"{family}-{case[0]}"))


def make_optimizer(family, name, kwargs):
  return getattr(FAMILIES[family], name)(**kwargs())


def batches():
  rng = np.random.default_rng(0)
  for _ in range(STEPS):
    ids = rng.permutation(VOCAB)  # every row once per step
    yield ids, rng.normal(size=(VOCAB, 1)).astype(np.float32)


def head():
  return keras.layers.Dense(
      1, trainable=False, kernel_initializer=keras.initializers.Constant(
          KERNEL))


def train_keras_embedding(opt):
  ids = keras.Input(shape=(), dtype="int64")
  emb = keras.layers.Embedding(
      VOCAB, DIM, embeddings_initializer=keras.initializers.Constant(INIT))
  model = keras.Model(ids, head()(emb(ids)))
  model.compile(optimizer=opt, loss="mse")
  for x, y in batches():
    model.train_on_batch(x, y)
  return emb.embeddings.numpy()


def train_tfemb(opt):
  table = tfemb.TableConfig(VOCAB, DIM, name="t",
                            initializer=tf.constant_initializer(INIT))
  layer = tfemb.layers.TPUEmbedding(
      {"ids": tfemb.FeatureConfig(table)},
      tfemb.layers.translate_keras_optimizer(opt))
  ids = keras.Input(shape=(), dtype="int64", name="ids")
  model = keras.Model({"ids": ids}, head()(layer({"ids": ids})["ids"]))
  model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
  for x, y in batches():
    model.train_on_batch({"ids": x}, y)
  return layer.embedding_tables[table].numpy()


@pytest.mark.parametrize("family,name,kwargs", CASES)
def test_translated_optimizer_trains_like_keras(family, name, kwargs):
  expected = train_keras_embedding(make_optimizer(family, name, kwargs))
  got = train_tfemb(make_optimizer(family, name, kwargs))
  assert not np.allclose(expected, INIT)
  np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-6)


def test_adam_learning_rate_folds_in_bias_correction():
  lr = tfemb.layers.KerasLearningRate(0.1, adam_betas=(0.9, 0.99))
  values = []
  for _ in range(3):
    values.append(float(lr()))
    lr.advance()
  np.testing.assert_allclose(
      values, reference.adam_learning_rate(0.1, 0.9, 0.99, np.arange(1, 4)),
      rtol=1e-5)


def test_only_declared_counting_rates_are_advanced():
  translated = tfemb.layers.KerasLearningRate(0.1)

  class Duck:  # an `advance` method, but no CountingLearningRate
    def __call__(self):
      return 0.1

    def advance(self):
      raise AssertionError("never advanced")

  tables = [tfemb.TableConfig(4, 2, optimizer=tfemb.SGD(rate))
            for rate in (translated, Duck(), translated, 0.1)]
  assert isinstance(translated, tfemb.optimizers.CountingLearningRate)
  assert resolution.counting_learning_rates(tables) == [translated]


def test_schedule_advances_once_per_training_step():
  table = tfemb.TableConfig(VOCAB, DIM, name="t")
  opt = tfemb.layers.translate_keras_optimizer(
      keras.optimizers.SGD(learning_rate=schedule()))
  layer = tfemb.layers.TPUEmbedding({"ids": tfemb.FeatureConfig(table)}, opt)
  ids = keras.Input(shape=(), dtype="int64", name="ids")
  model = keras.Model({"ids": ids}, head()(layer({"ids": ids})["ids"]))
  model.compile(optimizer="sgd", loss="mse")
  for x, y in batches():
    model.train_on_batch({"ids": x}, y)
  model.predict({"ids": np.arange(VOCAB)}, verbose=0)
  assert int(layer.embedding_iterations.numpy()) == STEPS
  assert float(opt.learning_rate()) == pytest.approx(
      0.2 * 0.5 ** (STEPS / 2))



STEP_SCHEDULE = dict(boundaries=[4], values=[0.01, 1.0])  # 1.0 from step 5


def one_step_learning_rate(keras_opt, restore=None):
  """The learning rate of the layer's next training step: one batch of one
  id, d loss / d activation = 1, SGD: the row moves by -lr."""
  table = tfemb.TableConfig(VOCAB, DIM, name="t",
                            initializer=tf.zeros_initializer())
  layer = tfemb.layers.TPUEmbedding(
      {"ids": tfemb.FeatureConfig(table)},
      tfemb.layers.translate_keras_optimizer(keras_opt))
  ids = keras.Input(shape=(), dtype="int64", name="ids")
  out = keras.layers.Lambda(lambda a: tf.reduce_sum(a, -1, keepdims=True))(
      layer({"ids": ids})["ids"])
  model = keras.Model({"ids": ids}, out)
  model.compile(optimizer=keras_opt, loss=lambda y, p: tf.reduce_sum(p))
  if restore is not None:
    restore(model, layer)
  model.train_on_batch({"ids": np.array([3])}, np.zeros((1, 1)))
  return -float(layer.embedding_tables[table].numpy()[3, 0])


def test_a_schedule_follows_the_keras_optimizers_iterations():
  """As tfrs reads it: a checkpoint of tfrs' layer restores the optimizer's
  `iterations` (5) and no `embedding_iterations`; the next step is
  schedule(5)."""
  opt = keras.optimizers.SGD(
      keras.optimizers.schedules.PiecewiseConstantDecay(**STEP_SCHEDULE))

  def restore(model, layer):
    del model, layer
    opt.iterations.assign(5)

  assert one_step_learning_rate(opt, restore) == pytest.approx(1.0)


def test_a_schedule_resumes_from_a_checkpoint_of_its_own_count(tmp_path):
  """A tfemb checkpoint whose optimizer was never applied (its
  `iterations` 0): the layer's own count of steps (5) goes on."""
  def make():
    return keras.optimizers.SGD(
        keras.optimizers.schedules.PiecewiseConstantDecay(**STEP_SCHEDULE))

  saved = tfemb.layers.TPUEmbedding(
      {"ids": tfemb.FeatureConfig(tfemb.TableConfig(
          VOCAB, DIM, name="t", initializer=tf.zeros_initializer()))},
      tfemb.layers.translate_keras_optimizer(make()))
  saved.build({"ids": tf.TensorShape([None])})
  saved.embedding_iterations.assign(5)
  path = tf.train.Checkpoint(layer=saved).save(str(tmp_path / "ckpt"))

  def restore(model, layer):
    del model
    tf.train.Checkpoint(layer=layer).restore(path).expect_partial()

  assert one_step_learning_rate(make(), restore) == pytest.approx(1.0)
  assert one_step_learning_rate(make()) == pytest.approx(0.01)

UNSUPPORTED = [
    ("SGD", dict(momentum=0.9), "momentum"),
    ("SGD", dict(nesterov=True, momentum=0.5), "momentum"),
    ("Adam", dict(amsgrad=True), "amsgrad"),
    ("Adam", dict(clipnorm=1.0), "clipnorm"),
    ("Adagrad", dict(global_clipnorm=1.0), "global_clipnorm"),
    ("Adagrad", dict(epsilon=1e-3), "epsilon"),
    ("Ftrl", dict(l2_shrinkage_regularization_strength=0.1),
     "l2_shrinkage_regularization_strength"),
]
UNSUPPORTED_KERAS3 = [
    ("SGD", dict(gradient_accumulation_steps=2),
     "gradient_accumulation_steps"),
    ("Adagrad", dict(loss_scale_factor=128.0), "loss_scale_factor"),
]
UNSUPPORTED_NEW = [
    ("Adam", dict(use_ema=True), "use_ema"),
    ("Ftrl", dict(weight_decay=0.1), "weight_decay"),
    ("Adam", dict(learning_rate=0.1, weight_decay=0.1, clipvalue=None),
     None),  # supported: constant lr (checked below not to raise)
]


def unsupported_cases():
  cases = []
  for family in FAMILIES:
    cases += [pytest.param(family, *c, id=f"{family}-{c[2]}")
              for c in UNSUPPORTED]
    if family != "tf_keras_legacy":
      cases += [pytest.param(family, *c, id=f"{family}-{c[2]}")
                for c in UNSUPPORTED_NEW]
    if family == "keras3":
      cases += [pytest.param(family, *c, id=f"{family}-{c[2]}")
                for c in UNSUPPORTED_KERAS3]
  return cases


@pytest.mark.parametrize("family,name,kwargs,argument", unsupported_cases())
def test_unsupported_arguments_name_themselves(family, name, kwargs,
                                               argument):
  opt = getattr(FAMILIES[family], name)(**kwargs)
  if argument is None:
    tfemb.layers.translate_keras_optimizer(opt)
    return
  with pytest.raises(ValueError, match=argument):
    tfemb.layers.translate_keras_optimizer(opt)


def test_adam_weight_decay_with_schedule_is_refused():
  family = next(f for f in FAMILIES if f != "tf_keras_legacy")
  opt = FAMILIES[family].Adam(learning_rate=schedule(), weight_decay=0.1)
  with pytest.raises(ValueError, match="weight_decay"):
    tfemb.layers.translate_keras_optimizer(opt)


def test_unsupported_optimizer_class():
  with pytest.raises(ValueError, match="RMSprop"):
    tfemb.layers.translate_keras_optimizer(keras.optimizers.RMSprop())
  with pytest.raises(ValueError, match="not a Keras optimizer"):
    tfemb.layers.translate_keras_optimizer(object())
