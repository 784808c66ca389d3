"""A `TPUPlan` as text: a table per embedding table, totals, features."""

from typing import List, Sequence

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def human_bytes(n: int) -> str:
  """`n` bytes in binary units: 1536 -> '1.5 KiB'."""
  value, unit = float(n), 0
  while value >= 1024 and unit < len(_UNITS) - 1:
    value, unit = value / 1024, unit + 1
  return f"{n} B" if unit == 0 else f"{value:.1f} {_UNITS[unit]}"


def _columns(header: Sequence[str], rows: List[Sequence[str]],
             right: Sequence[bool]) -> List[str]:
  widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
  lines = []
  for row in [header] + rows:
    cells = [c.rjust(w) if r else c.ljust(w)
             for c, w, r in zip(row, widths, right)]
    lines.append("  ".join(cells).rstrip())
  return lines


def format_plan(plan) -> str:
  """The report `python -m tfemb.tpu` prints."""
  batch = plan.per_replica_batch_size
  lines = [
      "TPU embedding plan for TensorFlow's TPUEmbedding (embedding hardware "
      "V1), float32",
      f"{plan.num_replicas} replicas, {plan.num_tensor_cores} TensorCores on "
      f"{plan.num_hosts} host(s) x {plan.chips_per_host} chip(s); "
      f"per-replica batch {batch if batch else '(from output_shape)'}",
      "",
  ]
  rows = []
  for t in plan.tables:
    slots = ", ".join(f"{name} {human_bytes(b)}"
                      for name, b in t.slot_bytes.items()) or "-"
    rows.append((t.name, f"{t.rows:,}", str(t.dim), t.optimizer,
                 human_bytes(t.variable_bytes), slots,
                 human_bytes(t.total_bytes), human_bytes(t.bytes_per_host),
                 human_bytes(t.bytes_per_chip)))
  lines += _columns(
      ("table", "rows", "dim", "optimizer", "parameters", "slots", "total",
       "per host", "per chip"), rows,
      (False, True, True, False, True, False, True, True, True))
  lines += [
      "",
      f"all tables: {human_bytes(plan.total_bytes)} "
      f"({plan.total_bytes:,} bytes)",
      f"fullest host: {human_bytes(plan.bytes_per_host)} "
      f"({plan.bytes_per_host:,} bytes)",
      f"fullest chip: {human_bytes(plan.bytes_per_chip)} "
      f"({plan.bytes_per_chip:,} bytes; the host's rows split evenly over its "
      "chips, an estimate)",
      "",
  ]
  lines += _columns(
      ("feature", "table", "input shape"),
      [(f.path, f.table, str(list(f.input_shape))) for f in plan.features],
      (False, False, False))
  return "\n".join(lines)
