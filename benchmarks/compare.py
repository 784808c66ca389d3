"""tfemb against its peers on one workload, each run in its own process.

    python -m benchmarks.compare --quick          # smoke run, tiny tables
    python -m benchmarks.compare                  # 100k, 1M, 5M rows per table
    python -m benchmarks.compare --sizes 100k,1M --optimizers adam
    python -m benchmarks.compare --profile        # where a tfemb step's time goes

Workload (docs/performance.md): 8 features, each with its own table of dim 32, batch
4096, Zipf-distributed ids, a Dense(1) head and a mean squared error; SGD,
Adagrad and Adam. Runs are sequential (never two at once): first the
machine's copy bandwidth, then per size, optimizer and stack one child
process, then per optimizer one child that times tfemb at the smallest and
the largest size side by side (flatness.py), then the same sizes' rows
alone in C++ (floor.py), the floor memory sets, the embedding part on
one thread and on every core at the largest size (threads.py), and per
optimizer and size the embedding part against the traffic bound with the
bandwidth measured between its steps (bound.py). Writes
results.json, results.md and step_time.png to --out and prints the
markdown report.
"""

import argparse
import datetime
import json
import os
import platform
import sys

from benchmarks import analysis
from benchmarks import procmem
from benchmarks import report
from benchmarks import runner
from benchmarks.stacks import BY_NAME, REPO, STACKS
from benchmarks.workload import OPTIMIZERS, format_size, parse_size

QUICK = dict(sizes="1k,10k", steps=6, warmup=2, min_steps=3, max_seconds=20,
             paired_blocks=4, thread_rounds=1, bound_blocks=4)
PAIRED_STACKS = ("tfemb", "tfemb-emb")  # flatness measured side by side


def parse_args(argv=None):
  p = argparse.ArgumentParser(
      description=__doc__.splitlines()[0],
      formatter_class=argparse.RawDescriptionHelpFormatter,
      epilog="\n".join(__doc__.splitlines()[1:]))
  p.add_argument("--sizes", default="100k,1M,5M",
                 help="rows per table, comma separated (100k, 1M, 2500000)")
  p.add_argument("--optimizers", default=",".join(OPTIMIZERS))
  p.add_argument("--stacks", default=",".join(s.name for s in STACKS),
                 help="stacks to run (default all): " +
                 ", ".join(s.name for s in STACKS))
  p.add_argument("--quick", action="store_true",
                 help="smoke run: sizes 1k,10k and a few steps")
  p.add_argument("--steps", type=int, default=30, help="timed steps per run")
  p.add_argument("--warmup", type=int, default=5,
                 help="untimed steps first (the first one traces)")
  p.add_argument("--min-steps", type=int, default=5)
  p.add_argument("--max-seconds", type=float, default=60,
                 help="stop timing a run after this long (>= --min-steps)")
  p.add_argument("--timeout", type=float, default=900,
                 help="seconds before a child is killed")
  p.add_argument("--rss-cap-gb", type=float, default=None,
                 help="kill a child above this RSS (default: available "
                 "memory at the start less 1 GiB)")
  p.add_argument("--out", default=None, help="results folder (default "
                 "benchmarks/results, or /tmp/tfemb_bench_quick with --quick)")
  p.add_argument("--report-only", action="store_true",
                 help="rewrite the report from --out/results.json")
  p.add_argument("--profile", action="store_true",
                 help="profile a few tfemb steps instead (see profile.py)")
  p.add_argument("--no-floor", action="store_true",
                 help="skip the C++ floor (benchmarks/floor.py)")
  p.add_argument("--paired-blocks", type=int, default=24,
                 help="blocks per size of the paired flatness runs "
                 "(flatness.py; 0 skips them)")
  p.add_argument("--thread-rounds", type=int, default=4,
                 help="rounds of the embedding part on one thread and on "
                 "every core at the largest size (threads.py; 0 skips them)")
  p.add_argument("--bound-blocks", type=int, default=24,
                 help="blocks per optimizer and size of the embedding part "
                 "against the traffic bound, the bandwidth measured between "
                 "them (bound.py; 0 skips them)")
  args = p.parse_args(argv)
  if args.quick:
    for k, v in QUICK.items():
      if p.get_default(k) == getattr(args, k):
        setattr(args, k, v)
  args.out = args.out or ("/tmp/tfemb_bench_quick" if args.quick else
                          os.path.join(REPO, "benchmarks", "results"))
  return args


def _machine() -> str:
  cpu = platform.processor() or platform.machine()
  try:
    with open("/proc/cpuinfo") as f:
      cpu = next(l.split(":", 1)[1].strip() for l in f
                 if l.startswith("model name"))
  except (OSError, StopIteration):
    pass
  total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  return f"{os.cpu_count()} cores ({cpu}), {total / procmem.GIB:.1f} GiB"


def _load() -> str:
  return (f"load average {os.getloadavg()[0]:.2f}, "
          f"{(procmem.available() or 0) / procmem.GIB:.1f} GiB available")


