"""Generation: config-only counting, derived decode steps and layers (their figures by name:
figures.py), speculative decoding.
Imports counter, models, quant, report, trace and the leaves.
"""
