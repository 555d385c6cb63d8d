"""Board-level gateware: the UART host link (:class:`~qaccel.rtl.board.host_bridge.HostBridge`)
that lets a PC drive a core's AXI4-Lite and AXI4-Stream ports over a USB-UART."""
