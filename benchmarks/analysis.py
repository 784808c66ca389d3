"""The benchmark suite's targets, from one run's results (no TensorFlow).

A run is a dict: {"meta": ..., "bandwidth": {...}, "runs": [row, ...]};
a row has stack, optimizer, vocab, status, median_ms, peak_rss, ... .
"""

from typing import Dict, List, Optional, Tuple

from benchmarks import procmem
from benchmarks.stacks import BY_NAME

Key = Tuple[str, str, int]  # stack, optimizer, vocab


def index(runs: List[dict]) -> Dict[Key, dict]:
  return {(r["stack"], r["optimizer"], r["vocab"]): r for r in runs}


def ok(row: Optional[dict]) -> bool:
  return bool(row) and row["status"] == "ok"


def fastest_peer(runs, optimizer, vocab) -> Optional[dict]:
  peers = [r for r in runs if r["optimizer"] == optimizer and
           r["vocab"] == vocab and ok(r) and BY_NAME[r["stack"]].peer]
  return min(peers, key=lambda r: r["median_ms"]) if peers else None


def ratio(runs, row) -> Optional[float]:
  """tfemb's step time / this row's (below 1: tfemb is faster)."""
  mine = index(runs).get(("tfemb", row["optimizer"], row["vocab"]))
  if not (ok(mine) and ok(row)) or not BY_NAME[row["stack"]].peer:
    return None
  return mine["median_ms"] / row["median_ms"]


def flatness(runs, optimizer, stack="tfemb") -> Optional[dict]:
  """Step time at the largest vocabulary / at the smallest, each timed in
  its own process (minutes apart, so the ratio carries the machine's drift;
  see `paired_flatness`)."""
  rows = sorted((r for r in runs if r["stack"] == stack and
                 r["optimizer"] == optimizer and ok(r)),
                key=lambda r: r["vocab"])
  if len(rows) < 2:
    return None
  return {"small": rows[0]["vocab"], "large": rows[-1]["vocab"],
          "small_ms": rows[0]["median_ms"], "large_ms": rows[-1]["median_ms"],
          "ratio": rows[-1]["median_ms"] / rows[0]["median_ms"]}


def paired_flatness(run, optimizer, stack="tfemb") -> Optional[dict]:
  """The same ratio timed side by side in one process (flatness.py): the
  number item 2's target (<= 1.3) is judged on when the run has it."""
  for row in run.get("flatness", []):
    if row["stack"] == stack and row["optimizer"] == optimizer and ok(row):
      return row
  return None


def memory_model(runs, optimizer, stack="tfemb") -> List[dict]:
  """Peak RSS against tables + slots + a fixed overhead (target <= 1.25).

  The overhead is what the smallest vocabulary's run used beyond its
  tables and slots (interpreter, TensorFlow, batches, the model).
  """
  rows = sorted((r for r in runs if r["stack"] == stack and
                 r["optimizer"] == optimizer and ok(r) and r["peak_rss"]),
                key=lambda r: r["vocab"])
  if not rows:
    return []
  overhead = rows[0]["peak_rss"] - rows[0]["table_and_slot_bytes"]
  return [{"vocab": r["vocab"], "peak_rss": r["peak_rss"],
           "tables": r["table_and_slot_bytes"], "overhead": overhead,
           "ratio": r["peak_rss"] / (r["table_and_slot_bytes"] + overhead)}
          for r in rows]


def traffic_bound(runs, bandwidth, optimizer, vocab) -> Optional[dict]:
  """The embedding part of a tfemb step against bytes moved / bandwidth.

  Bytes are the gathered activations, their gradients and the touched rows
  of tables and slots (`Workload.traffic_bytes_per_step`); `rows_ratio` is
  the same against the touched rows alone (the previous, stricter model).
  The target is judged on sequential copy bandwidth, as docs/performance.md says; for
  context, `random_ratio` charges the touched rows at the measured rate of
  random 128-byte row gathers instead (the activations and gradients stay
  at copy bandwidth): the floor this machine sets for random rows.
  """
  row = index(runs).get(("tfemb-emb", optimizer, vocab))
  if not ok(row) or not bandwidth:
    return None
  traffic = row["traffic_bytes_per_step"]
  if not isinstance(traffic, dict):  # a results.json of an earlier run
    traffic = {"rows": traffic, "total": traffic}
  per_ms = bandwidth["copy_gbps"] * 1e9 / 1e3
  bound_ms = traffic["total"] / per_ms
  out = {"bytes": traffic["total"], "bound_ms": bound_ms,
         "measured_ms": row["median_ms"], "ratio": row["median_ms"] / bound_ms,
         "rows_bytes": traffic["rows"],
         "rows_ratio": row["median_ms"] / (traffic["rows"] / per_ms)}
  if bandwidth.get("row_gather_gbps"):
    random_ms = (traffic["rows"] / (bandwidth["row_gather_gbps"] * 1e6) +
                 (traffic["total"] - traffic["rows"]) / per_ms)
    out.update(random_gbps=bandwidth["row_gather_gbps"],
               random_bound_ms=random_ms,
               random_ratio=row["median_ms"] / random_ms)
  return out