def child_args(args, stack, optimizer, vocab):
  return ["--stack", stack, "--optimizer", optimizer, "--vocab", str(vocab),
          "--steps", str(args.steps), "--warmup", str(args.warmup),
          "--min-steps", str(args.min_steps),
          "--max-seconds", str(args.max_seconds)]


def run_suite(args, run, save):
  limits = runner.Limits(timeout_s=args.timeout)
  if args.rss_cap_gb:
    limits.rss_cap = args.rss_cap_gb * procmem.GIB
  else:
    limits.rss_cap = (procmem.available() or limits.rss_cap) - procmem.GIB
  stacks = [BY_NAME[s] for s in args.stacks.split(",")]
  for stack in stacks:
    why = stack.unavailable()
    if why:
      run["meta"]["skipped"].append(f"{stack.label}: {why}")
      print(f"skipping {stack.name}: {why}", flush=True)
  stacks = [s for s in stacks if not s.unavailable()]
  logs = os.path.join(args.out, "logs")
  os.makedirs(logs, exist_ok=True)
  bw = runner.run("benchmarks.bandwidth", [], limits=limits,
                  log_path=os.path.join(logs, "bandwidth.log"))
  run["bandwidth"] = bw.result
  print(f"copy bandwidth: {bw.result and bw.result['copy_gbps']:.1f} GB/s"
        if bw.result else f"bandwidth: {bw.status} {bw.detail}", flush=True)
  failed = {}  # (stack, optimizer) -> size it ran out of memory at
  for vocab in [parse_size(s) for s in args.sizes.split(",")]:
    for opt in args.optimizers.split(","):
      for stack in stacks:
        row = {"stack": stack.name, "optimizer": opt, "vocab": vocab}
        if (stack.name, opt) in failed:
          row.update(status="out of memory", peak_rss=None, detail="skipped:"
                     f" out of memory at {format_size(failed[stack.name, opt])}")
        else:
          name = f"{stack.name}-{opt}-{format_size(vocab)}"
          out = runner.run("benchmarks.child",
                           child_args(args, stack.name, opt, vocab),
                           python=stack.python, env=stack.env, limits=limits,
                           log_path=os.path.join(logs, name + ".log"))
          row.update(out.result or {}, status=out.status, detail=out.detail,
                     peak_rss=out.peak_rss, wall_s=out.wall_s)
          if out.status == "out of memory":
            failed[stack.name, opt] = vocab
        run["runs"].append(row)
        save()
        print(_progress(row), flush=True)
  run_paired(args, run, save, limits, stacks, failed)
  if not args.no_floor:
    run_floor(args, run, save, limits)
  run_threads(args, run, save, limits, failed)
  run_bound(args, run, save, limits, failed)


def run_paired(args, run, save, limits, stacks, failed):
  """Flatness (docs/performance.md, 'Method'): each tfemb stack at the smallest and the
  largest size in one process, alternating (benchmarks/flatness.py)."""
  sizes = sorted(parse_size(s) for s in args.sizes.split(","))
  if args.paired_blocks <= 0 or len(sizes) < 2:
    return
  logs = os.path.join(args.out, "logs")
  run.setdefault("flatness", [])
  for stack in (s for s in stacks if s.name in PAIRED_STACKS):
    for opt in args.optimizers.split(","):
      row = {"stack": stack.name, "optimizer": opt, "small": sizes[0],
             "large": sizes[-1]}
      if (stack.name, opt) in failed:
        row.update(status="out of memory", detail="skipped: out of memory "
                   f"at {format_size(failed[stack.name, opt])}")
      else:
        out = runner.run(
            "benchmarks.flatness",
            ["--stack", stack.name, "--optimizer", opt,
             "--small", str(sizes[0]), "--large", str(sizes[-1]),
             "--blocks", str(args.paired_blocks),
             "--max-seconds", str(2 * args.max_seconds)],
            python=stack.python, env=stack.env, limits=limits,
            log_path=os.path.join(logs, f"flatness-{stack.name}-{opt}.log"))
        row.update(out.result or {}, status=out.status, detail=out.detail)
      run["flatness"].append(row)
      save()
      print(f"flatness {opt:8s} {stack.name:10s} " + (
          f"{row['small_ms']:.2f} -> {row['large_ms']:.2f} ms: "
          f"{row['ratio']:.2f}x" if row["status"] == "ok" else
          f"{row['status']}: {row['detail']}"), flush=True)


def run_floor(args, run, save, limits):
  """The C++ floor at every size (benchmarks/floor.py): the exact step and
  the rows alone, beside the targets memory decides."""
  out = runner.run(
      "benchmarks.floor", ["--optimizers", args.optimizers,
                           "--sizes", args.sizes],
      limits=limits, log_path=os.path.join(args.out, "logs", "floor.log"))
  run["floor"] = out.result or {"status": out.status, "detail": out.detail}
  save()
  for row in (out.result or {}).get("floors", []):
    print(f"floor    {row['optimizer']:8s} " + (
        ", ".join(f"{name} " + " / ".join(
            f"{ms:.3f}" for ms in analysis.floor(run, row["optimizer"],
                                                 kind).values()) + " ms"
                  for kind, name in analysis.FLOOR_KINDS.items())
        if row["status"] == "ok" else row["detail"]), flush=True)
  if not out.result:
    print(f"floor: {out.status}: {out.detail}", flush=True)


