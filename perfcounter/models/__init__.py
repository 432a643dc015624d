"""Models: perfcounter's gpt-fast style Transformer, tokenizers and checkpoint loading (ours, Hugging
Face, GGUF). Imports quant and the leaves.
"""
