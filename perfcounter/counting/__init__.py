"""Counting: the dispatch mode that sees every aten op, op plans, storage roles, fused IO,
module paths, the linear fast paths and the per-module breakdown. Imports trace, costs, quant
and the leaves.
"""
