"""A stacked table's blocks: TensorFlow's stacked value of its tables' values,
and back.

TensorFlow's stacked variable is made of blocks, shard by shard and, inside
a shard, table by table; block j of a table is rows [j * P, (j + 1) * P) of
the table's own variable (`tfemb.sparsecore.trained_config`), P its padded
rows / N for N SparseCores.
"""

from typing import List, Sequence

import tensorflow as tf


def rows_per_shard(stacking, stacked_name: str) -> List[int]:
  """Per table of the stack (in its order), its rows in each SparseCore
  shard: P = its padded rows / N."""
  n = stacking.num_sparse_cores
  return [stacking.tables[t].padded_vocabulary_size // n
          for t in stacking.stacked_tables[stacked_name].table_names]


def join(values: Sequence[tf.Tensor], rows: Sequence[int],
         num_shards: int) -> tf.Tensor:
  """The stacked value of its tables' `values` (each `[N * rows[k], ...]`):
  shard by shard, each table's rows of the shard."""
  return tf.concat([value[s * r:(s + 1) * r] for s in range(num_shards)
                    for value, r in zip(values, rows)], axis=0)


def part(stacked: tf.Tensor, rows: Sequence[int], num_shards: int,
         k: int) -> tf.Tensor:
  """Table `k`'s value, from a `stacked` value: its rows of each shard."""
  per_shard, first = sum(rows), sum(rows[:k])
  return tf.concat([stacked[s * per_shard + first:s * per_shard + first +
                            rows[k]] for s in range(num_shards)], axis=0)


def split(stacked: tf.Tensor, rows: Sequence[int],
          num_shards: int) -> List[tf.Tensor]:
  """Each table's value, from a `stacked` value (`join`'s inverse)."""
  return [part(stacked, rows, num_shards, k) for k in range(len(rows))]
