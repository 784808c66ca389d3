"""Keras layers: `TPUEmbedding`, `PartialTPUEmbedding` and the Keras
optimizer translation."""

from tfemb.layers.embedding_layer import TPUEmbedding
from tfemb.layers.partial import PartialTPUEmbedding
from tfemb.layers.keras_optimizers import KerasLearningRate
from tfemb.layers.keras_optimizers import translate_keras_optimizer

__all__ = ["TPUEmbedding", "PartialTPUEmbedding", "KerasLearningRate",
           "translate_keras_optimizer"]
