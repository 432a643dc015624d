"""Quantization: int8 / int4 / GGUF storage, the quantized-KV attention op and what a tensor is
stored in. A low layer: imports torch and the leaves only, so that costs and counting can use it.
"""
