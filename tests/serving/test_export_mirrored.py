"""Inference exports of a model trained under MirroredStrategy (2 replicas
on logical CPUs): each table once (not once per replica), no slot, served
in a process that never imports tfemb with the model's predictions; for
the layer of either generation."""

import numpy as np
import pytest
import tensorflow as tf

from exports import assert_each_table_once
from exports import only
from exports import ranking_data as data
from exports import ranking_model
from exports import serve_without_tfemb
from exports import unstacked
import reference
import tfemb

GLOBAL_BATCH = 16
_STRATEGY = []
GENERATIONS = [
    "first",
    pytest.param("sparsecore", marks=pytest.mark.requires_tensorflow("2.17")),
]


def mirrored():
  if not _STRATEGY:  # own collective keys (see strategies/test_mirrored.py)
    tf.distribute.MirroredStrategy._collective_key_base = 20_000  # pylint: disable=protected-access
    _STRATEGY.append(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]))
  return _STRATEGY[0]


def trained_model(generation):
  """`(model, its tables by name)`, trained under 2 replicas."""
  with mirrored().scope():
    if generation == "sparsecore":  # each feature's per-replica batch
      model, layer = ranking_model(
          output_shape=[GLOBAL_BATCH // 2],
          sparse_core_embedding_config=tfemb.SparseCoreEmbeddingConfig())
    else:
      model, layer = ranking_model()
  x, y = data(4 * GLOBAL_BATCH, 0)
  model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=2, verbose=0)
  if generation == "sparsecore":
    return model, unstacked(layer._tpu_embedding)  # pylint: disable=protected-access
  return model, {t.name: v.numpy() for t, v in layer.embedding_tables.items()}


@pytest.mark.parametrize("how", ["model.export", "export_for_serving"])
@pytest.mark.parametrize("generation", GENERATIONS)
def test_mirrored_model_exports_each_table_once_and_serves(generation, how,
                                                           tmp_path):
  model, tables = trained_model(generation)
  path = str(tmp_path / "export")
  if how == "model.export":
    model.export(path)
  else:
    tfemb.export_for_serving(model, path)
  assert_each_table_once(path, tables, model)
  batches = [data(n, 10 + n)[0] for n in (1, 7, 2 * GLOBAL_BATCH)]
  served = only(serve_without_tfemb(tmp_path, [(path, x) for x in batches]))
  for x, got in zip(batches, served):
    want = reference.ranking_predictions(tables, x,
                                         model.layers[-1].get_weights())
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(
      served[-1], model.predict(batches[-1], batch_size=GLOBAL_BATCH,
                                verbose=0), rtol=1e-5, atol=1e-6)
