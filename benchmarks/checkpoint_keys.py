"""Checkpoint keys and values, this checkout against another.

    python -m benchmarks.checkpoint_keys --base ../other-checkout

Trains two steps of each generation, through its protocol and through the
Keras layer (`TPUEmbedding` with Adagrad, `TPUEmbeddingV2` with Adam and a
`CustomCombiner` with weights, tables stacked), from fixed initial values
and batches, saves a `tf.train.Checkpoint` of each and lists every key with
its shape and a digest of its value. With `--base`, does the same with the other checkout's
tfemb (its own process and `PYTHONPATH`, this script and interpreter) and exits 1 when any
key, shape or value differs. Use it to check that a restructuring of the
engines leaves what they save unchanged.
"""

import argparse
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent.parent


def _tables(tfemb, names, vocab=12, dim=4, combiner="mean"):
  def initial(seed):
    value = np.random.default_rng(seed).uniform(-1, 1, (vocab, dim))
    return lambda shape, dtype=None: value.astype(np.float32)
  return {n: tfemb.TableConfig(vocab, dim, initializer=initial(i),
                               combiner=combiner, name=n)
          for i, n in enumerate(names)}


def _batches(steps=2, batch=4, vocab=12):
  rng = np.random.default_rng(7)
  return [rng.integers(0, vocab, (batch,)).astype(np.int64)
          for _ in range(steps)]


def _v1(tf, tfemb):
  tables = _tables(tfemb, ["a", "b"])
  features = {n: tfemb.FeatureConfig(t, name=n) for n, t in tables.items()}
  engine = tfemb.TPUEmbedding(features, tfemb.Adagrad(0.1))
  for ids in _batches():
    engine.enqueue({n: tf.constant(ids) for n in features})
    with tf.GradientTape() as tape:
      activations = engine.dequeue()
      tape.watch(activations)
      loss = sum(tf.reduce_sum(a * a) for a in activations.values())
    engine.apply_gradients(tape.gradient(loss, activations))
  return engine


def _v2(tf, tfemb):
  tables = _tables(tfemb, ["a", "b"])
  combiner = tfemb.CustomCombiner(
      lambda valency, vectors, weights: tf.reduce_sum(
          vectors * weights[:, None], axis=0),
      max_valency=2, num_weights=2,
      initializer=tf.constant_initializer([0.5, 0.25]))
  tables.update(_tables(tfemb, ["c"], combiner=combiner))
  features = {n: tfemb.FeatureConfig(t, output_shape=[4], name=n)
              for n, t in tables.items()}
  engine = tfemb.TPUEmbeddingV2(features, tfemb.Adam(0.1))
  for ids in _batches():
    batch = {n: tf.constant(ids) for n in "ab"}
    batch["c"] = tf.RaggedTensor.from_row_lengths(
        tf.constant(np.concatenate([ids, ids[::-1]])), [2, 2, 2, 2])
    with tf.GradientTape() as tape:
      activations, preserved = engine(batch)
      tape.watch(activations)
      loss = sum(tf.reduce_sum(a * a) for a in activations.values())
    engine.apply_gradients(tape.gradient(loss, activations), preserved)
  return engine


def _layer(tf, tfemb, feature):
  import tfemb.layers  # pylint: disable=g-import-not-at-top,redefined-outer-name,import-outside-toplevel
  tables = _tables(tfemb, ["a", "b"])
  features = {n: tfemb.FeatureConfig(t, output_shape=[4], name=n)
              for n, t in tables.items()}
  layer = tfemb.layers.TPUEmbedding(features, tfemb.Adagrad(0.1),
                                    embedding_feature=feature)
  inputs = {n: tf.keras.Input(shape=(), batch_size=4, dtype=tf.int64,
                              name=n) for n in features}
  outputs = layer(inputs)
  joined = tf.keras.layers.Concatenate()(list(outputs.values()))
  model = tf.keras.Model(inputs, tf.keras.layers.Dense(
      1, kernel_initializer="ones")(joined))
  model.compile(optimizer=tf.keras.optimizers.SGD(0.1), loss="mse")
  batches = _batches()
  x = {n: np.stack(batches).reshape(-1) for n in features}
  model.fit(x, np.ones(8, np.float32), batch_size=4, epochs=1, verbose=0,
            shuffle=False)
  return model


def _digest(value) -> str:
  """The value's bytes, hashed: equal only where every bit is."""
  data = value if isinstance(value, bytes) else np.asarray(value).tobytes()
  return hashlib.sha256(data).hexdigest()


def saved(out: str) -> None:
  """Writes `{case: {key: [shape, values]}}` of this checkout to `out`."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  import tfemb  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  v2 = tf.tpu.experimental.HardwareFeature.EmbeddingFeature.V2
  cases = {
      "TPUEmbedding": lambda: _v1(tf, tfemb),
      "TPUEmbeddingV2": lambda: _v2(tf, tfemb),
      "layer": lambda: _layer(tf, tfemb, None),
      "layer V2": lambda: _layer(tf, tfemb, v2),
  }
  result = {}
  with tempfile.TemporaryDirectory() as tmp:
    for case, make in cases.items():
      tf.keras.utils.set_random_seed(0)
      path = tf.train.Checkpoint(saved=make()).write(
          os.path.join(tmp, case.replace(" ", "_")))
      reader = tf.train.load_checkpoint(path)
      result[case] = {
          key: [list(shape), _digest(reader.get_tensor(key))
                if key != "_CHECKPOINTABLE_OBJECT_GRAPH" else None]
          for key, shape in tf.train.list_variables(path)}
  with open(out, "w") as f:
    json.dump(result, f)


def differences(ours, theirs) -> list:
  """What differs between two `saved` results, one line each."""
  lines = []
  for case in sorted(set(ours) | set(theirs)):
    a, b = ours.get(case, {}), theirs.get(case, {})
    for key in sorted(set(a) - set(b)):
      lines.append(f"{case}: {key} only here")
    for key in sorted(set(b) - set(a)):
      lines.append(f"{case}: {key} only in the base")
    for key in sorted(set(a) & set(b)):
      if a[key][0] != b[key][0]:
        lines.append(f"{case}: {key} shape {a[key][0]} vs {b[key][0]}")
      elif a[key][1] != b[key][1]:
        lines.append(f"{case}: {key} values differ")
  return lines


def _run(root: pathlib.Path, out: str) -> None:
  """This script (the same code for both) on the tfemb of `root`."""
  env = dict(os.environ, PYTHONPATH=str(root), TF_CPP_MIN_LOG_LEVEL="3")
  subprocess.run([sys.executable, os.path.abspath(__file__), "--write", out],
                 cwd=root, env=env, check=True, stdout=subprocess.DEVNULL)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--base", help="the other checkout's root")
  p.add_argument("--write", help="only write this checkout's keys here")
  args = p.parse_args(argv)
  if args.write:
    saved(args.write)
    return 0
  with tempfile.TemporaryDirectory() as tmp:
    results = []
    for root in [HERE] + ([pathlib.Path(args.base).resolve()]
                          if args.base else []):
      out = os.path.join(tmp, f"{len(results)}.json")
      _run(root, out)
      with open(out) as f:
        results.append(json.load(f))
  for case, keys in results[0].items():
    print(f"{case}: {len(keys)} keys")
  if not args.base:
    return 0
  lines = differences(*results)
  for line in lines:
    print(line)
  print(f"checkpoint_keys: {'differ' if lines else 'identical'} "
        f"({sum(len(k) for k in results[0].values())} keys)")
  return 1 if lines else 0


if __name__ == "__main__":
  sys.exit(main())
