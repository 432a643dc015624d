"""Models: perfcounter's gpt-fast style Transformer, tokenizers and checkpoint loading (ours, Hugging
Face, GGUF); a model's weights as stored (stored_weights.py) and which module paths lie in
which decoder layer (layer_paths.py), answered once. Imports quant and the leaves.
"""
