"""The benchmark suite's targets, from one run's results (no TensorFlow).

A run is a dict: {"meta": ..., "bandwidth": {...}, "runs": [row, ...]};
a row has stack, optimizer, vocab, status, median_ms, peak_rss, ... .
"""

from typing import Dict, List, Optional, Tuple

from benchmarks import floor as floor_cc
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
  number the flatness target (FLAT) is judged on when the run has it."""
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
         "batch_ms": (traffic["total"] - traffic["rows"]) / per_ms,
         "rows_ratio": row["median_ms"] / (traffic["rows"] / per_ms)}
  if bandwidth.get("row_gather_gbps"):
    random_ms = (traffic["rows"] / (bandwidth["row_gather_gbps"] * 1e6) +
                 (traffic["total"] - traffic["rows"]) / per_ms)
    out.update(random_gbps=bandwidth["row_gather_gbps"],
               random_bound_ms=random_ms,
               random_ratio=row["median_ms"] / random_ms)
  return out


def alternated_bound(run, optimizer, vocab) -> Optional[dict]:
  """The embedding part against the bound with the copy bandwidth measured
  between its blocks of steps in one process (bound.py): the ratio the
  traffic-bound target is judged on when the run has it."""
  for row in run.get("bound") or []:
    if (row["optimizer"], row["vocab"]) == (optimizer, vocab) and ok(row):
      return row
  return None


# The C++ floor's kinds (benchmarks/floor.py), the exact step first.
FLOOR_KINDS = {"step": "the exact step", "rows": "the rows alone"}


def floor(run, optimizer, kind="rows") -> Optional[Dict[int, float]]:
  """The C++ floor (benchmarks/floor.py) of one kind, "rows" (the rows
  alone), "step" (the whole exact step), "step1" or "step2" (the exact step
  on one thread or two, in alternating blocks): {rows per table: ms}; None
  where it was not measured (a results.json from before has no exact
  step)."""
  key = floor_cc.KEYS[kind]
  for row in (run.get("floor") or {}).get("floors", []):
    if row["optimizer"] == optimizer and row["status"] == "ok" and key in row:
      return {int(size): ms for size, ms in row[key].items()}
  return None


def floor_pair(run, optimizer, kind, small, large
               ) -> Optional[Tuple[float, float]]:
  """One kind of the C++ floor at `small` and `large` rows (ms), where it
  was measured at both."""
  ms = floor(run, optimizer, kind) or {}
  return (ms[small], ms[large]) if small in ms and large in ms else None


# Targets: memory and the peers; flatness, the traffic bound and both
# cores (docs/performance.md, 'Latest results'). A target that a
# measurement of this machine shows out of reach is judged OUT_OF_REACH,
# not met, with that measurement in its row: the exact step in C++
# (floor.py) does the work tfemb's kernels do with no TensorFlow around it,
# on the same cores (a results.json from before has only the rows alone,
# the least work any implementation must do).
OUT_OF_REACH = "out of reach"
FLAT = {"tfemb": 1.1, "tfemb-emb": 1.15}  # 5M / 100k, side by side
BOUND = 1.5  # embedding part / memory-traffic bound
THREADS = 1.6  # embedding part, every core / one thread


def allowed_growth(stack: str, small_ms: float) -> float:
  """The growth (ms) from the smallest size to the largest that the
  stack's flatness target allows over its small step."""
  return (FLAT[stack] - 1) * small_ms


def _verdict(met: bool, reachable: Optional[bool]):
  if met:
    return True
  return OUT_OF_REACH if reachable is False else False


def _flatness_target(run, opt, stack):
  """The stack's 5M / 100k ratio (side by side when measured, else of
  separate processes); None if the run has neither this stack nor its
  side-by-side row. Out of reach when the exact step in C++ (else the rows
  alone) already grows by more than the ratio allows over the stack's
  small step."""
  f, paired = flatness(run["runs"], opt, stack), paired_flatness(run, opt,
                                                                 stack)
  judged, limit = paired or f, FLAT[stack]
  what = f"{opt}: {BY_NAME[stack].label} flat in the vocabulary (<= {limit}x)"
  if not judged:
    if not any(r["stack"] == stack and r["optimizer"] == opt
               for r in run["runs"]):
      return None
    return what, "not measured", None
  if paired:
    measured = (f"{paired['large']:,} / {paired['small']:,} rows, side by "
                f"side: {paired['large_ms']:.2f} / {paired['small_ms']:.2f}"
                f" ms = {paired['ratio']:.2f}x" +
                (f" (separate processes: {f['ratio']:.2f}x)" if f else ""))
  else:
    measured = (f"{f['large']:,} / {f['small']:,} rows, separate "
                f"processes: {f['ratio']:.2f}x")
  reachable = None
  grows = {}
  for kind in FLOOR_KINDS:
    pair = floor_pair(run, opt, kind, judged["small"], judged["large"])
    if pair:
      grows[kind] = pair[1] - pair[0]
  if grows:
    allows = allowed_growth(stack, judged["small_ms"])
    if "step" in grows:
      measured += f"; the exact step in C++ grows by {grows['step']:+.2f} ms"
      if "rows" in grows:
        measured += f" (the rows alone by {grows['rows']:+.2f} ms)"
    else:
      measured += f"; the rows alone in C++ grow by {grows['rows']:+.2f} ms"
    measured += f", {limit}x allows {allows:+.2f} ms"
    reachable = grows.get("step", grows.get("rows")) <= allows
  return what, measured, _verdict(judged["ratio"] <= limit, reachable)


