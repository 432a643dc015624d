"""Pricing a trace on one device: the roofline bound, energy, the prediction (execution regimes)
and op micro-benchmarks. Imports devices, counting, costs, trace and the leaves.
"""
