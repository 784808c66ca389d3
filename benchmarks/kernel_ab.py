"""Two builds of tfemb's kernels timed side by side in one process.

    python -m benchmarks.kernel_ab --base HEAD~1 --optimizer sgd --vocab 5000000
    python -m benchmarks.kernel_ab --base 90a2bc6 --optimizer adam --vocab 100000

A kernel change worth 5-10% of the embedding step is smaller than what this
shared host's neighbours do to the same step from one minute to the next
(benchmarks/README.md), so processes timed one after another cannot show
it. This compiles `tfemb/kernels/` as of git revision `--base` under other
op names (`TfembBase...`, namespace `tfemb_base`), loads it beside the
working tree's kernels and times the suite's embedding step with either on
the same tables, in alternating blocks (base then current, then current
then base, ...): the machine's minutes fall on both alike.

The step is the one of `benchmarks.layout --order lookups-first` (the
training order): per batch of the workload, the 8 tables' lookups
(`DedupGather`), then their row-gradient sums and updates, with a fixed
stand-in gradient, tables in tfemb's default layout (the slots beside the
parameters). Before timing, both builds run one call on copies of the same
small random tables: activations and tables must agree (to 1e-6; whether
bit for bit is printed), or the tool stops.

Prints the median ms per step of each build and current / base; `--out`
writes them as JSON.
"""

import argparse
import hashlib
import json
import os
import re
import subprocess
import time

import numpy as np

from benchmarks import workload as workload_lib
from benchmarks.stacks import REPO

KERNEL_DIR = "tfemb/kernels"
FILES = ("embedding_kernels.cc", "column_split.cc", "column_split.h")
PREFIX = "TfembBase"


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--base", default="HEAD",
                 help="git revision whose kernels to compare with")
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


def _git_show(revision: str, name: str) -> str:
  path = f"{KERNEL_DIR}/{name}"
  done = subprocess.run(["git", "-C", REPO, "show", f"{revision}:{path}"],
                        capture_output=True, text=True, check=False)
  if done.returncode != 0:
    raise SystemExit(f"--base {revision}: no {path} there "
                     f"({done.stderr.strip()})")
  return done.stdout


def build_base(revision: str) -> str:
  """Compiles the renamed kernels of `revision` (cached); returns the .so."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tfemb.kernels import build  # pylint: disable=g-import-not-at-top

  sources = {name: rename(_git_show(revision, name)) for name in FILES}
  flags = build.CXXFLAGS + tf.sysconfig.get_compile_flags()
  key = hashlib.sha256()
  for name in FILES:
    key.update(sources[name].encode())
  key.update(tf.__version__.encode())
  key.update(" ".join(flags).encode())
  where = os.path.join(build.cache_dir(), f"base-{key.hexdigest()[:16]}")
  library = os.path.join(where, "tfemb_base_kernels.so")
  if os.path.exists(library):
    return library
  os.makedirs(where, exist_ok=True)
  for name, text in sources.items():
    with open(os.path.join(where, name), "w") as f:
      f.write(text)
  compiler = os.environ.get("CXX", "c++")
  partial = f"{library}.{os.getpid()}.tmp"  # another process may build too
  command = ([compiler] + flags +
             [os.path.join(where, n) for n in FILES if n.endswith(".cc")] +
             ["-o", partial] + tf.sysconfig.get_link_flags())
  done = subprocess.run(command, capture_output=True, text=True, check=False)
  if done.returncode != 0:
    raise SystemExit("compiling the base kernels failed:\n" +
                     done.stderr[-2000:])
  os.replace(partial, library)
  return library


class Kernels:
  """The three kernels of a step from one build, with the workload's attrs."""

  def __init__(self, library, prefix: str, work, opt, row_width: int):
    from tfemb.kernels import ops  # pylint: disable=g-import-not-at-top

    self._gather = getattr(library, f"{prefix}_dedup_gather")
    self._sums = getattr(library, f"{prefix}_row_gradients")
    self._apply = getattr(library, f"{prefix}_apply_rows")
    self._work = work
    self._row_width = row_width
    rule, self._constants = ops.constants(opt)
    self._rule = rule

  def gather(self, variable, ids, name):
    return self._gather(
        table=variable.handle, ids=[ids], vocabulary_size=self._work.vocab,
        dim=self._work.dim, feature_names=[name], table_name=name,
        row_width=self._row_width)

  def update(self, variable, unique, positions, grads, lr, name):
    sums, _ = self._sums(gradients=grads, positions=positions,
                         unique_ids=unique, table_name=name,
                         raise_non_finite=True)
    self._apply(
        parameters=variable.handle, slots=[], ids=unique, gradients=sums,
        learning_rate=lr, table_name=name, rule=self._rule,
        hyperparameters=self._constants, clip_gradient=[-np.inf, np.inf],
        clip_weight=[-np.inf, np.inf], weight_decay_factor=0.0,
        multiply_weight_decay_by_lr=False, interleaved=True)


