"""Quickstart: train a recommender with Keras `model.fit` on the CPU.

The embedding tables are trained by the TPU embedding engine's Adagrad,
exactly as a TPU would train them; the rest of the model by a Keras
optimizer. Data: a synthetic click log with a hidden factor model behind the
clicks (see synthetic.py), so the AUC has somewhere to go.

    bash ci/quickstart.sh                       # from the repository root
    python tutorials/quickstart.py --epochs 3   # inside the venv
"""

import os

import tensorflow as tf

import synthetic
import tfemb
import tfemb.layers

keras = tf.keras


def build_model(num_users, num_items, dim=8):
  users = tfemb.TableConfig(num_users, dim, name="users")
  items = tfemb.TableConfig(num_items, dim, name="items")
  feature_config = {
      "user": tfemb.FeatureConfig(users),
      "item": tfemb.FeatureConfig(items),
      "history": tfemb.FeatureConfig(items),  # shares the item table
  }
  embedding = tfemb.layers.TPUEmbedding(feature_config,
                                        tfemb.Adagrad(learning_rate=0.5))
  inputs = {
      "user": keras.Input(shape=(), dtype="int64", name="user"),
      "item": keras.Input(shape=(), dtype="int64", name="item"),
      "history": keras.Input(shape=(None,), dtype="int64", ragged=True,
                             name="history"),
  }
  act = embedding(inputs)
  taste = keras.layers.Add()([act["user"], act["history"]])
  match = keras.layers.Dot(axes=1)([taste, act["item"]])
  click = keras.layers.Dense(1, activation="sigmoid")(match)
  return keras.Model(inputs, click), embedding


def main():
  args = synthetic.parse_args(__doc__.splitlines()[0], epochs=4)
  train, test = synthetic.train_and_test(args)

  model, embedding = build_model(synthetic.NUM_USERS, synthetic.NUM_ITEMS)
  model.compile(optimizer=keras.optimizers.Adam(0.01),
                loss="binary_crossentropy",
                metrics=[keras.metrics.AUC(name="auc")])
  _, auc_before = model.evaluate(test, verbose=0)
  print(f"test AUC before training: {auc_before:.3f} (0.5 is chance)")
  # The dataset shuffles its examples itself (Keras 3 warns that its own
  # shuffle=True, the default, does not apply to a dataset).
  model.fit(train, epochs=args.epochs, validation_data=test, shuffle=False)
  _, auc = model.evaluate(test, verbose=0)
  print(f"test AUC after training: {auc:.3f}")

  checkpoint = tf.train.Checkpoint(model=model)
  path = checkpoint.save(os.path.join(args.output, "ckpt"))
  tables = {t.name: v.shape.as_list()
            for t, v in embedding.embedding_tables.items()}
  print(f"saved checkpoint {path} (tables {tables}, slots included)")


if __name__ == "__main__":
  main()
