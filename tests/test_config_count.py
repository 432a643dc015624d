"""count_config: any transformers causal-LM config (object, config.json, folder), a preset or
ModelArgs, counted with no weights; llm-profiler's profile query on it; the `perfcounter
count` / `perfcounter profile` commands and `generate.py --config ... --hf`."""
import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from perfcounter import count_config  # noqa: E402
from perfcounter.cli.main import main as cli  # noqa: E402
from perfcounter.generation.config_only import hf_greedy_generate  # noqa: E402
from perfcounter.counter import TransformerPerformanceCounter  # noqa: E402
from perfcounter.models.loading import CheckpointError  # noqa: E402
from perfcounter.models.args import UnknownModelError  # noqa: E402
from perfcounter.pricing.predict import phase_program, predict  # noqa: E402
from perfcounter.report.profile import ATTRS, format_profile  # noqa: E402
from perfcounter.trace import KINDS  # noqa: E402

F32 = torch.float32
W, KV, ACT = 0, 1, 2
# hidden 32, 4 heads of 8, 2 kv heads (kv dim 16), mlp 64, 2 layers, vocab 100
LLAMA = dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
             pad_token_id=0, bos_token_id=1, eos_token_id=2)
MIXTRAL = dict(LLAMA, num_local_experts=8, num_experts_per_tok=2)


def sizes(**kw):
    return dict(dict(batch_size=2, prompt_length=5, new_tokens=3, dtype=F32), **kw)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_llama")
    transformers.LlamaConfig(**LLAMA).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def llama_counter(llama_dir):
    return count_config(llama_dir, **sizes())


def test_a_config_counts_what_real_weights_count(llama_counter):
    counter = llama_counter
    assert set(counter.counts) == {"prefill", "decode"}
    assert (counter.counts["prefill"].steps, counter.counts["decode"].steps) == (1, 2)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA)).eval()
    real = TransformerPerformanceCounter()
    hf_greedy_generate(model, torch.randint(3, 100, (2, 5)), 3, phase=real.count)
    for label in ("prefill", "decode"):
        fake, ran = counter.counts[label], real.counts[label]
        assert fake.uncounted_ops == {}
        assert (fake.total_flops, fake.executed_flops) == (ran.total_flops, ran.executed_flops)
        assert fake.trace.per_op_read == ran.trace.per_op_read, label
        assert fake.trace.per_op_written == ran.trace.per_op_written, label


def test_config_object_file_folder_and_dict_agree(llama_dir, llama_counter):
    flops = llama_counter.counts["prefill"].total_flops
    for config in (transformers.LlamaConfig(**LLAMA), llama_dir / "config.json", str(llama_dir),
                   dict(LLAMA, model_type="llama")):
        assert count_config(config, **sizes(new_tokens=1)).counts["prefill"].total_flops == flops
    # one new token: prefill only
    assert set(count_config(llama_dir, **sizes(new_tokens=1)).counts) == {"prefill"}


def test_presets_and_model_args_run_our_model_or_transformers(tmp_path):
    from conftest import tiny_args
    args = tiny_args()
    ours = count_config(args, **sizes())
    assert ours.counts["decode"].trace.records[0].module.split(".")[0] == "Transformer"
    theirs = count_config(args, hf=True, **sizes())
    modules = {r.module.split(".")[0] for r in theirs.counts["prefill"].trace.records if r.module}
    assert modules == {"LlamaForCausalLM"}
    (tmp_path / "config.json").write_text(json.dumps({"dim": 32, "n_layer": 2, "n_head": 4,
                                                      "vocab_size": 64, "intermediate_size": 48,
                                                      "n_local_heads": 2, "block_size": 64}))
    from_file = count_config(tmp_path, **sizes())
    assert from_file.counts["prefill"].total_flops == ours.counts["prefill"].total_flops


def test_bad_configs_are_named(tmp_path):
    with pytest.raises(CheckpointError, match="no such config file"):
        count_config(tmp_path / "missing" / "config.json")
    with pytest.raises(CheckpointError, match="a folder without config.json"):
        count_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not readable JSON"):
        count_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "no-such-arch"}))
    with pytest.raises(CheckpointError, match="model_type 'no-such-arch' is not a transformers"):
        count_config(tmp_path)
    with pytest.raises(UnknownModelError, match="unknown model 'llama-2-7'; did you mean"):
        count_config("llama-2-7")
    with pytest.raises(ValueError, match="must be >= 1, got 1, 0, 4"):
        count_config("llama-2-7b", prompt_length=0)
    with pytest.raises(ValueError, match="cache='paged'"):
        count_config(dict(LLAMA, model_type="llama"), cache="paged", **sizes())
    with pytest.raises(ValueError, match="expert_load must be non-negative"):
        count_config(dict(LLAMA, model_type="llama"), expert_load="1,-1", **sizes())


def test_static_cache_reads_its_buffer_whole():
    counter = count_config(dict(LLAMA, model_type="llama"), cache="static", **sizes())
    decode = counter.counts["decode"]
    assert decode.uncounted_ops == {}
    # the static buffer holds 5 + 3 = 8 positions; attention reads all of them, of which
    # 6 then 7 hold keys and values
    assert 0 < decode.kv_cache_valid_read < decode.trace.per_op_read[KV]


