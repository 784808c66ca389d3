"""The suites: whose tests, which files of their tree, on which TPU type.

A suite's files are paths relative to its project's source tree: a
TensorFlow checkout (or the files of one under the same paths) and a
keras-rs checkout at the release tfemb installs (setup.cfg).
"""

import dataclasses
import glob
import os
from typing import Dict, List, Tuple


@dataclasses.dataclass(frozen=True)
class Suite:
  """One run: the tests of `project` matching `patterns`, on `tpu`."""
  name: str
  project: str  # "tensorflow" or "keras-rs"
  tpu: str  # a tfemb.tpu.host.tpu_types name
  patterns: Tuple[str, ...]
  exclude: Tuple[str, ...] = ()  # test modules the others import
  environment: Tuple[Tuple[str, str], ...] = ()
  what: str = ""

  def files(self, tree: str) -> List[str]:
    found = []
    for pattern in self.patterns:
      found += sorted(glob.glob(os.path.join(tree, pattern)))
    return [f for f in found if os.path.basename(f) not in self.exclude]


_TPU_TESTS = "tensorflow/python/tpu/tests"
_SPARSECORE_TESTS = ("tensorflow/python/tpu/tpu_embedding_v3_test.py",
                     "tensorflow/python/tpu/tpu_embedding_v3_additional_test.py",
                     "tensorflow/python/tpu/tpu_embedding_v3_checkpoint_test.py")
# keras-rs looks for a TPU where TPU_NAME is set, with the TensorFlow
# backend.
_KERAS_RS_ON_TPU = (("TPU_NAME", "local"), ("KERAS_BACKEND", "tensorflow"),
                    ("TF_USE_LEGACY_KERAS", "0"))

SUITES: Dict[str, Suite] = {s.name: s for s in (
    Suite("tensorflow-v2", "tensorflow", "v3-8",
          (f"{_TPU_TESTS}/tpu_embedding_v2_*_test.py",),
          exclude=("tpu_embedding_v2_correctness_base_test.py",),
          what="TPUEmbedding (embedding hardware V1)"),
    Suite("tensorflow-v1", "tensorflow", "v5litepod-8",
          (f"{_TPU_TESTS}/tpu_embedding_v1_*_test.py",),
          what="TPUEmbeddingV0 (no embedding hardware)"),
    Suite("tensorflow-v3", "tensorflow", "v5p-8", _SPARSECORE_TESTS,
          what="TPUEmbeddingV2 (SparseCore)"),
    # The same on one chip: several of them hand a replica's batch to
    # TensorFlow's serving class, which takes one replica's only.
    Suite("tensorflow-v3-one-chip", "tensorflow", "v6e-1", _SPARSECORE_TESTS,
          what="TPUEmbeddingV2 (SparseCore), one chip"),
    Suite("tensorflow-initialization", "tensorflow", "v3-8",
          (f"{_TPU_TESTS}/tpu_initialization_test.py",),
          what="the TPU system's initialization"),
    Suite("keras-rs", "keras-rs", "v5p-8",
          ("keras_rs/src/layers/embedding/distributed_embedding_test.py",
           "keras_rs/src/layers/embedding/tensorflow/"
           "config_conversion_test.py"),
          environment=_KERAS_RS_ON_TPU,
          what="keras-rs' DistributedEmbedding, its TensorFlow tests"),
)}
