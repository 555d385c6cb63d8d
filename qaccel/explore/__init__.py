"""Exploration: the performance model (:mod:`.perf`), design-space sweeps (:mod:`.sweep`) and
their plots (:mod:`.plots`)."""