def _embedding_part(args, limits, failed, opt, vocab, module, argv, log):
  """The row of one measurement of the embedding part (`tfemb-emb`) at
  `opt` and `vocab`: `module` run with `argv` (logged to logs/`log`.log),
  or skipped where the stack ran out of memory at a smaller size."""
  row = {"stack": "tfemb-emb", "optimizer": opt, "vocab": vocab}
  if ("tfemb-emb", opt) in failed:
    row.update(status="out of memory", detail="skipped: out of memory "
               f"at {format_size(failed['tfemb-emb', opt])}")
    return row
  out = runner.run(
      module, ["--optimizer", opt, "--vocab", str(vocab)] + argv,
      limits=limits, log_path=os.path.join(args.out, "logs", log + ".log"))
  row.update(out.result or {}, status=out.status, detail=out.detail)
  return row


def run_threads(args, run, save, limits, failed):
  """The embedding part (`tfemb-emb`) at the largest size on one thread and
  on every core, per optimizer (benchmarks/threads.py)."""
  if args.thread_rounds <= 0 or "tfemb-emb" not in args.stacks.split(","):
    return
  vocab = max(parse_size(s) for s in args.sizes.split(","))
  run.setdefault("threads", [])
  for opt in args.optimizers.split(","):
    row = _embedding_part(
        args, limits, failed, opt, vocab, "benchmarks.threads",
        ["--rounds", str(args.thread_rounds), "--steps", str(args.steps)],
        f"threads-{opt}")
    run["threads"].append(row)
    save()
    print(f"threads  {opt:8s} " + (
        f"1 thread {row['one_thread_ms']:.2f} ms, every core "
        f"{row['all_cores_ms']:.2f} ms: {row['speedup']:.2f}x"
        if row["status"] == "ok" else f"{row['status']}: {row['detail']}"),
        flush=True)


def run_bound(args, run, save, limits, failed):
  """The embedding part (`tfemb-emb`) against the memory-traffic bound per
  optimizer and size, the copy bandwidth measured between its blocks of
  steps in one process (benchmarks/bound.py)."""
  if args.bound_blocks <= 0 or "tfemb-emb" not in args.stacks.split(","):
    return
  run.setdefault("bound", [])
  for vocab in [parse_size(s) for s in args.sizes.split(",")]:
    for opt in args.optimizers.split(","):
      row = _embedding_part(
          args, limits, failed, opt, vocab, "benchmarks.bound",
          ["--blocks", str(args.bound_blocks),
           "--max-seconds", str(args.max_seconds)],
          f"bound-{opt}-{format_size(vocab)}")
      run["bound"].append(row)
      save()
      print(f"bound    {opt:8s} {format_size(vocab):>5s} " + (
          f"{row['median_ms']:.2f} ms vs {row['bound_ms']:.3f} ms: "
          f"{row['ratio']:.2f}x" if row["status"] == "ok" else
          f"{row['status']}: {row['detail']}"), flush=True)


def _progress(row) -> str:
  what = (f"{row['median_ms']:9.1f} ms  {row['examples_per_s']:>10,.0f} ex/s"
          if row["status"] == "ok" else f"{row['status']}: {row['detail']}")
  rss = f"  peak {row['peak_rss'] / procmem.GIB:5.2f} GiB" if row.get(
      "peak_rss") else ""
  return (f"{row['optimizer']:8s} {format_size(row['vocab']):>5s} "
          f"{row['stack']:10s} {what}{rss}")


def main(argv=None):
  args = parse_args(argv)
  if args.profile:
    from benchmarks import profile  # pylint: disable=g-import-not-at-top
    return profile.run_from_compare(args)
  report.require_plotting()
  os.makedirs(args.out, exist_ok=True)
  path = os.path.join(args.out, "results.json")
  if args.report_only:
    with open(path) as f:
      run = json.load(f)
  else:
    run = {"meta": {
        "command": "python -m benchmarks.compare " + " ".join(
            sys.argv[1:] if argv is None else argv),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime(
            "%Y-%m-%d %H:%M UTC"),
        "machine": _machine(), "skipped": []}, "runs": []}
    start_load = _load()

    def save():
      run["meta"]["load"] = f"at start {start_load}; now {_load()}"
      with open(path, "w") as f:
        json.dump(run, f, indent=1)

    run_suite(args, run, save)
  text = report.markdown(run)
  with open(os.path.join(args.out, "results.md"), "w") as f:
    f.write(text)
  report.plot(run, os.path.join(args.out, "step_time.png"))
  print(text)
  print(f"wrote {args.out}/results.json, results.md, step_time.png")


if __name__ == "__main__":
  main()
