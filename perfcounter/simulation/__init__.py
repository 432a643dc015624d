"""Simulation under a placement (UPMEM semantics): mapping, timeline, replay, result, render and
mapping search. Imports pricing, devices, trace and the leaves.
"""
from perfcounter.simulation.run import Simulation, simulate  # noqa: F401
