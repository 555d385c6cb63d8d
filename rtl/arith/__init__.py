"""Shared arithmetic of the units: float unpack / round / add / multiply / divide, integer
conversions, saturation, pipeline helpers and ECP5 primitives."""
