"""Serving: everything tfemb does for inference and SavedModels.

* `for_serving`: `TPUEmbeddingForServing` and `serving_embedding_lookup`,
  TensorFlow's own, given tfemb's configs.
* `export`: `export_for_serving` and what every SavedModel of an engine
  looks ids up with (TensorFlow's ops only), the inference tables
  (`ServingTable`) and when a lookup is traced for a SavedModel (`saving`).
* `stacked`: a host `TPUEmbeddingV2`'s stacked tables in a SavedModel.
* `savedmodel`: what an engine's object graph holds in a SavedModel (the
  storage of interleaved tables, a stacked engine's own table variables).
* `keras_export`: how Keras' `model.export` (an `ExportArchive`) is
  recognised: a hook on the archive's `add_endpoint` and `write_out`,
  installed when `tfemb.layers` is imported (docs/serving.md).

The engines reach this package only through `savedmodel`, and the Keras
layer's lookup only when `export.saving()` is true.
"""

from tfemb.serving.for_serving import TPUEmbeddingForServing
from tfemb.serving.for_serving import serving_embedding_lookup
from tfemb.serving.export import export_for_serving

__all__ = ["TPUEmbeddingForServing", "serving_embedding_lookup",
           "export_for_serving"]