def _bound_target(run, opt, size):
  """The embedding part against the memory-traffic bound: judged on the
  run with the bandwidth measured between the steps (bound.py) where the
  run has it, else on the stack's own process against the bandwidth
  measured at the start. Out of reach when the exact step in C++ already
  takes more than the target allows (where it was not measured: the rows
  alone in C++, plus the activations and their gradients at copy
  bandwidth)."""
  b = traffic_bound(run["runs"], run.get("bandwidth"), opt, size)
  alt = alternated_bound(run, opt, size)
  if not b and not alt:
    return None
  parts = []
  if alt:
    parts.append(
        f"bandwidth measured between the steps: {alt['median_ms']:.2f} ms "
        f"vs {alt['bound_ms']:.3f} ms ({alt['bytes'] / 1e6:.1f} MB at "
        f"{alt['copy_gbps']:.1f} GB/s): {alt['ratio']:.2f}x (blocks p10 "
        f"{alt['ratio_p10']:.2f}x, p90 {alt['ratio_p90']:.2f}x)")
  if b:
    parts.append(
        f"{'in its own process, ' if alt else ''}{b['measured_ms']:.2f} ms "
        f"vs {b['bound_ms']:.3f} ms ({b['bytes'] / 1e6:.1f} MB): "
        f"{b['ratio']:.1f}x (touched rows alone, "
        f"{b['rows_bytes'] / 1e6:.1f} MB: {b['rows_ratio']:.1f}x)")
    if "random_ratio" in b:
      parts.append(f"for context, the rows at the random-row rate "
                   f"({b['random_gbps']:.1f} GB/s): "
                   f"{b['random_bound_ms']:.3f} ms, {b['random_ratio']:.1f}x")
  bound_ms = b["bound_ms"] if b else alt["bound_ms"]
  reachable = None
  rows_alone, step = floor(run, opt) or {}, floor(run, opt, "step") or {}
  if size in rows_alone and b:
    least = rows_alone[size] + b["batch_ms"]
    parts.append(f"the rows alone in C++: {rows_alone[size]:.3f} ms, "
                 f"{rows_alone[size] / bound_ms:.1f}x, and with the "
                 f"activations and gradients: {least:.3f} ms, "
                 f"{least / bound_ms:.1f}x")
    reachable = least <= BOUND * bound_ms
  if size in step:
    parts.append(f"the exact step in C++: {step[size]:.3f} ms, "
                 f"{step[size] / bound_ms:.1f}x")
    reachable = step[size] <= BOUND * bound_ms
  ratio = alt["ratio"] if alt else b["ratio"]
  return (f"{opt} at {size:,} rows: embedding part <= {BOUND}x the "
          "memory-traffic bound", "; ".join(parts),
          _verdict(ratio <= BOUND, reachable))


def floor_speedup(run, optimizer, size) -> Optional[Tuple[float, float]]:
  """The C++ exact step at `size` rows on one thread and on two (ms), timed
  in alternating blocks in one process, where they were measured."""
  one, two = (floor(run, optimizer, kind) or {}
              for kind in ("step1", "step2"))
  if size in one and size in two:
    return one[size], two[size]
  return None


def _thread_targets(run):
  for r in run.get("threads") or []:
    what = (f"{r['optimizer']} at {r['vocab']:,} rows: embedding part >= "
            f"{THREADS}x faster on every core than on one thread")
    if r["status"] != "ok":
      yield what, f"{r['status']}: {r.get('detail', '')}", None
      continue
    measured = (f"{r['one_thread_ms']:.2f} ms on 1 thread, "
                f"{r['all_cores_ms']:.2f} ms on {r['cores']} cores: "
                f"{r['speedup']:.2f}x")
    reachable = True
    pair = floor_speedup(run, r["optimizer"], r["vocab"])
    if pair is not None:
      one, two = pair
      measured += (f"; the exact step in C++: {one:.3f} ms on 1 thread, "
                   f"{two:.3f} ms on 2: {one / two:.2f}x")
      reachable = one / two >= THREADS
    yield what, measured, _verdict(r["speedup"] >= THREADS, reachable)


def targets(run) -> List[Tuple[str, str, object]]:
  """(target, what was measured, verdict): True met, False not met, None
  not measured, OUT_OF_REACH not met and shown out of reach here."""
  runs, out = run["runs"], []
  sizes = sorted({r["vocab"] for r in runs})
  optimizers = [o for o in ("sgd", "adagrad", "adam")
                if any(r["optimizer"] == o for r in runs)]
  table = index(runs)
  for opt in optimizers:
    out.extend(t for t in (_flatness_target(run, opt, stack)
                           for stack in FLAT) if t)
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
    for size in sizes:
      mine, peer = table.get(("tfemb", opt, size)), fastest_peer(runs, opt,
                                                                size)
      if ok(mine) and peer:
        speedup = peer["median_ms"] / mine["median_ms"]
        out.append((f"{opt} at {size:,} rows: >= 1.5x faster than the "
                    "fastest peer", f"{speedup:.2f}x vs {peer['stack']}",
                    speedup >= 1.5))
      bound = _bound_target(run, opt, size)
      if bound:
        out.append(bound)
  out.extend(_thread_targets(run))
  return out
