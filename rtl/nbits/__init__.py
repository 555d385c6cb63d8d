"""The MatMulNBits engine v2 (docs/matmul_nbits_v2.md): the engine (:mod:`.matmul_nbits_v2`),
its clusters, packed MAC array, row quantiser, float lanes and its AXI4-Stream top."""
