"""A report of the SparseCore's id limits for an input pipeline
(docs/sparsecore.md, "Id limits"), before renting a TPU: per stacked
table, the largest counts of one chip's batches
(`tfemb.sparsecore.id_counting`), the ids a `SparseCoreEmbeddingConfig`
drops or the batches it fails, the memory per chip, and a suggested
config. `python -m tfemb.tpu sparsecore` prints it
(`tfemb.sparsecore.report_command`).
"""

import dataclasses
import math
from typing import Any, Dict, Iterable, List, Optional

from tfemb import optimizers
from tfemb.sparsecore import id_counting
from tfemb.sparsecore import sparse_core_stats

HEADROOM = 1.25  # the suggested limits: the largest count seen x this, / 8


@dataclasses.dataclass
class TableReport:
  """What a pipeline's batches asked of one stacked table."""
  tables: List[str]
  max_ids: int = 0
  max_unique_ids: int = 0
  dropped: int = 0
  failed: int = 0  # batches the config would fail
  bytes_per_chip: int = 0


def _suggest(count: int) -> int:
  return max(8, int(math.ceil(count * HEADROOM / 8)) * 8)


def _row_width(table, dim: int) -> int:
  """float32 values per stacked row: the row and each slot's (a
  CustomOptimizer's 1-D slot, `optimizers.slot_dims` 1, holds one value
  per row)."""
  opt = table.optimizer
  if opt is None:
    return dim
  return dim + sum(1 if d == 1 else dim for d in optimizers.slot_dims(opt))


def report(batches: Iterable[Any], feature_config: Any, num_tpu_chips: int,
           num_sc_per_chip: int = 4, optimizer: Optional[Any] = None,
           sparse_core_embedding_config: Optional[Any] = None
           ) -> Dict[str, Any]:
  """Scans one chip's `batches`: per stacked table the largest counts, the
  ids `sparse_core_embedding_config` drops (or the batches it fails), the
  tables' and slots' bytes per chip; and a suggested config (the largest
  counts x `HEADROOM`, rounded up to 8). JSON-ready."""
  config, stacking = sparse_core_stats.stacking_for(
      feature_config, num_tpu_chips, num_sc_per_chip, optimizer,
      sparse_core_embedding_config)
  given = id_counting.Limits.of(sparse_core_embedding_config) if (
      sparse_core_embedding_config is not None) else id_counting.Limits()
  tables = {n: TableReport(list(s.table_names))
            for n, s in stacking.stacked_tables.items()}
  by_name = {t.name: t for t in config.tables}
  for name, stacked in stacking.stacked_tables.items():
    tables[name].bytes_per_chip = (
        stacked.shape[0] * _row_width(by_name[stacked.table_names[0]],
                                      stacked.shape[1]) * 4 // num_tpu_chips)
  scanned = 0
  for batch in batches:
    ids = sparse_core_stats.feature_ids(config, batch)
    scanned += 1
    for name, c in id_counting.counts(stacking, ids).items():
      tables[name].max_ids = max(tables[name].max_ids, int(c.ids.max()))
      tables[name].max_unique_ids = max(tables[name].max_unique_ids,
                                        int(c.unique.max()))
    for name in stacking.stacked_tables:
      try:
        one = id_counting.plan(_only(stacking, name), ids, given)
        tables[name].dropped += one.dropped.get(name, 0)
      except id_counting.LimitError:
        tables[name].failed += 1
  if not scanned:
    raise ValueError("The input pipeline gave no batch.")
  return {
      "num_tpu_chips": num_tpu_chips,
      "num_sc_per_chip": num_sc_per_chip,
      "batches": scanned,
      "tables": {n: dataclasses.asdict(t) for n, t in tables.items()},
      "suggested_config": {
          "max_ids_per_table": {n: _suggest(t.max_ids)
                                for n, t in tables.items()},
          "max_unique_ids_per_table": {n: _suggest(t.max_unique_ids)
                                       for n, t in tables.items()},
          "max_ids_per_chip_per_sample": given.max_ids_per_chip_per_sample,
      },
      "bytes_per_chip": sum(t.bytes_per_chip for t in tables.values()),
  }


def _only(stacking, name: str):
  """`stacking` with only stacked table `name` (so one table's failure
  does not hide another's counts)."""
  return dataclasses.replace(
      stacking, stacked_tables={name: stacking.stacked_tables[name]})


def format_report(result: Dict[str, Any]) -> str:
  """`report`'s result as a table."""
  rows = [("stacked table", "tables", "max ids", "max unique", "dropped",
           "failed", "MiB/chip")]
  for name, t in result["tables"].items():
    rows.append((name, ",".join(t["tables"]), str(t["max_ids"]),
                 str(t["max_unique_ids"]), str(t["dropped"]), str(t["failed"]),
                 f"{t['bytes_per_chip'] / 2**20:.1f}"))
  widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
  lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
  suggested = result["suggested_config"]
  lines += [
      "",
      f"{result['batches']} batches, {result['num_tpu_chips']} chips x "
      f"{result['num_sc_per_chip']} SparseCores; tables and slots: "
      f"{result['bytes_per_chip'] / 2**20:.1f} MiB per chip.",
      f"Suggested (largest count x {HEADROOM}, rounded up to 8):",
      "  tf.tpu.experimental.embedding.SparseCoreEmbeddingConfig(",
      f"      max_ids_per_table={suggested['max_ids_per_table']},",
      f"      max_unique_ids_per_table="
      f"{suggested['max_unique_ids_per_table']},",
      f"      max_ids_per_chip_per_sample="
      f"{suggested['max_ids_per_chip_per_sample']})",
  ]
  return "\n".join(lines)
