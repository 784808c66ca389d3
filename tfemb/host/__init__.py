"""The host engine: TensorFlow's TPU embedding engine, computed on CPU and
GPU (see `tfemb.host.engine`)."""

from tfemb.host.engine import HostEmbedding
