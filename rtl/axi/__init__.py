"""AXI4 interfaces of the cores: the register map (:mod:`.regmap`), its AXI4-Lite bank
(:mod:`.axil_registers`) and the cores behind AXI4-Lite and AXI4-Stream (:mod:`.axi_core`)."""
