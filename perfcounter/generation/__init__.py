"""Generation: config-only counting, derived decode steps and layers, speculative decoding.
Imports counter, models, quant, report, trace and the leaves.
"""
