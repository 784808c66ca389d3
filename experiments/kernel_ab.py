"""Two builds of tfemb's kernels timed side by side in one process.

    python -m experiments.kernel_ab --base HEAD~1 --optimizer sgd \
        --vocab 5000000
    python -m experiments.kernel_ab --base 90a2bc6 --optimizer adam \
        --vocab 100000
    python -m experiments.kernel_ab --base HEAD --base-march x86-64 \
        --optimizer adam

A kernel change worth 5-10% of the embedding step is smaller than what this
shared host's neighbours do to the same step from one minute to the next
(docs/performance.md, 'Method'), so processes timed one after another cannot show
it. This compiles `tfemb/kernels/` as of git revision `--base` under other
op names (`TfembBase...`, namespace `tfemb_base`), with the rule table that
revision generates from its optimizers' declarations (where it has one),
loads it beside the working tree's kernels and times the suite's embedding
step with either on the same tables, in alternating blocks (base then
current, then current then base, ...): the machine's minutes fall on both
alike.

The step is `experiments.layout`'s in the training order (`--order
lookups-first`): per batch of the workload, the 8 tables' lookups, then
their row-gradient sums and updates, with a fixed stand-in gradient, tables
in tfemb's default layout (the slots beside the parameters), both builds'
ops called directly (`experiments.kernel_calls`). Before timing, both
builds look up and update copies of the same small random tables: the
lookups' outputs and the tables must agree (to 1e-6; whether bit for bit is
printed), or the tool stops.

Prints the median ms per step of each build and current / base; `--out`
writes them as JSON.
"""

import argparse
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time

import numpy as np

from benchmarks import workload as workload_lib
from experiments import kernel_calls
from experiments import layout
from benchmarks.stacks import REPO

KERNEL_DIR = "tfemb/kernels"
PREFIX = "TfembBase"
# Prints a revision's generated rule table as JSON (file name, text), run in
# a copy of that revision's package.
_RULE_TABLE = """
import json, sys
from tfemb.kernels import rule_table
json.dump([rule_table.FILE_NAME, rule_table.header()], sys.stdout)
"""


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--base", default="HEAD",
                 help="git revision whose kernels to compare with")
  p.add_argument("--base-march", default=None,
                 help="compile the base for this -march (e.g. x86-64, the "
                 "compiler's default) instead of the current build's")
  p.add_argument("--optimizer", default="sgd",
                 choices=workload_lib.OPTIMIZERS)
  p.add_argument("--vocab", type=int, default=1_000_000)
  p.add_argument("--rounds", type=int, default=30,
                 help="blocks per build (alternating)")
  p.add_argument("--calls", type=int, default=5,
                 help="calls of the workload's batches per block")
  p.add_argument("--out", help="write the result as JSON here")
  return p.parse_args(argv)


def rename(source: str) -> str:
  """`source` with its ops and kernels registered as `TfembBase...` and its
  C++ in namespace `tfemb_base`, so that it loads beside tfemb's own."""
  source = re.sub(r'(REGISTER_OP\(|Name\()"Tfemb', r'\1"' + PREFIX, source)
  source = re.sub(r"\bnamespace tfemb\b", "namespace tfemb_base", source)
  return source


def _git(*args, text=True):
  done = subprocess.run(["git", "-C", REPO, *args], capture_output=True,
                        text=text, check=False)
  if done.returncode != 0:
    raise SystemExit(f"git {' '.join(args)}: "
                     f"{done.stderr.strip() if text else done.stderr}")
  return done.stdout


def _generated(revision: str, names):
  """{file: text} of the rule table `revision` generates from its
  optimizers' declarations; none for a revision without one."""
  if "rule_table.py" not in names:
    return {}
  archive = _git("archive", revision, "tfemb", text=False)
  with tempfile.TemporaryDirectory() as where:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
      tar.extractall(where)
    done = subprocess.run(
        [sys.executable, "-c", _RULE_TABLE], cwd=where,
        env=dict(os.environ, PYTHONPATH=where, TF_CPP_MIN_LOG_LEVEL="3"),
        capture_output=True, text=True, timeout=300, check=False)
  if done.returncode != 0:
    raise SystemExit(f"--base {revision}: its rule table failed:\n"
                     f"{done.stderr[-2000:]}")
  name, text = json.loads(done.stdout)
  return {name: text}


def base_sources(revision: str):
  """{file: renamed text}: the C++ of `tfemb/kernels/` at `revision` (in
  `src/` or, at older revisions, beside the Python), and the rule table it
  generates. The sources include each other by file name alone, so they
  compile from one directory."""
  paths = _git("ls-tree", "-r", "--name-only", revision,
               f"{KERNEL_DIR}/").split()
  names = [os.path.basename(p) for p in paths]
  sources = {os.path.basename(p): _git("show", f"{revision}:{p}")
             for p in paths if p.endswith((".cc", ".h"))}
  if not sources:
    raise SystemExit(f"--base {revision}: no C++ in {KERNEL_DIR}")
  sources.update(_generated(revision, names))
  return {n: rename(text) for n, text in sources.items()}