def floor(run, optimizer) -> Optional[Dict[int, float]]:
  """The rows alone in C++ (benchmarks/floor.py): {rows per table: ms}."""
  for row in (run.get("floor") or {}).get("floors", []):
    if row["optimizer"] == optimizer and row["status"] == "ok":
      return {int(size): ms for size, ms in row["ms"].items()}
  return None


def targets(run) -> List[Tuple[str, str, Optional[bool]]]:
  """Issue 6 items 2-3: (target, what was measured, met or None)."""
  runs, out = run["runs"], []
  sizes = sorted({r["vocab"] for r in runs})
  optimizers = [o for o in ("sgd", "adagrad", "adam")
                if any(r["optimizer"] == o for r in runs)]
  table = index(runs)
  for opt in optimizers:
    f, paired = flatness(runs, opt), paired_flatness(run, opt)
    if paired:
      measured = (f"{paired['large']:,} / {paired['small']:,} rows, side by "
                  f"side: {paired['large_ms']:.2f} / {paired['small_ms']:.2f}"
                  f" ms = {paired['ratio']:.2f}x" +
                  (f" (separate processes: {f['ratio']:.2f}x)" if f else ""))
    elif f:
      measured = (f"{f['large']:,} / {f['small']:,} rows, separate "
                  f"processes: {f['ratio']:.2f}x")
    else:
      measured = "not measured"
    judged = paired or f
    rows_alone = floor(run, opt)
    if judged and rows_alone and {judged["small"], judged["large"]} <= set(
        rows_alone):
      grow = rows_alone[judged["large"]] - rows_alone[judged["small"]]
      measured += (f"; the rows alone in C++ grow by {grow:+.2f} ms, 1.3x "
                   f"allows {0.3 * judged['small_ms']:+.2f} ms")
    met = judged["ratio"] <= 1.3 if judged else None
    out.append((f"{opt}: tfemb step time flat in the vocabulary (<= 1.3x)",
                measured, met))
    for m in memory_model(runs, opt)[-1:]:
      out.append((f"{opt}: tfemb peak RSS <= 1.25 x (tables + slots + "
                  "overhead)", f"{m['vocab']:,} rows: "
                  f"{m['peak_rss'] / procmem.GIB:.2f} GiB vs "
                  f"{m['tables'] / procmem.GIB:.2f} + "
                  f"{m['overhead'] / procmem.GIB:.2f} GiB: {m['ratio']:.2f}x",
                  m["ratio"] <= 1.25))
  largest = sizes[-1] if sizes else None
  for opt in ("adagrad", "adam"):
    mine, keras = (table.get((s, opt, largest)) for s in ("tfemb", "keras3"))
    if ok(mine) and keras:
      speedup = (keras["median_ms"] / mine["median_ms"] if ok(keras)
                 else None)
      out.append((f"{opt} at {largest:,} rows: >= 10x faster than Keras 3",
                  f"{speedup:.1f}x" if speedup else f"Keras 3: "
                  f"{keras['status']}", speedup >= 10 if speedup else True))
  for opt in optimizers:
    rows_alone = floor(run, opt) or {}
    for size in sizes:
      mine, peer = table.get(("tfemb", opt, size)), fastest_peer(runs, opt,
                                                                size)
      if ok(mine) and peer:
        speedup = peer["median_ms"] / mine["median_ms"]
        out.append((f"{opt} at {size:,} rows: >= 1.5x faster than the "
                    "fastest peer", f"{speedup:.2f}x vs {peer['stack']}",
                    speedup >= 1.5))
      b = traffic_bound(runs, run.get("bandwidth"), opt, size)
      if b:
        out.append((f"{opt} at {size:,} rows: embedding part <= 3x the "
                    "memory-traffic bound",
                    f"{b['measured_ms']:.2f} ms vs {b['bound_ms']:.3f} ms "
                    f"({b['bytes'] / 1e6:.1f} MB): {b['ratio']:.1f}x "
                    f"(touched rows alone, {b['rows_bytes'] / 1e6:.1f} MB: "
                    f"{b['rows_ratio']:.1f}x)" + (
                        f"; for context, the rows at the random-row rate "
                        f"({b['random_gbps']:.1f} GB/s): "
                        f"{b['random_bound_ms']:.3f} ms, "
                        f"{b['random_ratio']:.1f}x" if "random_ratio" in b
                        else "") + (
                        f"; the rows alone in C++: {rows_alone[size]:.3f} "
                        f"ms, {rows_alone[size] / b['bound_ms']:.1f}x"
                        if size in rows_alone else ""),
                    b["ratio"] <= 3))
  return out
