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

import json
from typing import Any, Iterator, Optional, Sequence

from tensorflow.python.util import nest  # pylint: disable=g-direct-tensorflow-import

from tfemb import resolution
from tfemb.sparsecore import pipeline_report
from tfemb.sparsecore_configs import SparseCoreEmbeddingConfig
from tfemb.tpu.planner import command_line


def _parser() -> command_line.Parser:
  parser = command_line.Parser(
      prog="python -m tfemb.tpu sparsecore",
      description="The SparseCore's id limits (TPUEmbeddingV2) for an input "
      "pipeline, counted as a TPU counts them.")
  count = command_line.positive_int
  parser.add_argument("--config", required=True, metavar="MODULE:ATTR",
                      type=command_line.target,
                      help="feature config, (feature config, optimizer), or "
                      "a function of no arguments returning one")
  parser.add_argument("--data", required=True, metavar="MODULE:FN",
                      type=command_line.target,
                      help="a function of no arguments returning one chip's "
                      "batches")
  parser.add_argument("--chips", type=count, required=True,
                      help="TPU chips (the replicas of a TPUStrategy)")
  parser.add_argument("--sc-per-chip", type=count, default=4)
  parser.add_argument("--batches", type=count, default=100,
                      help="batches to scan (default 100)")
  parser.add_argument("--sparse-core-config", metavar="MODULE:ATTR",
                      type=command_line.target,
                      help="a SparseCoreEmbeddingConfig to check (default: "
                      "TensorFlow's defaults)")
  parser.add_argument("--json", metavar="FILE",
                      help="also write the report as JSON ('-': stdout only)")
  return parser


def _paths(structure) -> list:
  return [p for p, _ in nest.flatten_with_joined_string_paths(structure)]


def _features(config_structure, batch, index: int) -> Any:
  """A batch's features: the batch, or the first of a (features, labels)
  pair; refused unless it has the feature config's structure."""
  candidates = [batch]
  if isinstance(batch, (tuple, list)) and batch:
    candidates.append(batch[0])
  for features in candidates:
    try:
      nest.assert_same_structure(config_structure, features)
      return features
    except (ValueError, TypeError):
      pass
  raise command_line.UsageError(
      "--data", f"batch {index} has features {_paths(candidates[-1])}; "
      f"expected the structure of --config: {_paths(config_structure)} "
      "(or a (features, labels) pair)")


def _iterator(data) -> Iterator[Any]:
  try:
    with command_line.iterating("--data", "iterating over it"):
      return iter(data)
  except command_line.UsageError as e:
    if not isinstance(e.__cause__, TypeError):
      raise
  raise command_line.UsageError(
      "--data", "expected batches (an iterable: a tf.data.Dataset, a list, "
      f"a generator), got {type(data).__name__}")


def _batches(batches, config_structure, count: int) -> Iterator[Any]:
  """The first `count` batches' features; the user's errors in reading
  them name --data."""
  end = object()
  for index in range(count):
    with command_line.iterating("--data", f"reading batch {index}"):
      batch = next(batches, end)
    if batch is end:
      return
    yield _features(config_structure, batch, index)


def _config(args):
  """The feature config, optimizer and SparseCore config, checked."""
  feature_config, optimizer = command_line.configuration("--config",
                                                         args.config)
  try:
    resolution.resolve(feature_config, optimizer)
  except (ValueError, TypeError) as e:
    raise command_line.UsageError("--config", str(e)) from e
  sc_config = None
  if args.sparse_core_config:
    sc_config = command_line.attribute("--sparse-core-config",
                                       args.sparse_core_config)
    if not isinstance(sc_config, SparseCoreEmbeddingConfig):
      raise command_line.UsageError(
          "--sparse-core-config", "expected a SparseCoreEmbeddingConfig, "
          f"got {type(sc_config).__name__}")
  return feature_config, optimizer, sc_config


def _report(args) -> int:
  if args.json and args.json != "-":
    command_line.check_writable("--json", args.json)
  feature_config, optimizer, sc_config = _config(args)
  data = _iterator(command_line.attribute("--data", args.data))
  batches = _batches(data, feature_config, args.batches)
  try:
    result = pipeline_report.report(batches, feature_config, args.chips,
                                    args.sc_per_chip, optimizer, sc_config)
  except command_line.UsageError:
    raise
  except ValueError as e:
    raise command_line.UsageError(None, str(e)) from e
  if args.json == "-":
    print(json.dumps(result, indent=2))
    return 0
  if args.json:
    command_line.write_whole("--json", args.json,
                             json.dumps(result, indent=2))
  print(pipeline_report.format_report(result))
  if args.json:
    print(f"\nJSON written to {args.json}")
  return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
  return command_line.run(_parser(), argv, _report)
