"""The Keras layer following the SparseCore off the TPU: given a
`sparse_core_embedding_config` (or `embedding_feature=V2`), `model.fit`
trains with `tfemb.TPUEmbeddingV2`'s numbers (no gradient clipping, stacked
tables), and its tables and slots save and restore with the model; without,
it trains with the first generation's (clipping applied)."""

import os

import numpy as np
import pytest
import tensorflow as tf

import reference
import tfemb
import tfemb.layers
from tfemb.sparsecore import table_stacking

keras = tf.keras
LEGACY = os.environ.get("TF_USE_LEGACY_KERAS", "0").lower() in ("1", "true")
INIT = np.arange(40, dtype=np.float32).reshape(10, 4) / 10
IDS = np.array([1, 4, 1, 7], np.int32)


def _model(optimizer, **layer_kwargs):
  table = tfemb.TableConfig(10, 4, name="t",
                            initializer=tf.constant_initializer(INIT))
  layer = tfemb.layers.TPUEmbedding(
      {"f": tfemb.FeatureConfig(table, output_shape=[4])}, optimizer,
      **layer_kwargs)
  inputs = {"f": keras.Input(shape=(), batch_size=4, dtype="int32",
                             name="f")}
  outputs = keras.layers.Lambda(
      lambda a: tf.reduce_sum(a, axis=-1, keepdims=True))(layer(inputs)["f"])
  model = keras.Model(inputs, outputs)
  # d loss / d activation = 1 for every element.
  model.compile(optimizer="sgd", loss=lambda y, p: tf.reduce_sum(p))
  return model, layer


def _fit(**layer_kwargs):
  model, layer = _model(tfemb.SGD(0.5, clipvalue=0.1), **layer_kwargs)
  model.fit({"f": IDS}, np.zeros((4, 1)), batch_size=4, epochs=1, verbose=0)
  return layer


def _expected(clip):
  """SGD(0.5) on the summed gradient of each row, clipped to `clip`."""
  table = reference.Table(INIT, "sgd", {"clip_gradient": (-clip, clip)})
  table.apply({i: np.full(4, float(count))
               for i, count in ((1, 2), (4, 1), (7, 1))}, 0.5)
  return table.w


@pytest.mark.requires_tensorflow("2.17")  # the SparseCore host engine
@pytest.mark.parametrize("kwargs", [
    dict(sparse_core_embedding_config=tfemb.SparseCoreEmbeddingConfig()),
    dict(embedding_feature=tf.tpu.experimental.HardwareFeature
         .EmbeddingFeature.V2),
], ids=["config", "feature"])
def test_asked_for_v2_the_layer_trains_as_a_sparsecore(kwargs):
  layer = _fit(**kwargs)
  (name, table), = layer.embedding_tables.items()
  assert name == "t" and table.shape == (32, 8)  # stacked, padded
  stacking = layer._tpu_embedding._stacking  # pylint: disable=protected-access
  got = table_stacking.to_unstacked(stacking, {"t": table.numpy()})["t"]
  np.testing.assert_allclose(got, _expected(clip=np.inf), rtol=1e-6)


def test_by_default_the_layer_trains_as_the_first_generation():
  layer = _fit()
  (table,) = layer.embedding_tables.values()
  np.testing.assert_allclose(table.numpy(), _expected(clip=0.1), rtol=1e-6)


V2 = dict(sparse_core_embedding_config=tfemb.SparseCoreEmbeddingConfig())


def _state(layer):
  return {f"{t}/{n}": v.numpy() for t, slots in
          layer.embedding_variables.items() for n, v in slots.items()}


def _trained_v2():
  model, layer = _model(tfemb.Adagrad(0.5), **V2)
  for ids in (IDS, IDS[::-1]):
    model.train_on_batch({"f": ids}, np.zeros((4, 1)))
  return model, layer


@pytest.mark.requires_tensorflow("2.17")  # the SparseCore host engine
@pytest.mark.parametrize("how", ["weights", "checkpoint"])
def test_following_v2_the_tables_and_slots_save_and_restore(how, tmp_path):
  model, layer = _trained_v2()
  saved = _state(layer)
  assert set(saved) == {"t/parameters", "t/accumulators"}
  fresh, fresh_layer = _model(tfemb.Adagrad(0.5), **V2)
  if how == "weights":
    path = str(tmp_path / ("ckpt" if LEGACY else "model.weights.h5"))
    model.save_weights(path)
    fresh.load_weights(path)
  else:
    path = tf.train.Checkpoint(model=model).save(str(tmp_path / "ckpt"))
    tf.train.Checkpoint(model=fresh).restore(path).assert_existing_objects_matched()
  for key, value in saved.items():
    np.testing.assert_array_equal(_state(fresh_layer)[key], value,
                                  err_msg=key)
  x = {"f": IDS}
  np.testing.assert_array_equal(fresh.predict(x, batch_size=4, verbose=0),
                                model.predict(x, batch_size=4, verbose=0))


@pytest.mark.requires_tensorflow("2.17")  # the SparseCore host engine
def test_a_batch_over_an_id_limit_moves_neither_tables_nor_dense_weights():
  """The id limits' check runs beside the lookup (docs/sparsecore.md, "Id
  limits"): a batch over `max_ids_per_table` fails the Keras step, and
  neither the table nor the dense layer that takes the activations moves;
  a batch within it trains both."""
  table = tfemb.TableConfig(10, 4, name="t",
                            initializer=tf.constant_initializer(INIT))
  layer = tfemb.layers.TPUEmbedding(
      {"f": tfemb.FeatureConfig(table, output_shape=[8])}, tfemb.SGD(0.5),
      sparse_core_embedding_config=tfemb.SparseCoreEmbeddingConfig(
          max_ids_per_table={"t": 1}, max_unique_ids_per_table={"t": 1}))
  inputs = {"f": keras.Input(shape=(), batch_size=8, dtype="int32",
                             name="f")}
  dense = keras.layers.Dense(1, kernel_initializer="ones")
  model = keras.Model(inputs, dense(layer(inputs)["f"]))
  model.compile(optimizer=keras.optimizers.SGD(0.1),
                loss=lambda y, p: tf.reduce_sum(p))
  within = {"f": np.arange(8, dtype=np.int32)}  # a cell gets one id at most
  model.train_on_batch(within, np.zeros((8, 1)))  # builds (fit shuffles)
  before = [layer.embedding_tables["t"].numpy(), dense.kernel.numpy()]
  # One chip: 4 SparseCores of 2 samples each, 4 partitions (id mod 4).
  # Ids 0 and 4 of SparseCore 0's samples both go to partition 0: two ids
  # over the limit of one.
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"SparseCore 0 of the chip sends 2 ids to "
                     r"partition 0 .*over the limit of 1"):
    model.train_on_batch({"f": np.array([0, 4, 2, 3, 5, 6, 7, 9], np.int32)},
                         np.zeros((8, 1)))
  np.testing.assert_array_equal(layer.embedding_tables["t"].numpy(),
                                before[0])
  np.testing.assert_array_equal(dense.kernel.numpy(), before[1])
  model.train_on_batch(within, np.zeros((8, 1)))
  assert not np.array_equal(dense.kernel.numpy(), before[1])
  assert not np.array_equal(layer.embedding_tables["t"].numpy(), before[0])
