"""Tune a SparseCore's id limits on the CPU, before renting a TPU.

A TPU with SparseCores (v5p, v6e) gives each stacked table static id
buffers sized by `SparseCoreEmbeddingConfig`: a batch over a limit fails,
or with `allow_id_dropping=True` loses ids. This tutorial takes a small
DLRM-like model (three categorical features on Zipf-distributed ids, one
of them multi-hot), counts what its batches ask of a 4-chip TPU, and shows
the drops of a too-small config going to zero with the suggested one.

    python tutorials/sparsecore_limits.py [--chips 4] [--batches 20]

The same report from the command line, for your own model and pipeline:

    python -m tfemb.tpu sparsecore --config sparsecore_limits:features \
        --data sparsecore_limits:batches --chips 4
"""

import argparse

import numpy as np
import tensorflow as tf

import tfemb
from tfemb.sparsecore import pipeline_report

PER_CHIP_BATCH = 2048
VOCAB = {"item": 50_000, "user": 20_000, "history": 50_000}


def features():
  """The model's features, each with its per-chip output_shape."""
  items = tfemb.TableConfig(VOCAB["item"], 32, name="items")
  users = tfemb.TableConfig(VOCAB["user"], 32, name="users")
  return {
      "item": tfemb.FeatureConfig(items, output_shape=[PER_CHIP_BATCH]),
      "history": tfemb.FeatureConfig(items, output_shape=[PER_CHIP_BATCH]),
      "user": tfemb.FeatureConfig(users, output_shape=[PER_CHIP_BATCH]),
  }, tfemb.Adagrad(0.05)


def batches(count=20, seed=0):
  """One chip's batches: Zipf ids (a few very popular ones), a history of
  1 to 20 items per example."""
  rng = np.random.default_rng(seed)

  def zipf(size, vocab):
    return np.minimum(rng.zipf(1.2, size) - 1, vocab - 1)

  for _ in range(count):
    lengths = rng.integers(1, 21, PER_CHIP_BATCH)
    yield {
        "item": tf.constant(zipf(PER_CHIP_BATCH, VOCAB["item"])),
        "history": tf.RaggedTensor.from_row_lengths(
            zipf(lengths.sum(), VOCAB["item"]), lengths),
        "user": tf.constant(zipf(PER_CHIP_BATCH, VOCAB["user"])),
    }


def dropped(result):
  return sum(t["dropped"] for t in result["tables"].values())


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--chips", type=int, default=4)
  parser.add_argument("--batches", type=int, default=20)
  args = parser.parse_args()
  config, optimizer = features()

  # 1. What the batches ask of the TPU, and what TensorFlow's defaults do.
  first = pipeline_report.report(batches(args.batches), config, args.chips,
                                 optimizer=optimizer)
  print(pipeline_report.format_report(first))
  print(f"\nWith TensorFlow's defaults (256 ids per partition), batches "
        f"that would fail: "
        f"{sum(t['failed'] for t in first['tables'].values())}")

  # 2. A config too small for them: the TPU would drop ids.
  small = tf.tpu.experimental.embedding.SparseCoreEmbeddingConfig(
      max_ids_per_chip_per_sample=2,
      max_ids_per_table={n: 4096 for n in first["tables"]},
      max_unique_ids_per_table={n: 4096 for n in first["tables"]},
      allow_id_dropping=True)
  tight = pipeline_report.report(batches(args.batches), config, args.chips,
                                 optimizer=optimizer,
                                 sparse_core_embedding_config=small)
  print(f"\nmax_ids_per_chip_per_sample=2 with allow_id_dropping: "
        f"{dropped(tight)} ids dropped over {args.batches} batches")

  # 3. The suggested config: nothing dropped, nothing failed.
  suggested = first["suggested_config"]
  tuned = tf.tpu.experimental.embedding.SparseCoreEmbeddingConfig(
      max_ids_per_chip_per_sample=64,
      max_ids_per_table=suggested["max_ids_per_table"],
      max_unique_ids_per_table=suggested["max_unique_ids_per_table"],
      allow_id_dropping=True)
  final = pipeline_report.report(batches(args.batches), config, args.chips,
                                 optimizer=optimizer,
                                 sparse_core_embedding_config=tuned)
  failed = sum(t["failed"] for t in final["tables"].values())
  print(f"\nThe suggested config: {dropped(final)} ids dropped, {failed} "
        "batches failed.")


if __name__ == "__main__":
  main()
