"""The architectures' implementations, one module each (a subclass of its declaration in
models/specs/architectures), loaded by `base.architecture(name)` where a model is built."""
