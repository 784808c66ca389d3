"""The plan's command line: `python -m tfemb.tpu MODULE:ATTR ...`
(`python -m tfemb.tpu sparsecore ...`: `tfemb.sparsecore.cli`).

MODULE is a module name (importable from the current directory) or a `.py`
file; ATTR names a nested structure of `FeatureConfig`s, a pair
`(feature_config, optimizer)`, or a function of no arguments returning
either. Prints `tfemb.tpu.plan`'s report; `--proto-out FILE` also writes
the `TPUEmbeddingConfiguration` proto as text.
"""

import argparse
import importlib
import importlib.util
import os
import sys
from typing import Any, Optional, Sequence, Tuple

from google.protobuf import text_format

from tfemb import optimizers
from tfemb.tpu import planning


def _module(name: str):
  if name.endswith(".py"):
    spec = importlib.util.spec_from_file_location(
        os.path.splitext(os.path.basename(name))[0], name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
  if os.getcwd() not in sys.path:
    sys.path.insert(0, os.getcwd())
  return importlib.import_module(name)


def load(target: str) -> Tuple[Any, Optional[Any]]:
  """`(feature_config, optimizer)` from `MODULE:ATTR`."""
  module_name, sep, attr = target.rpartition(":")
  if not sep or not module_name or not attr:
    raise ValueError(f"Expected MODULE:ATTR (e.g. my_model:features), got "
                     f"{target!r}.")
  obj = getattr(_module(module_name), attr)
  if callable(obj):
    obj = obj()
  if (isinstance(obj, tuple) and len(obj) == 2 and
      (obj[1] is None or optimizers.is_optimizer(obj[1]))):
    return obj
  return obj, None


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="python -m tfemb.tpu",
      description="What a TPU embedding configuration needs on a TPU "
      "(TensorFlow's TPUEmbedding, embedding hardware V1): bytes per table, "
      "host and chip, and the TPUEmbeddingConfiguration proto.")
  parser.add_argument("target", metavar="MODULE:ATTR",
                      help="feature config, (feature config, optimizer), or "
                      "a function of no arguments returning one")
  parser.add_argument("--num-replicas", type=int, required=True)
  parser.add_argument("--per-replica-batch-size", type=int)
  parser.add_argument("--num-hosts", type=int, default=1)
  parser.add_argument("--chips-per-host", type=int,
                      help="default: one TensorCore per chip")
  parser.add_argument("--num-cores-per-replica", type=int)
  parser.add_argument("--pipeline-execution-with-tensor-core",
                      action="store_true")
  parser.add_argument("--proto-out", metavar="FILE",
                      help="write the TPUEmbeddingConfiguration as text")
  return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  if argv[:1] == ["sparsecore"]:  # the SparseCore's id limits
    from tfemb.sparsecore import cli as sparsecore_cli  # pylint: disable=g-import-not-at-top
    return sparsecore_cli.main(argv[1:])
  args = _parser().parse_args(argv)
  feature_config, optimizer = load(args.target)
  result = planning.plan(
      feature_config, optimizer, args.num_replicas,
      args.per_replica_batch_size, num_hosts=args.num_hosts,
      chips_per_host=args.chips_per_host,
      num_cores_per_replica=args.num_cores_per_replica,
      pipeline_execution_with_tensor_core=(
          args.pipeline_execution_with_tensor_core))
  print(result)
  if args.proto_out:
    with open(args.proto_out, "w") as f:
      f.write(text_format.MessageToString(result.proto))
    print(f"\nTPUEmbeddingConfiguration written to {args.proto_out}")
  return 0
