"""tests/workers/tpu_program.py behind a Cloud TPU VM's preamble, as
TensorFlow's TPU guides write one: the TPU runtime's library from the
libtpu package and the runtime's environment variables, set before
TensorFlow is imported. Run by tests/tpu/test_host_tpu_programs.py under
`python -m tfemb.run --tpu TYPE`, with the same variables in its
environment too.
"""

import os

import libtpu

os.environ["PJRT_DEVICE"] = "TPU"
os.environ["NEXT_PLUGGABLE_DEVICE_USE_C_API"] = "true"
os.environ["TF_PLUGGABLE_DEVICE_LIBRARY_PATH"] = libtpu.get_library_path()
os.environ["TF_XLA_FLAGS"] = ("--tf_mlir_enable_mlir_bridge=true "
                              "--tf_xla_sparse_core_disable_table_stacking="
                              "true")

import tensorflow as tf  # pylint: disable=g-import-not-at-top,unused-import,wrong-import-position

import tpu_program  # pylint: disable=g-import-not-at-top,wrong-import-position

if __name__ == "__main__":
  tpu_program.main()
