"""`python -m tfemb.tpu sparsecore`: the SparseCore's id limits for an
input pipeline, before renting a TPU (docs/sparsecore.md, "Id limits").

    python -m tfemb.tpu sparsecore --config my_model:features \
        --data my_model:batches --chips 4 [--batches 100] \
        [--sparse-core-config my_model:sc_config] [--json out.json]

`--config` names a feature config, a pair `(feature_config, optimizer)` or
a function of no arguments returning one (as the plan's command line
takes); `--data` a function of no arguments returning an iterable (a
`tf.data.Dataset`, a list) of one chip's batches: feature structures, or
`(features, labels)` pairs. Prints per stacked table the largest ids and
distinct ids one partition got, the ids the given config drops (or the
batches it fails), the tables' and slots' memory per chip, and a suggested
`SparseCoreEmbeddingConfig`.
"""

import argparse
import itertools
import json
import sys
from typing import Any, Optional, Sequence

from tensorflow.python.util import nest  # pylint: disable=g-direct-tensorflow-import

from tfemb.sparsecore import stats
from tfemb.tpu import cli as plan_cli


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="python -m tfemb.tpu sparsecore",
      description="The SparseCore's id limits (TPUEmbeddingV2) for an input "
      "pipeline, counted as a TPU counts them.")
  parser.add_argument("--config", required=True, metavar="MODULE:ATTR",
                      help="feature config, (feature config, optimizer), or "
                      "a function of no arguments returning one")
  parser.add_argument("--data", required=True, metavar="MODULE:FN",
                      help="a function of no arguments returning one chip's "
                      "batches")
  parser.add_argument("--chips", type=int, required=True,
                      help="TPU chips (the replicas of a TPUStrategy)")
  parser.add_argument("--sc-per-chip", type=int, default=4)
  parser.add_argument("--batches", type=int, default=100,
                      help="batches to scan (default 100)")
  parser.add_argument("--sparse-core-config", metavar="MODULE:ATTR",
                      help="a SparseCoreEmbeddingConfig to check (default: "
                      "TensorFlow's defaults)")
  parser.add_argument("--json", metavar="FILE",
                      help="also write the report as JSON ('-': stdout only)")
  return parser


def _features(config_structure, batch) -> Any:
  """A batch's features: the batch, or the first of a (features, labels)
  pair."""
  try:
    nest.assert_same_structure(config_structure, batch)
    return batch
  except (ValueError, TypeError):
    if isinstance(batch, (tuple, list)) and batch:
      return batch[0]
    return batch


def main(argv: Optional[Sequence[str]] = None) -> int:
  args = _parser().parse_args(argv)
  if args.batches <= 0:
    raise SystemExit("--batches must be positive.")
  feature_config, optimizer = plan_cli.load(args.config)
  data = plan_cli.load(args.data)[0]
  sc_config = (plan_cli.load(args.sparse_core_config)[0]
               if args.sparse_core_config else None)
  batches = (_features(feature_config, b)
             for b in itertools.islice(iter(data), args.batches))
  try:
    result = stats.report(batches, feature_config, args.chips,
                          args.sc_per_chip, optimizer, sc_config)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  if args.json == "-":
    print(json.dumps(result, indent=2))
    return 0
  print(stats.format_report(result))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(result, f, indent=2)
    print(f"\nJSON written to {args.json}")
  return 0
