"""The host TPU: a Cloud TPU type emulated on the CPU (docs/tpu.md, "TPU
programs on the CPU"), under `tfemb.patch(tpu=TYPE)`.

* `tpu_types.py`: the types, their replicas, topology and embedding
  hardware;
* `devices.py`: the CPU split into the type's replicas;
* `system.py`: the TPU system a program sets up (resolver, its Cloud TPU
  client, `initialize_tpu_system`);
* `strategy.py`: `HostTPUStrategy`, a `tf.distribute.TPUStrategy` on the
  logical CPU devices;
* `routes.py`: TensorFlow's objects routed here, by the object;
* `tf_internals.py`: TensorFlow's private names all of these use.
"""
