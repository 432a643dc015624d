"""Pricing a step or a phase on one device: its figures by record group (figures.py) priced by
one rule, price.price(figures, spec, execution) for every regime (price.REGIMES: bound,
eager, compiled, cudagraphs) and every consumer; the rates it takes (rates.py, achievable.py),
op classes, collectives on a link, the roofline io models, energy and op micro-benchmarks.
Imports devices, counting, costs, trace and the leaves.
"""
