"""A `TPUEmbeddingV2` host step with a `SparseCoreEmbeddingConfig` beside
the same step without one: the cost of counting the id limits in the step.

    python -m benchmarks.sparsecore_limits
    python -m benchmarks.sparsecore_limits --rounds 31 --out limits.json

The suite's workload with 4 tables (dim 32, batch 4096 of Zipf ids, 100k
rows each, all stacked into one by `TPUEmbeddingV2`), Adagrad, the
embedding part of a step (`embedding(features)` then `apply_gradients`,
`TFEMB_STEPS_PER_CALL` steps per `tf.function` call, 32 by default, as the
suite's `tfemb-emb-v2` stack). Built once without a config and once per
config, in one process, and timed in alternating rounds (the order turns
each round, so a drift of the host falls on every one); each round gives
each config's ratio to the step without one, and the result is the median
over the rounds, with the quartiles and the extremes. The configs:

* `ids`: the largest counts of the batches x 1.25 (rounded up to 8, as
  `python -m tfemb.tpu sparsecore` suggests) for `max_ids_per_table`, and
  the same for `max_unique_ids_per_table`: no cell's ids can exceed its
  distinct-id limit, so the distinct ids are never counted (TensorFlow's
  defaults are equal too);
* `suggested`: the suggested config as it is, with a smaller
  `max_unique_ids_per_table`: the cells over it count their distinct ids
  in every step (an insert per id into a set in the fused kernels'
  `TfembIdCounts`, a `tf.unique` per table without them);
* `dropping`: `ids` with `allow_id_dropping`, nothing dropped (the
  features' static sizes cannot fill the buffer: nothing changes);
* `drops`: `dropping` with `max_ids_per_chip_per_sample=1`, a buffer of
  one id per sample, which the padding of the partitions' runs overfills:
  every step drops a few ids (the dense features' lookups then carry their
  samples, and the step finds the ids past the buffer).
"""

import argparse
import json

import numpy as np

from benchmarks import timing
from benchmarks import workload as workload_lib

CONFIGS = ("ids", "suggested", "dropping", "drops")


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--vocab", type=int, default=100_000)
  p.add_argument("--features", type=int, default=4)
  p.add_argument("--optimizer", default="adagrad",
                 choices=workload_lib.OPTIMIZERS)
  p.add_argument("--configs", default=",".join(CONFIGS),
                 help=f"comma-separated, of {', '.join(CONFIGS)}")
  p.add_argument("--rounds", type=int, default=21)
  p.add_argument("--calls", type=int, default=15,
                 help="timed calls of each per round")
  p.add_argument("--out", help="write the rounds and the ratios as JSON")
  return p.parse_args(argv)


