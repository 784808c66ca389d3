"""experiments/mirrored.py times what it says: in its `mirrored` mode the
suite's Keras step trains mirrored tables, through the fused kernels."""

import numpy as np
import tensorflow as tf

from benchmarks import timing
from benchmarks import train_step
from benchmarks import workload as workload_lib
from experiments import mirrored


def test_the_mirrored_mode_trains_mirrored_tables_with_the_kernels(
    monkeypatch):
  models = []
  make_step = train_step.keras_train_step
  monkeypatch.setattr(
      train_step, "keras_train_step",
      lambda model, *args: models.append(model) or make_step(model, *args))
  work = workload_lib.Workload(vocab=50, optimizer="adagrad", features=2,
                               dim=4, batch=8, distinct_batches=1)
  features, labels = timing.to_tensors(work.make_batches())[0]
  run = mirrored.build_step("mirrored", work)
  loss = run(features, labels)
  graph = run.get_concrete_function(features, labels).graph
  definition = graph.as_graph_def()  # the step and the functions it calls
  types = [n.op for n in definition.node] + [
      n.op for f in definition.library.function for n in f.node_def]
  assert types.count("TfembApplyRows") == work.features
  assert "ResourceGather" not in types
  assert np.isfinite(loss.numpy())
  (model,) = models
  (layer,) = [l for l in model.layers if hasattr(l, "embedding_variables")]
  variables = [v for slots in layer.embedding_variables.values()
               for v in slots.values()]
  assert len(variables) == 2 * work.features  # tables and accumulators
  for v in variables:
    assert isinstance(v, tf.distribute.DistributedValues), v.name
