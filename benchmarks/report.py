"""The run's report: markdown tables and a PNG plot (matplotlib)."""

import importlib
import re
import statistics
from typing import List

from benchmarks import analysis
from benchmarks import procmem
from benchmarks.stacks import BY_NAME, STACKS
from benchmarks.workload import format_size


def _gib(n) -> str:
  return f"{n / procmem.GIB:.2f}" if n else "-"


def runs_table(run) -> List[str]:
  runs = run["runs"]
  lines = ["| optimizer | rows/table | stack | median step (ms) | examples/s "
           "| peak RSS (GiB) | tfemb/peer step time | page faults per step |",
           "|---|---|---|---:|---:|---:|---:|---:|"]
  order = {s.name: i for i, s in enumerate(STACKS)}
  opts = {o: i for i, o in enumerate(("sgd", "adagrad", "adam"))}
  for r in sorted(runs, key=lambda r: (opts[r["optimizer"]], r["vocab"],
                                       order[r["stack"]])):
    if r["status"] == "ok":
      cells = [f"{r['median_ms']:.1f}", f"{r['examples_per_s']:,.0f}"]
    else:
      cells = [f"{r['status']}: {r['detail']}", "-"]
    ratio = analysis.ratio(runs, r)
    faults = r.get("page_faults_per_step")
    cells += [_gib(r.get("peak_rss")), f"{ratio:.3g}" if ratio else "-",
              "-" if faults is None else f"{faults:.0f}"]
    lines.append(f"| {r['optimizer']} | {format_size(r['vocab'])} | "
                 f"{BY_NAME[r['stack']].label} | " + " | ".join(cells) + " |")
  return lines


def summary_table(run) -> List[str]:
  """Stacks x optimizers, step time at each size (as in docs/performance.md)."""
  runs = run["runs"]
  sizes = sorted({r["vocab"] for r in runs})
  opts = [o for o in ("sgd", "adagrad", "adam")
          if any(r["optimizer"] == o for r in runs)]
  table = analysis.index(runs)
  head = " / ".join(format_size(s) for s in sizes)
  lines = ["| stack | " + " | ".join(f"{o} {head} (ms)" for o in opts) + " |",
           "|---|" + "---|" * len(opts)]
  for stack in STACKS:
    if not any(r["stack"] == stack.name for r in runs):
      continue
    cells = []
    for opt in opts:
      vals = []
      for size in sizes:
        r = table.get((stack.name, opt, size))
        vals.append("-" if r is None else f"{r['median_ms']:.1f}"
                    if r["status"] == "ok" else r["status"])
      cells.append(" / ".join(vals))
    lines.append(f"| {stack.label} | " + " | ".join(cells) + " |")
  return lines


def _floor_cell(pair) -> str:
  """A C++ floor's large / small ms and its growth, or "-"."""
  if not pair:
    return "-"
  small, large = pair
  return f"{large:.2f} / {small:.2f} ({large - small:+.2f})"


def flatness_table(run) -> List[str]:
  """The side-by-side runs of flatness.py (item 2), with the ratio of the
  separate runs beside them."""
  rows = run.get("flatness") or []
  if not rows:
    return []
  lines = ["| optimizer | stack | rows/table | median step (ms) | ratio "
           "| per-block ratio p10 / median / p90 | separate processes "
           "| growth the target allows | the exact step in C++ (ms) "
           "| the rows alone in C++ (ms) |",
           "|---|---|---|---|---:|---|---:|---:|---|---|"]
  for r in rows:
    sizes = f"{format_size(r['large'])} / {format_size(r['small'])}"
    separate = analysis.flatness(run["runs"], r["optimizer"], r["stack"])
    sep = f"{separate['ratio']:.2f}x" if separate else "-"
    floors = " | ".join(
        _floor_cell(analysis.floor_pair(run, r["optimizer"], kind,
                                        r["small"], r["large"]))
        for kind in analysis.FLOOR_KINDS)
    if r["status"] != "ok":
      lines.append(f"| {r['optimizer']} | {BY_NAME[r['stack']].label} | "
                   f"{sizes} | {r['status']}: {r['detail']} | - | - | {sep} "
                   f"| - | {floors} |")
      continue
    lines.append(
        f"| {r['optimizer']} | {BY_NAME[r['stack']].label} | {sizes} | "
        f"{r['large_ms']:.2f} / {r['small_ms']:.2f} | {r['ratio']:.2f}x | "
        f"{r['block_ratio_p10']:.2f} / {r['block_ratio_median']:.2f} / "
        f"{r['block_ratio_p90']:.2f} ({r['blocks']} blocks of "
        f"{r['block_steps']} steps) | {sep} | "
        f"{analysis.allowed_growth(r['stack'], r['small_ms']):+.2f} | "
        f"{floors} |")
  return lines