def make_steps(kernels, variables, batches, names, lr, check=False):
  """A `tf.function`: every batch's lookups, then its sums and updates.

  Returns one activation of each lookup, or with `check` the sum of all of
  them (for comparing two builds; an extra read of each batch's rows).
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  @tf.function
  def steps():
    total = tf.constant(0.0)
    for ids, grads in batches:
      looked_up = []
      for variable, i, name in zip(variables, ids, names):
        unique, positions, rows = kernels.gather(variable, i, name)
        total += tf.reduce_sum(rows) if check else rows[0, 0]
        looked_up.append((unique, positions))
      with tf.control_dependencies([total]):  # every lookup of the batch
        for variable, (unique, positions), g, name in zip(
            variables, looked_up, grads, names):
          kernels.update(variable, unique, positions, g, lr, name)
    return total

  return steps


def _setup(vocab, optimizer, random_tables):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from benchmarks.stacks import tfemb_common  # pylint: disable=g-import-not-at-top

  work = workload_lib.Workload(vocab=vocab, optimizer=optimizer)
  opt = tfemb_common.optimizer(work)
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
  return work, opt, width, start, batches


def check_same_numbers(base, current, optimizer) -> bool:
  """One call of each build on copies of the same small random tables.

  Raises SystemExit if they disagree beyond 1e-6; returns whether they
  agree bit for bit.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  work, opt, width, start, batches = _setup(1000, optimizer, True)
  lr = tf.constant(work.learning_rate)
  results = []
  for library, prefix in ((base, "tfemb_base"), (current, "tfemb")):
    variables = [tf.Variable(s) for s in start]
    kernels = Kernels(library, prefix, work, opt, width)
    total = make_steps(kernels, variables, batches, work.names, lr,
                       check=True)()
    results.append([total.numpy()] + [v.numpy() for v in variables])
  same = all(np.array_equal(a, b) for a, b in zip(*results))
  for a, b in zip(*results):
    if not np.allclose(a, b, rtol=1e-6, atol=1e-7):
      raise SystemExit("the two builds give different numbers: max "
                       f"difference {np.max(np.abs(a - b)):.3g}")
  return same


def compare(args) -> dict:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tfemb.kernels import build  # pylint: disable=g-import-not-at-top

  current = build.load()
  base = tf.load_op_library(build_base(args.base))
  identical = check_same_numbers(base, current, args.optimizer)

  work, opt, width, start, batches = _setup(args.vocab, args.optimizer,
                                            False)
  variables = [tf.Variable(s) for s in start]
  del start
  lr = tf.constant(work.learning_rate)
  steps = {
      "base": make_steps(Kernels(base, "tfemb_base", work, opt, width),
                         variables, batches, work.names, lr),
      "current": make_steps(Kernels(current, "tfemb", work, opt, width),
                            variables, batches, work.names, lr),
  }
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
  return {"base": args.base, "optimizer": args.optimizer,
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
