"""A TPU VM program's runtime settings under the host TPU (tfemb/tpu_vm.py):
the TPU runtime's library is set aside only where a TPU is emulated, and
`import libtpu` finds a stand-in only where libtpu is not installed.
(tests/tpu/test_host_tpu_programs.py runs a whole TPU VM program.)"""

import importlib
import os
import sys

import pytest

from tfemb import tpu_vm

LIBTPU = "/usr/lib/python3/site-packages/libtpu/libtpu.so"


@pytest.mark.parametrize("argv,tpu_variable,path,kept", [
    (["python", "-m", "tfemb.run", "--tpu", "v5p-8", "x.py"], "", LIBTPU,
     False),
    (["python", "-u", "-X", "dev", "-m", "tfemb.run", "--tpu=v6e-8", "x.py"],
     "", "/lib/libtpu.so", False),
    (["python", "x.py"], "v5p-8", "/lib/libtpu.so", False),
    # No TPU emulated: TensorFlow's own behaviour.
    (["python", "-m", "tfemb.run", "x.py"], "", LIBTPU, True),
    (["python", "x.py", "-m", "tfemb.run", "--tpu"], "", LIBTPU, True),
    # Another pluggable device's library is never touched.
    (["python", "-m", "tfemb.run", "--tpu", "v5p-8", "x.py"], "",
     "/opt/plugins/libmy_device.so", True),
])
def test_the_tpu_runtimes_library_is_set_aside_only_under_a_host_tpu(
    monkeypatch, argv, tpu_variable, path, kept):
  monkeypatch.setenv("TFEMB_TPU", tpu_variable)
  monkeypatch.setenv(tpu_vm.LIBRARY_PATH, path)
  tpu_vm.prepare(argv)
  assert (tpu_vm.LIBRARY_PATH in os.environ) == kept


def test_import_libtpu_gives_the_stand_in_only_where_it_is_missing(
    monkeypatch):
  monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
  monkeypatch.delitem(sys.modules, "libtpu", raising=False)
  with pytest.raises(ImportError):
    importlib.import_module("libtpu")
  tpu_vm.provide_libtpu()
  tpu_vm.provide_libtpu()  # twice: one finder
  assert sys.meta_path.count(tpu_vm._STAND_IN) == 1  # pylint: disable=protected-access
  libtpu = importlib.import_module("libtpu")
  assert libtpu.get_library_path() == ""
  assert libtpu.configure_library_path() is None
  assert "stand-in" in libtpu.__doc__