def threads_table(run) -> List[str]:
  """The embedding part on one thread and on every core (threads.py)."""
  rows = run.get("threads") or []
  if not rows:
    return []
  lines = ["| optimizer | stack | rows/table | 1 thread (ms) "
           "| every core (ms) | speedup | the exact step in C++, 1 / 2 "
           "threads (ms) |", "|---|---|---|---:|---:|---:|---|"]
  for r in rows:
    where = (f"| {r['optimizer']} | {BY_NAME[r['stack']].label} | "
             f"{format_size(r['vocab'])} |")
    if r["status"] != "ok":
      lines.append(f"{where} {r['status']}: {r['detail']} | - | - | - |")
      continue
    pair = analysis.floor_speedup(run, r["optimizer"], r["vocab"])
    cpp = "-" if pair is None else (
        f"{pair[0]:.3f} / {pair[1]:.3f} ({pair[0] / pair[1]:.2f}x)")
    lines.append(f"{where} {r['one_thread_ms']:.2f} | "
                 f"{r['all_cores_ms']:.2f} ({r['cores']} cores) | "
                 f"{r['speedup']:.2f}x | {cpp} |")
  return lines


def bound_table(run) -> List[str]:
  """The embedding part against the traffic bound, the copy bandwidth
  measured between its blocks of steps (bound.py)."""
  rows = run.get("bound") or []
  if not rows:
    return []
  lines = ["| optimizer | rows/table | median step (ms) | copy bandwidth "
           "(GB/s) | bound (ms) | ratio | per-block ratio p10 / p90 "
           "| blocks | CPU stolen by the host (ms per step, mean) |",
           "|---|---|---:|---:|---:|---:|---|---:|---:|"]
  for r in rows:
    where = f"| {r['optimizer']} | {format_size(r['vocab'])} |"
    if r["status"] != "ok":
      lines.append(f"{where} {r['status']}: {r['detail']} | - | - | - | - "
                   "| - | - |")
      continue
    stolen = statistics.mean(b["stolen_ms_per_step"] for b in r["blocks"])
    lines.append(f"{where} {r['median_ms']:.2f} | {r['copy_gbps']:.1f} | "
                 f"{r['bound_ms']:.3f} | {r['ratio']:.2f}x | "
                 f"{r['ratio_p10']:.2f} / {r['ratio_p90']:.2f} | "
                 f"{len(r['blocks'])} of {r['block_steps']} steps | "
                 f"{stolen:.3f} |")
  return lines


def floor_lines(run) -> List[str]:
  """How the C++ floor (benchmarks/floor.py) was measured, or why not."""
  floor = run.get("floor")
  if not floor:
    return []
  if floor.get("status", "ok") != "ok":
    return [f"The C++ floor (benchmarks/floor.py): not measured, "
            f"{floor['status']}: {floor.get('detail', '')}"]
  lines = ["The C++ floor (benchmarks/floor.py), no TensorFlow: the 8 "
           "tables of each step on both cores, the slots beside the "
           "parameters, the sizes side by side in one process. The exact "
           "step does the work of tfemb's kernels: the ids deduplicated, "
           "each distinct row read once and every id's activation written, "
           "the ids' gradients summed per row, the rows updated with their "
           "old values kept (all or nothing) and checked finite. The rows "
           "alone: each step's distinct rows looked up, then updated; no "
           "deduplication, activations per id or gradient sums. Median ms "
           "per step:", ""]
  for row in floor["floors"]:
    if row["status"] != "ok":
      lines.append(f"- {row['optimizer']}: {row['status']}: "
                   f"{row.get('detail', '')}")
      continue
    kinds = [(name, analysis.floor(run, row["optimizer"], kind))
             for kind, name in analysis.FLOOR_KINDS.items()]
    lines.append(f"- {row['optimizer']}: " + "; ".join(
        f"{name} " + ", ".join(f"{format_size(size)} {ms:.3f}"
                               for size, ms in by_size.items())
        for name, by_size in kinds if by_size))
  return lines