def sparse_core_configs(work, names):
  """`{name: SparseCoreEmbeddingConfig}` from the report of the workload's
  batches (one chip)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tfemb  # pylint: disable=g-import-not-at-top
  from benchmarks.stacks import tfemb_common  # pylint: disable=g-import-not-at-top
  from tfemb.sparsecore import pipeline_report  # pylint: disable=g-import-not-at-top
  features = _features(work)
  report = pipeline_report.report(
      [{n: tf.constant(ids) for n, ids in batch.items()}
       for batch, _ in work.make_batches()], features, 1,
      optimizer=tfemb_common.optimizer(work))
  suggested = report["suggested_config"]
  ids = suggested["max_ids_per_table"]
  configs = {
      "ids": dict(max_ids_per_table=ids, max_unique_ids_per_table=ids),
      "suggested": dict(
          max_ids_per_table=ids,
          max_unique_ids_per_table=suggested["max_unique_ids_per_table"]),
      "dropping": dict(max_ids_per_table=ids, max_unique_ids_per_table=ids,
                       allow_id_dropping=True),
      "drops": dict(max_ids_per_table=ids, max_unique_ids_per_table=ids,
                    allow_id_dropping=True, max_ids_per_chip_per_sample=1)}
  return {n: tfemb.SparseCoreEmbeddingConfig(**configs[n]) for n in names}


def _features(work):
  import tfemb  # pylint: disable=g-import-not-at-top
  from benchmarks.stacks import tfemb_common  # pylint: disable=g-import-not-at-top
  return {n: tfemb.FeatureConfig(f.table, output_shape=[work.batch], name=n)
          for n, f in tfemb_common.feature_config(work).items()}


def build(work, config):
  """The traced embedding step of the workload (`tfemb_engine_v2`'s),
  under `config` (None: without one)."""
  import tfemb  # pylint: disable=g-import-not-at-top
  from benchmarks.stacks import tfemb_common  # pylint: disable=g-import-not-at-top
  embedding = tfemb.TPUEmbeddingV2(_features(work),
                                   tfemb_common.optimizer(work),
                                   sparse_core_embedding_config=config)

  def one_step(batch, gradients):
    activations, preserved = embedding(batch)
    embedding.apply_gradients(gradients, preserved)
    return activations

  per_call = tfemb_common.steps_per_call()
  return (tfemb_common.embedding_steps(work, per_call, one_step), per_call,
          embedding)


def run(args) -> dict:
  from benchmarks.stacks import tfemb_common  # pylint: disable=g-import-not-at-top
  work = workload_lib.Workload(vocab=args.vocab, optimizer=args.optimizer,
                               features=args.features)
  names = [n for n in args.configs.split(",") if n]
  unknown = sorted(set(names) - set(CONFIGS))
  if unknown:
    raise SystemExit(f"--configs: unknown {unknown}; expected {CONFIGS}")
  configs = {"none": None, **sparse_core_configs(work, names)}
  tensors = timing.to_tensors(work.make_batches())
  built = {}
  for name, config in configs.items():
    step, per_call, embedding = build(work, config)
    timing.time_steps(step, tensors, 10)  # trace and warm up
    built[name] = (step, per_call)
    dropped = sum(embedding.dropped_ids.values()) if config else 0
    if bool(dropped) != (name == "drops"):
      raise SystemExit(f"config {name!r} dropped {dropped} ids")
  rounds = []
  order = list(built)
  for r in range(args.rounds):
    medians = {}
    for name in (order if r % 2 == 0 else order[::-1]):
      step, per_call = built[name]
      times = timing.time_steps(step, tensors, args.calls, start=r)
      medians[name] = float(np.median(times)) * 1e3 / per_call
    rounds.append(medians)
    print(f"round {r + 1}: " + ", ".join(
        f"{n} {m:.3f} ms" + ("" if n == "none" else
                             f" ({m / medians['none']:.3f})")
        for n, m in medians.items()), flush=True)
  ratios = {}
  for name in names:
    each = [m[name] / m["none"] for m in rounds]
    ratios[name] = {
        "ratio": float(np.median(each)),
        "quartiles": [float(np.quantile(each, q)) for q in (.25, .75)],
        "range": [float(min(each)), float(max(each))],
        "ms": float(np.median([m[name] for m in rounds]))}
  without = float(np.median([m["none"] for m in rounds]))
  print(f"{args.features} tables x {args.vocab:,} rows, batch "
        f"{work.batch}, {args.optimizer}, "
        f"{tfemb_common.steps_per_call()} steps per call: without a "
        f"SparseCoreEmbeddingConfig {without:.3f} ms per step")
  for name, r in ratios.items():
    print(f"  {name}: {r['ms']:.3f} ms, with / without = {r['ratio']:.3f} "
          f"(median of {len(rounds)} rounds; quartiles "
          f"{r['quartiles'][0]:.3f}-{r['quartiles'][1]:.3f}, range "
          f"{r['range'][0]:.3f}-{r['range'][1]:.3f})")
  return {"workload": vars(args), "steps_per_call":
          tfemb_common.steps_per_call(), "without_ms": without,
          "rounds": rounds, "ratios": ratios}


def main(argv=None):
  args = parse_args(argv)
  result = run(args)
  if args.out:
    with open(args.out, "w") as f:
      json.dump(result, f, indent=1)


if __name__ == "__main__":
  main()
