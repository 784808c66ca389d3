"""A keras-rs ranking model, written for a TPU, trained on the CPU as on a
v5p-8.

Nothing in this program knows about tfemb: it sets up its TPU the way Cloud
TPU's guides do, and keras-rs' `DistributedEmbedding` puts its tables on
the SparseCores (placement `"auto"` picks them on a TPU). Run it on the CPU
with tfemb standing in for the TPU:

    python -m tfemb.run --tpu v5p-8 tutorials/keras_rs_on_cpu.py

The resolver, `initialize_tpu_system` and `TPUStrategy(resolver)` then give
a TPUStrategy of the v5p-8's 4 replicas on logical CPU devices, and the
SparseCore engine keras-rs asks TensorFlow for is tfemb's host
`TPUEmbeddingV2`: the SparseCore's numbers, stacked tables and id limits
(docs/tpu.md, "TPU programs on the CPU"). On a TPU VM the same file runs
unchanged with `python tutorials/keras_rs_on_cpu.py`.

The data is a synthetic click log: some users click more than others, and
some item categories draw more clicks, which the embeddings have to learn.
"""

import argparse

import keras
import keras_rs
import numpy as np
import tensorflow as tf

USERS, ITEMS, CATEGORIES, DIM = 2_000, 5_000, 50, 16


def tpu_strategy():
  """The TPU set-up of Cloud TPU's guides."""
  resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu="")
  tf.config.experimental_connect_to_cluster(resolver)
  tf.tpu.experimental.initialize_tpu_system(resolver)
  return tf.distribute.TPUStrategy(resolver)


def click_log(examples, seed):
  """(features, clicks): users, items and the items' categories."""
  rng = np.random.default_rng(seed)
  # The same world for every seed: only the sample differs.
  world = np.random.default_rng(1234)
  user_bias = world.normal(size=USERS)
  category_bias = world.normal(size=CATEGORIES)
  category_of = world.integers(0, CATEGORIES, ITEMS)
  user = rng.integers(0, USERS, examples)
  item = rng.zipf(1.3, examples) % ITEMS
  category = category_of[item]
  logit = 1.5 * user_bias[user] + 1.5 * category_bias[category] - 0.5
  click = (rng.random(examples) < 1 / (1 + np.exp(-logit))).astype("float32")
  features = {"user": user[:, None].astype("int32"),
              "item": item[:, None].astype("int32"),
              "category": category[:, None].astype("int32")}
  return features, click[:, None]


def build_model(batch_size):
  tables = {name: keras_rs.layers.TableConfig(
      name=name, vocabulary_size=size, embedding_dim=DIM,
      optimizer=keras.optimizers.Adagrad(0.1), combiner="sum")
            for name, size in (("user", USERS), ("item", ITEMS),
                               ("category", CATEGORIES))}
  features = {name: keras_rs.layers.FeatureConfig(
      name=name, table=table, input_shape=(batch_size, 1),
      output_shape=(batch_size, DIM)) for name, table in tables.items()}
  embedding = keras_rs.layers.DistributedEmbedding(features)
  inputs = {name: keras.Input((1,), dtype="int32", name=name)
            for name in features}
  activations = embedding(inputs)
  x = keras.layers.Concatenate()([activations[n] for n in sorted(inputs)])
  x = keras.layers.Dense(32, activation="relu")(x)
  output = keras.layers.Dense(1, activation="sigmoid")(x)
  model = keras.Model(inputs, output)
  model.compile(optimizer=keras.optimizers.Adam(0.003),
                loss="binary_crossentropy",
                metrics=[keras.metrics.AUC(name="auc")])
  return model, embedding


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--examples", type=int, default=200_000)
  parser.add_argument("--epochs", type=int, default=3)
  parser.add_argument("--batch-size", type=int, default=1024,
                      help="global batch, across the replicas")
  args = parser.parse_args()

  strategy = tpu_strategy()
  print(f"Strategy: {type(strategy).__name__}, "
        f"{strategy.num_replicas_in_sync} replicas, embedding hardware "
        f"{strategy.extended.tpu_hardware_feature.embedding_feature.value}")
  x, y = click_log(args.examples, seed=0)
  test_x, test_y = click_log(args.examples // 10, seed=1)
  options = tf.distribute.InputOptions(experimental_fetch_to_device=False)

  def batches(features, labels):
    data = tf.data.Dataset.from_tensor_slices((features, labels)).batch(
        args.batch_size, drop_remainder=True)
    return strategy.experimental_distribute_dataset(data, options)

  with strategy.scope():
    model, embedding = build_model(args.batch_size)
  print(f"SparseCore engine: {type(embedding._tpu_embedding).__module__}."  # pylint: disable=protected-access
        f"{type(embedding._tpu_embedding).__name__}")  # pylint: disable=protected-access
  before = model.evaluate(batches(test_x, test_y), verbose=0,
                          return_dict=True)
  print(f"Test loss before training: {before['loss']:.4f}, "
        f"AUC {before['auc']:.4f}")
  history = model.fit(batches(x, y), epochs=args.epochs, verbose=2)
  after = model.evaluate(batches(test_x, test_y), verbose=0,
                         return_dict=True)
  print("Training loss by epoch: " +
        ", ".join(f"{v:.4f}" for v in history.history["loss"]))
  print(f"Test loss after training: {after['loss']:.4f}, "
        f"AUC {after['auc']:.4f}")


if __name__ == "__main__":
  main()
