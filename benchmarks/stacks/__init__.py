"""The stacks the suite compares, as plain data (no TensorFlow import).

Each stack's `build(workload)` lives in its own module of this package and
runs only in a child process (`benchmarks.child`), with the environment and
interpreter given here.
"""

import dataclasses
import os
from typing import Dict, Optional

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
KERASRS_PYTHON = os.path.join(REPO, ".venv-kerasrs", "bin", "python")


@dataclasses.dataclass(frozen=True)
class Stack:
  name: str  # command-line name
  label: str  # what the report shows
  module: str  # benchmarks.stacks.<module>.build
  env: Dict[str, str] = dataclasses.field(default_factory=dict)
  python: Optional[str] = None  # None: the interpreter running the suite
  peer: bool = True  # False: tfemb itself
  full_step: bool = True  # False: the embedding part of a step only

  def unavailable(self) -> Optional[str]:
    """Why this stack cannot run here, or None."""
    if self.python and not os.path.exists(self.python):
      return (f"interpreter {self.python} not found: create it with "
              "`python -m venv .venv-kerasrs && .venv-kerasrs/bin/pip install "
              "keras-rs tensorflow` (see benchmarks/README.md)")
    return None


STACKS = (
    Stack("tfemb", "tfemb Keras layer", "tfemb_layer", peer=False),
    Stack("tfemb-v2", "tfemb Keras layer following the SparseCore "
          "(TPUEmbeddingV2's stacked tables)", "tfemb_layer_v2", peer=False),
    Stack("tfemb-emb", "tfemb engine, embedding part only (mid-level API)",
          "tfemb_engine", peer=False, full_step=False),
    Stack("tfemb-emb-v2", "tfemb TPUEmbeddingV2 (SparseCore, stacked "
          "tables), embedding part only", "tfemb_engine_v2", peer=False,
          full_step=False),
    Stack("keras3", "Keras 3 Embedding + Keras optimizer", "keras3"),
    Stack("tfrs", "tfrs TPUEmbedding on CPU, tf_keras legacy optimizer",
          "tfrs", env={"TF_USE_LEGACY_KERAS": "1"}),
    Stack("serving", "TPUEmbeddingForServing + Keras 3 optimizer loop",
          "serving"),
    Stack("kerasrs", "keras-rs DistributedEmbedding (CPU)", "kerasrs",
          env={"KERAS_BACKEND": "tensorflow"}, python=KERASRS_PYTHON),
)
BY_NAME = {s.name: s for s in STACKS}
