"""Run the accelerator on a board: the host link (:mod:`.protocol`, :mod:`.link`) and the
driver (:class:`~qaccel.board.driver.Board`) that runs quantize_linear, dequantize_linear and
matmul_nbits on the cores ``qaccel bitstream`` puts on it (or on their simulation)."""
