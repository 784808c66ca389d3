"""Bad input through the Keras layer: an error naming the feature or table,
and every table and slot bit-identical afterwards, with `train_on_batch`
(inside Keras' tf.function) and eagerly with a GradientTape."""

import numpy as np
import pytest
import tensorflow as tf

import helpers
import tfemb
import tfemb.layers

keras = tf.keras
E = tf.errors.InvalidArgumentError


def build():
  a = tfemb.TableConfig(10, 3, name="a")
  b = tfemb.TableConfig(8, 2, name="b", optimizer=tfemb.Adam(0.1))
  layer = tfemb.layers.TPUEmbedding(
      {"d": tfemb.FeatureConfig(a), "r": tfemb.FeatureConfig(b)},
      tfemb.Adagrad(0.1))
  inputs = {"d": keras.Input(shape=(), dtype="int64", name="d"),
            "r": keras.Input(shape=(None,), dtype="int64", ragged=True,
                             name="r")}
  act = layer(inputs)
  out = keras.layers.Dense(1)(keras.layers.Concatenate()([act["d"],
                                                           act["r"]]))
  model = keras.Model(inputs, out)
  model.compile(optimizer="sgd", loss="mse")
  return model, layer


def good():
  return ({"d": tf.constant([1, 2, 3, 9], tf.int64),
           "r": helpers.ragged([[0, 1], [2], [3, 5, 7], []])},
          np.ones((4, 1), np.float32))


CASES = {
    "id_out_of_range": (dict(d=tf.constant([1, 2, 3, 10], tf.int64)), None,
                        E,
                        r"Feature \W*d\W*[^:]*: ids must be in \[0, 10\)"),
    "negative_id": (dict(r=helpers.ragged([[0, -1], [2], [3], []])), None,
                    E,
                    r"Feature \W*r\W*[^:]*: ids must be in \[0, 8\)"),
    "nan_labels_give_nan_gradients": (
        {}, np.full((4, 1), np.nan, np.float32), E, r"Table \W*[ab]\W*.*"
        r"non-finite"),
}


def snapshot(layer):
  return {f"{t.name}/{n}": v.numpy().copy()
          for t, slots in layer.embedding_variables.items()
          for n, v in slots.items()}


@pytest.mark.parametrize("mode", ["train_on_batch", "tape"])
@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_through_the_layer(name, mode):
  changes, labels, error, pattern = CASES[name]
  model, layer = build()
  x, y = good()
  model.train_on_batch(x, y)
  before = snapshot(layer)
  bad_x = dict(x, **changes)
  bad_y = y if labels is None else labels

  def tape_step():
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean((model(bad_x, training=True) - bad_y) ** 2)
    tape.gradient(loss, model.trainable_weights)

  with pytest.raises(error, match=pattern):
    if mode == "train_on_batch":
      model.train_on_batch(bad_x, bad_y)
    else:
      tape_step()
  for key, value in before.items():
    np.testing.assert_array_equal(snapshot(layer)[key], value, err_msg=key)


def test_float_ids_given_to_the_layer_are_cast_as_on_a_tpu():
  """(A functional model casts its inputs to the Input's dtype first.) The
  layer's engine casts ids to int64 as TensorFlow's TPUEmbedding does:
  1.9 is id 1, and 10.5 is id 10, outside the table."""
  model, layer = build()
  x, _ = good()
  model.predict(x, verbose=0)
  as_ints = layer(dict(x, d=tf.constant([1, 2, 3, 4], tf.int64)))["d"]
  as_floats = layer(dict(x, d=tf.constant([1.9, 2.0, 3.5, 4.2])))["d"]
  np.testing.assert_array_equal(as_floats.numpy(), as_ints.numpy())
  before = snapshot(layer)
  with pytest.raises(E, match=r"Feature \W*d\W*[^:]*: ids must be in "
                     r"\[0, 10\)"):
    model.train_on_batch(dict(x, d=tf.constant([1.0, 2.0, 3.0, 10.5])),
                         np.ones((4, 1), np.float32))
  for key, value in before.items():
    np.testing.assert_array_equal(snapshot(layer)[key], value, err_msg=key)


def test_missing_feature_names_the_structure():
  model, layer = build()
  x, _ = good()
  model.predict(x, verbose=0)
  with pytest.raises(Exception, match="d|structure"):
    layer({"r": x["r"]})


def test_layer_can_skip_non_finite_steps():
  model, layer = build()
  layer.non_finite_gradients = "skip"
  x, y = good()
  model.train_on_batch(x, y)
  before = snapshot(layer)
  model.train_on_batch(x, np.full((4, 1), np.inf, np.float32))
  for key, value in before.items():
    np.testing.assert_array_equal(snapshot(layer)[key], value, err_msg=key)
  assert layer.skipped_steps == 1
