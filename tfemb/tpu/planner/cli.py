"""The plan's command line: `python -m tfemb.tpu MODULE:ATTR ...`
(`python -m tfemb.tpu sparsecore ...`: `tfemb.sparsecore.report_command`).

MODULE is a module name (importable from the current directory) or a `.py`
file; ATTR names a nested structure of `FeatureConfig`s, a pair
`(feature_config, optimizer)`, or a function of no arguments returning
either. Prints `tfemb.tpu.plan`'s report; `--proto-out FILE` also writes
the `TPUEmbeddingConfiguration` proto as text. Bad input is one line on
stderr and exit status 2 (`tfemb.tpu.planner.command_line`; `--debug`: the
traceback).
"""

import re
import sys
from typing import Optional, Sequence

from google.protobuf import text_format

from tfemb.tpu.planner import command_line
from tfemb.tpu.planner import memory

_TARGET = "MODULE:ATTR"


def _parser() -> command_line.Parser:
  parser = command_line.Parser(
      prog="python -m tfemb.tpu",
      description="What a TPU embedding configuration needs on a TPU "
      "(TensorFlow's TPUEmbedding, embedding hardware V1): bytes per table, "
      "host and chip, and the TPUEmbeddingConfiguration proto.")
  count = command_line.positive_int
  parser.add_argument("target", metavar=_TARGET, type=command_line.target,
                      help="feature config, (feature config, optimizer), or "
                      "a function of no arguments returning one")
  parser.add_argument("--num-replicas", type=count, required=True)
  parser.add_argument("--per-replica-batch-size", type=count,
                      help="needed unless every feature has an output_shape")
  parser.add_argument("--num-hosts", type=count, default=1)
  parser.add_argument("--chips-per-host", type=count,
                      help="default: one TensorCore per chip")
  parser.add_argument("--num-cores-per-replica", type=count)
  parser.add_argument("--pipeline-execution-with-tensor-core",
                      action="store_true")
  parser.add_argument("--proto-out", metavar="FILE",
                      help="write the TPUEmbeddingConfiguration as text")
  return parser


_FLAGS = re.compile(r"\b(num_replicas|per_replica_batch_size|num_hosts|"
                    r"chips_per_host|num_cores_per_replica)\b(=?)")


def _error(e: Exception) -> command_line.UsageError:
  """`plan`'s error: about the topology, in the command's flags
  (`num_hosts=3` as `--num-hosts 3`); else about the configuration."""
  reason, flags = _FLAGS.subn(
      lambda m: "--" + m.group(1).replace("_", "-") + " " * len(m.group(2)),
      str(e))
  return command_line.UsageError(None if flags else _TARGET, reason)


def _plan(args) -> int:
  if args.proto_out:
    command_line.check_writable("--proto-out", args.proto_out)
  feature_config, optimizer = command_line.configuration(_TARGET,
                                                         args.target)
  try:
    result = memory.plan(
        feature_config, optimizer, args.num_replicas,
        args.per_replica_batch_size, num_hosts=args.num_hosts,
        chips_per_host=args.chips_per_host,
        num_cores_per_replica=args.num_cores_per_replica,
        pipeline_execution_with_tensor_core=(
            args.pipeline_execution_with_tensor_core))
  except (ValueError, TypeError) as e:
    raise _error(e) from e
  if args.proto_out:
    command_line.write_whole("--proto-out", args.proto_out,
                             text_format.MessageToString(result.proto))
  print(result)
  if args.proto_out:
    print(f"\nTPUEmbeddingConfiguration written to {args.proto_out}")
  return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  if argv[:1] == ["sparsecore"]:  # the SparseCore's id limits
    from tfemb.sparsecore import report_command  # pylint: disable=g-import-not-at-top
    return report_command.main(argv[1:])
  return command_line.run(_parser(), argv, _plan)
