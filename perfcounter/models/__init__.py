"""Models: perfcounter's gpt-fast style Transformer, tokenizers and checkpoint loading (ours, Hugging
Face, GGUF); a model's weights as stored (stored_weights.py) and which module paths lie in
which decoder layer (layer_paths.py), answered once; the transformers presets (hf_presets.yaml,
published configs with their sources) and their KV cache layouts (kv_layout.py). Imports quant
and the leaves.
"""