TARGETS_NOTE = (
    "\"Out of reach here\": plain C++ doing the whole exact step "
    "(benchmarks/floor.py), the work of tfemb's kernels with no TensorFlow "
    "around it, on the same cores, already takes more than the target "
    "allows on this machine: for flatness, its growth from the smallest "
    "size to the largest; for the traffic bound, its time. (A run without "
    "the exact step judges by the rows alone: their growth, and their time "
    "plus the activations and gradients at copy bandwidth.)")


def targets_table(run) -> List[str]:
  lines = ["| target | measured | met |", "|---|---|---|"]
  for target, measured, met in analysis.targets(run):
    mark = {True: "yes", False: "**no**", None: "not measured",
            analysis.OUT_OF_REACH: "**no**: out of reach here"}[met]
    lines.append(f"| {target} | {measured} | {mark} |")
  return lines


def markdown(run) -> str:
  meta, bw = run["meta"], run.get("bandwidth") or {}
  # The command without its output directory (a path of the run, not of
  # the method); the date and the machine's load stay in results.json.
  command = re.sub(r" --out \S+", "", meta["command"].strip())
  out = [f"Command: `{command}`", "", f"Machine: {meta['machine']}", ""]
  if bw:
    out += [f"Copy bandwidth (read + write): {bw['copy_gbps']:.1f} GB/s "
            f"(numpy {bw['numpy_copy_gbps']:.1f}, TensorFlow "
            f"{bw['tf_copy_gbps']:.1f}); random 128-byte row gathers: "
            f"{bw['row_gather_gbps']:.1f} GB/s.", ""]
  for skipped in meta.get("skipped", []):
    out += [f"Skipped: {skipped}", ""]
  out += ["### Step time (median ms) per stack", ""] + summary_table(run)
  out += ["", "### Every run", ""] + runs_table(run)
  paired = flatness_table(run)
  if paired:
    out += ["", "### Flatness, both sizes side by side in one process", ""]
    out += paired
  floor = floor_lines(run)
  if floor:
    out += [""] + floor
  threads = threads_table(run)
  if threads:
    out += ["", "### Threads: the embedding part on one thread and on every "
            "core", ""] + threads
  bound = bound_table(run)
  if bound:
    out += ["", "### The embedding part against the traffic bound, the "
            "bandwidth measured between its steps", ""] + bound
  out += ["", "### Targets", "", TARGETS_NOTE, ""] + targets_table(run)
  return "\n".join(out) + "\n"


def require_plotting():
  """Fails at once, before a run of an hour, if the plot could not be drawn
  at its end."""
  try:
    importlib.import_module("matplotlib")
  except ImportError:
    raise SystemExit(
        "benchmarks.compare draws its plot with matplotlib, which is not "
        "installed in this environment: pip install -e '.[benchmarks]'"
    ) from None


def plot(run, path: str):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  import matplotlib.ticker  # pylint: disable=g-import-not-at-top,unused-import
  runs = [r for r in run["runs"] if r["status"] == "ok"]
  opts = [o for o in ("sgd", "adagrad", "adam")
          if any(r["optimizer"] == o for r in runs)]
  fig, axes = plt.subplots(1, len(opts), figsize=(5 * len(opts), 5),
                           squeeze=False, sharey=True)
  for ax, opt in zip(axes[0], opts):
    for stack in STACKS:
      rows = sorted((r for r in runs if r["stack"] == stack.name and
                     r["optimizer"] == opt), key=lambda r: r["vocab"])
      if rows:
        ax.plot([r["vocab"] for r in rows], [r["median_ms"] for r in rows],
                marker="o", linestyle="-" if stack.full_step else ":",
                label=stack.label)
    ax.set(xscale="log", yscale="log", title=opt,
           xlabel="rows per table (8 tables, dim 32)")
    ax.grid(True, which="both", alpha=0.3)
  axes[0][0].set_ylabel("median step time (ms), batch 4096")
  axes[0][0].yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
  handles, labels = axes[0][0].get_legend_handles_labels()
  fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8)
  fig.tight_layout(rect=(0, 0.14, 1, 1))
  fig.savefig(path, dpi=110)
  plt.close(fig)