# --- MoE with no weights ---------------------------------------------------------------


def _grouped_weight_reads(stats) -> int:
    return sum(r.read[W] for r in stats.trace.records if r.op.startswith("aten._grouped_mm"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.slow  # over ~5 s here, all its cases: python -m pytest -m 'not slow' skips it
def test_moe_counts_on_the_default_experts_path_in_every_dtype(dtype):
    config = transformers.MixtralConfig(**MIXTRAL)
    counter = count_config(config, **sizes(dtype=dtype))
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(config).eval()  # float32, real routing
    real = TransformerPerformanceCounter()
    hf_greedy_generate(model, torch.randint(3, 100, (2, 5)), 3, phase=real.count)
    for label in ("prefill", "decode"):
        stats = counter.counts[label]
        assert stats.uncounted_ops == {}
        assert any(r.op.startswith("aten._grouped_mm") for r in stats.trace.records)
        assert stats.total_flops == real.counts[label].total_flops  # FLOPs ignore routing


def test_expert_load_decides_which_expert_weights_are_read():
    # 8 experts, top-2, hidden 32, intermediate 64; float32. Per layer the grouped matmuls
    # read gate_up [E, 128, 32] and down [E, 32, 64]: 2 * 4096 * 4 = 32 KiB per expert
    per_expert = (128 * 32 + 32 * 64) * 4
    config = dict(MIXTRAL, model_type="mixtral")
    one_row = sizes(batch_size=1, prompt_length=4, new_tokens=2)  # prefill 4 x 2 = 8 rows
    balanced = count_config(config, **one_row)
    assert str(balanced.mode.expert_load) == "balanced"
    # balanced: 8 rows over 8 experts, all hit; decode: 2 rows, 2 experts; 2 layers
    assert _grouped_weight_reads(balanced.counts["prefill"]) == 2 * 8 * per_expert
    assert _grouped_weight_reads(balanced.counts["decode"]) == 2 * 2 * per_expert
    skewed = count_config(config, expert_load="1,1,0,0,0,0,0,0", **one_row)
    # rows split 4, 4, 0, ...: 2 experts hit in prefill, the FLOPs unchanged
    assert _grouped_weight_reads(skewed.counts["prefill"]) == 2 * 2 * per_expert
    assert skewed.counts["prefill"].total_flops == balanced.counts["prefill"].total_flops
    with pytest.raises(ValueError, match="expert_load has 3 weights, but this layer routes over 8"):
        count_config(config, expert_load="1,1,1", **one_row)


def test_eager_experts_are_counted_on_the_default_path():
    config = transformers.MixtralConfig(**MIXTRAL, experts_implementation="eager")
    eager = count_config(config, **sizes())
    default = count_config(transformers.MixtralConfig(**MIXTRAL), **sizes())
    assert eager.counts["prefill"].total_flops == default.counts["prefill"].total_flops


# --- llm-profiler's query ----------------------------------------------------------------


def test_profile_by_hand(llama_counter):
    stats = llama_counter.counts["prefill"]
    t = 2 * 5  # tokens
    # k_proj: [10, 32] x [32, 16]: 10 * 32 * 16 = 5120 MACs
    k_proj = "model.layers.1.self_attn.k_proj"
    assert stats.profile(k_proj, "FLOPS") == 2 * 5120
    assert stats.profile(k_proj, "mult") == stats.profile(k_proj, "ADD") == 5120
    assert stats.profile(k_proj, "PARAMS") == 32 * 16
    assert stats.profile(k_proj, "ACT") == t * 16 * 4  # its output, float32
    # attention params per layer: q, o 32 x 32, k, v 32 x 16 = 3072; two layers
    assert stats.profile("attn", "PARAMS") == 2 * 3072
    # mlp params per layer: gate, up 32 x 64, down 64 x 32 = 6144
    assert stats.profile("mlp", "PARAMS") == 2 * 6144
    assert stats.profile("model.layers.*.mlp", "PARAMS") == 2 * 6144  # a glob
    # a decoder layer: attention, mlp and two norms of 32
    assert stats.profile("LlamaDecoderLayer", "PARAMS") == 2 * (3072 + 6144 + 64)
    # perfcounter's FLOPS: every kind (llm-profiler's are ADD + MULT)
    assert stats.profile() == stats.profile("transformer", "FLOPS") == sum(
        stats.profile("transformer", kind) for kind in KINDS)
    # the transformer scope leaves the head out (llm-profiler's): 2 * 10 * 32 * 100
    assert stats.profile("lm_head", "FLOPS") == 2 * t * 32 * 100
    assert stats.profile("Linear", "FLOPS") > stats.profile("mlp", "FLOPS")
    text = format_profile(stats, "attn", ATTRS)
    assert text.startswith("attn with input batchsize 2 and sequence length 5 (prefill):")
    assert "    MULT:" in text and "    CACHE:" in text


def test_profile_cache_is_kv_traffic(llama_counter):
    decode = llama_counter.counts["decode"]
    # decode reads the cache (and concatenates onto it)
    trace = decode.trace
    assert decode.profile("attn", "CACHE") == trace.per_op_read[KV] + trace.per_op_written[KV] > 0


def test_profile_refuses_unknown_scopes_and_attrs(llama_counter):
    stats = llama_counter.counts["prefill"]
    with pytest.raises(ValueError, match="scope 'LlamaDecoderLayr' matches no module.*"
                                         "did you mean 'LlamaDecoderLayer'"):
        stats.profile("LlamaDecoderLayr")
    with pytest.raises(ValueError, match="unknown attr 'MACS'; valid: FLOPS"):
        stats.profile("attn", "MACS")


# --- the command line and generate.py --------------------------------------------------------


def test_cli_count_and_profile(llama_dir, capsys, tmp_path):
    common = ["--config", str(llama_dir), "--prompt_length", "5", "--new_tokens", "2",
              "--precision", "float32"]
    assert cli(argv=["count", *common, "--save_path", str(tmp_path / "c.json")]) == 0
    out = capsys.readouterr().out
    assert "counted with no weights" in out and "MoE routing balanced" in out and "prefill:" in out
    saved = TransformerPerformanceCounter.from_json(tmp_path / "c.json")
    assert set(saved.counts) == {"prefill", "decode"}
    assert cli(argv=["profile", *common, "--scope", "attn", "--attr", "mult", "--attr", "params",
                     "--phase", "prefill"]) == 0
    out = capsys.readouterr().out
    assert "attn with input batchsize 1 and sequence length 5 (prefill):" in out
    assert "    PARAMS:   6144" in out
    assert cli(argv=["profile", "--counts", str(tmp_path / "c.json"), "--scope", "attn",
                     "--attr", "params", "--phase", "prefill"]) == 0
    assert "    PARAMS:   6144" in capsys.readouterr().out  # the saved count keeps its modules
    assert cli(argv=["profile", "--scope", "attn"]) == 2
    assert "give the model to count, --model, or a saved count" in capsys.readouterr().err
    assert cli(argv=["count", "--config", "llama-2-7x"]) == 2
    assert "did you mean llama-2-7b" in capsys.readouterr().err


def test_generate_counts_a_transformers_config(llama_dir):
    import generate as gen
    result = gen.main(config=llama_dir, hf=True, prompt_length=5, max_new_tokens=3, quiet=True,
                      device_spec="h100-sxm", precision="float32")
    counter = result["counter"]
    assert result["config_only"] and set(counter.counts) == {"prefill", "decode"}
    assert counter.counts["prefill"].uncounted_ops == {}


def test_count_predicts_the_execution_asked(llama_dir, capsys):
    """`count --execution compiled` prices its prediction as compiled; the JSON says which,
    and its figure is predict()'s for that regime; op-bench times eager ops and refuses it."""
    common = ["--model", str(llama_dir), "--prompt_length", "5", "--max_new_tokens", "2",
              "--precision", "float32", "--device_spec", "h100-sxm", "--json"]
    docs = {}
    for execution in ("eager", "compiled", "cudagraphs"):
        assert cli(argv=["count", *common, "--execution", execution]) == 0
        docs[execution] = json.loads(capsys.readouterr().out)
    counter = count_config(llama_dir, **sizes(batch_size=1, new_tokens=2),
                           device_spec="h100-sxm")
    for execution, doc in docs.items():
        assert doc["prefill"]["execution"] == execution
        # a prefill asked "cudagraphs" is priced compiled, and its prediction says so; a
        # compiled prefill as a program compiled for any prompt length (phase_program)
        regime, spec = phase_program(counter.device_spec, execution, "prefill")
        assert regime == ("compiled" if execution == "cudagraphs" else execution)
        assert doc["prefill"]["prediction"]["execution"] == regime
        expected = predict(counter.counts["prefill"].trace, spec, regime)
        assert doc["prefill"]["predicted_latency_s"] == pytest.approx(expected.latency_s)
    # on a GPU, a tiny model's eager step is its launches: CUDA graphs predict far less
    assert docs["cudagraphs"]["decode"]["predicted_latency_s"] \
        < docs["eager"]["decode"]["predicted_latency_s"] / 2
    assert cli(argv=["op-bench", "--model", str(llama_dir), "--compile"]) == 2
    assert "prices eager runs only" in capsys.readouterr().err


def test_count_names_a_prefill_compiled_for_any_prompt_length(llama_dir, capsys):
    """On a GPU a compiled prefill is priced as a program compiled for any prompt length
    (predict.phase_program), and its prediction line says so; the decode step's does not."""
    assert cli(argv=["count", "--model", str(llama_dir), "--prompt_length", "5",
                     "--max_new_tokens", "2", "--device_spec", "h100-sxm",
                     "--execution", "cudagraphs"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "Latency: " in ln
             and "overhead" in ln]
    assert "(compiled for any prompt length: overhead" in lines[0]  # the prefill
    assert "(cudagraphs: overhead" in lines[1]  # the decode steps
