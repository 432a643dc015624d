"""Rendering: a phase's text, profile queries, plots, Perfetto traces and data-flow graphs.
Imports pricing, simulation, counting, devices, costs, trace and the leaves; never stats or counter.
"""
