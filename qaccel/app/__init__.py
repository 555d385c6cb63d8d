"""The application: the ``qaccel`` command line (:mod:`.cli`), the demo, the benchmarks against
ONNX Runtime and of the RTL simulation, and the MatMulNBits simulation report."""
