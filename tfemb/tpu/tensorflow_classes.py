"""TensorFlow's own TPU embedding engine classes, as they were when tfemb
was imported: what the TPU delegate builds under a `TPUStrategy`, even where
`tfemb.patch()` (`tfemb.patching`) has routed the public names to tfemb's."""

import tensorflow as tf
from tensorflow.python.tpu import tpu_embedding_v1  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.tpu import tpu_embedding_v2  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.tpu import tpu_embedding_v3  # pylint: disable=g-direct-tensorflow-import

TENSORFLOW_ENGINES = {
    "TPUEmbedding": tpu_embedding_v2.TPUEmbedding,
    "TPUEmbeddingV2": tpu_embedding_v3.TPUEmbeddingV2,
    "TPUEmbeddingV0": tpu_embedding_v1.TPUEmbeddingV0,
}


def tensorflow_engine(name: str) -> type:
  """TensorFlow's engine class `name` ("TPUEmbedding", "TPUEmbeddingV2",
  "TPUEmbeddingV0") as `tf.tpu.experimental.embedding` has it, or, where
  `tfemb.patch()` routed that name to tfemb, TensorFlow's own."""
  cls = getattr(tf.tpu.experimental.embedding, name)
  if getattr(cls, "__module__", "").startswith("tfemb."):
    return TENSORFLOW_ENGINES[name]
  return cls