def build_base(revision: str, march=None) -> str:
  """Compiles the renamed kernels of `revision` (cached, with the flags of
  tfemb's own build, as one translation unit as it does); returns the .so.
  For the current options' CPU target, or `-march=<march>` instead."""
  from tfemb import options  # pylint: disable=g-import-not-at-top
  from tfemb.kernels import build  # pylint: disable=g-import-not-at-top

  march = options.get().kernel_march if march is None else march
  sources = base_sources(revision)
  texts = [sources[n] for n in sorted(sources)]
  # The sources are one translation unit (compiler.compile_command), as in
  # tfemb's own build: the two builds then differ in their sources alone.
  # The key says so, so that no build of one unit per source is taken for
  # it.
  key = build.cache_key(["one unit"] + sorted(sources) + texts, march)
  where = os.path.join(build.cache_dir(), f"base-src-{key}")
  for name, text in sources.items():
    build.write_file(os.path.join(where, name), text)
  try:
    return build.compile_library(
        os.path.join(build.cache_dir(), f"tfemb_base_kernels-{key}.so"),
        [os.path.join(where, n) for n in sorted(sources) if n.endswith(".cc")],
        [where], march)
  except build.KernelUnavailable as e:
    raise SystemExit(str(e)) from e


class Renamed:
  """A build of `build_base`, answering to tfemb's op names (`tfemb_x` is
  its `tfemb_base_x`), so that `tfemb.kernels.fused_ops` can call it."""

  def __init__(self, library):
    self._library = library

  def __getattr__(self, name):
    return getattr(self._library, name.replace("tfemb_", "tfemb_base_", 1))


def _setup(vocab, optimizer, random_tables):
  """The workload's tables (configs), their interleaved variables' starting
  values, its batches with stand-in gradients, and the row width."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from benchmarks.stacks import tfemb_common  # pylint: disable=g-import-not-at-top
  import tfemb  # pylint: disable=g-import-not-at-top

  work = workload_lib.Workload(vocab=vocab, optimizer=optimizer)
  tables = [tfemb.TableConfig(vocab, work.dim, name=f"table_{n}",
                              optimizer=tfemb_common.optimizer(work))
            for n in work.names]
  width = (1 + work.slots) * work.dim
  rng = np.random.default_rng(work.seed)
  if random_tables:  # positive, so that Adagrad's and Adam's slots are valid
    start = [rng.uniform(0.1, 1.0, (vocab, width)).astype(np.float32)
             for _ in work.names]
  else:
    start = [tf.zeros([vocab, width]) for _ in work.names]
  batches = [([tf.constant(features[n]) for n in work.names],
              [tf.constant(1e-3 * rng.standard_normal(
                  (work.batch, work.dim), dtype=np.float32))
               for _ in work.names])
             for features, _ in work.make_batches()]
  return work, tables, start, batches, width


def _steps(work, tables, variables, batches, width, library):
  """`experiments.layout`'s embedding step in the training order."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  return layout.make_steps(
      tables, [{"parameters": v} for v in variables], batches, work.names,
      tf.constant(work.learning_rate), width, "lookups-first",
      library=library)


def check_same_numbers(base, current, optimizer) -> bool:
  """Both builds on copies of the same small random tables: every lookup's
  distinct ids, positions and rows, then the tables after one call.

  Raises SystemExit if they disagree beyond 1e-6; returns whether they
  agree bit for bit.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  work, tables, start, batches, width = _setup(1000, optimizer, True)
  results = []
  for library in (base, current):
    variables = [tf.Variable(s) for s in start]
    outputs = [o.numpy() for ids, _ in batches
               for table, v, i, n in zip(tables, variables, ids, work.names)
               for o in kernel_calls.dedup_gather(library, table, v, [i], [n],
                                                  row_width=width)]
    _steps(work, tables, variables, batches, width, library)()
    results.append(outputs + [v.numpy() for v in variables])
  same = all(np.array_equal(a, b) for a, b in zip(*results))
  for a, b in zip(*results):
    if a.shape != b.shape or not np.allclose(a, b, rtol=1e-6, atol=1e-7):
      raise SystemExit("the two builds give different numbers: "
                       + (f"max difference {np.max(np.abs(a - b)):.3g}"
                          if a.shape == b.shape else
                          f"shapes {a.shape} and {b.shape}"))
  return same


def compare(args) -> dict:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  current = kernel_calls.default_library()
  base = Renamed(tf.load_op_library(build_base(args.base, args.base_march)))
  identical = check_same_numbers(base, current, args.optimizer)

  work, tables, start, batches, width = _setup(args.vocab, args.optimizer,
                                               False)
  variables = [tf.Variable(s) for s in start]
  del start
  steps = {name: _steps(work, tables, variables, batches, width, library)
           for name, library in (("base", base), ("current", current))}
  for fn in steps.values():  # trace, back the tables with huge pages
    for _ in range(3):
      fn().numpy()
  times = {k: [] for k in steps}
  for r in range(args.rounds):
    for name in (("base", "current") if r % 2 == 0 else
                 ("current", "base")):
      t0 = time.perf_counter()
      for _ in range(args.calls):
        steps[name]().numpy()
      times[name].append((time.perf_counter() - t0) /
                         (args.calls * len(batches)) * 1e3)
  base_ms, current_ms = (float(np.median(times[k]))
                         for k in ("base", "current"))
  return {"base": args.base, "base_march": args.base_march,
          "optimizer": args.optimizer,
          "vocab": args.vocab, "rounds": args.rounds,
          "identical_numbers": identical, "base_ms": base_ms,
          "current_ms": current_ms, "ratio": current_ms / base_ms}


def main(argv=None):
  args = parse_args(argv)
  result = compare(args)
  print(f"{args.optimizer}, {args.vocab:,} rows per table: base "
        f"({args.base}) {result['base_ms']:.3f} ms per step, current "
        f"{result['current_ms']:.3f} ms, current / base "
        f"{result['ratio']:.3f}; numbers "
        f"{'identical' if result['identical_numbers'] else 'within 1e-6'}")
  if args.out:
    with open(args.out, "w") as f:
      json.dump(result, f, indent=1)


if __name__ == "__main__":
  main()
