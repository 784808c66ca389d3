"""Other projects' own tests of TPU programs, run unmodified on tfemb's
host TPU: TensorFlow's TPU embedding tests and keras-rs' TensorFlow tests,
from their source trees outside this repository (conformance/README.md).

`python -m conformance --tensorflow DIR --keras-rs DIR` runs each suite in
a process of its own under `python -m tfemb.run --tpu TYPE -m pytest`, as
on that Cloud TPU type, and prints the pass and fail counts.
"""
