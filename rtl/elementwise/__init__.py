"""The QuantizeLinear, DequantizeLinear and DirectML units: the shared stream unit
(:mod:`.unit`: lanes, scale table, index generator), the Quantize and Dequantize lanes and
units, and their AXI4-Stream top (:mod:`.axis_top`)."""
