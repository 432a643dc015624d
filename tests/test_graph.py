"""perfcounter.report.graph: module and op graphs of one recorded forward (EdgeShard, seed 003),
node and edge counts derived by hand; their exports; `perfcounter graph`."""
import json

import pytest
import torch
from torch import nn

from perfcounter import PerformanceCounterMode, get_device_spec
from perfcounter.cli.main import main
from perfcounter.report.graph import module_graph, op_graph, record_forward
from perfcounter.quant.stored import set_stored_nbytes


class Residual(nn.Module):
    """x + fc2(relu(fc1(norm(x)))): four leaf modules and a residual add in its own code."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(4)
        self.fc1 = nn.Linear(4, 8)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(8, 4)

    def forward(self, x):
        return x + self.fc2(self.act(self.fc1(self.norm(x))))


@pytest.fixture
def toy():
    torch.manual_seed(0)
    return Residual().eval(), torch.randn(2, 4)


def test_toy_module_graph_counts(toy):
    model, x = toy
    g = module_graph(record_forward(model, x), get_device_spec("h100-sxm"))
    # nodes: input, the 4 leaf modules, and Residual[4] (the add after its 4th child call) = 6
    assert [n.id for n in g.nodes] == ["input", "Residual.norm", "Residual.fc1", "Residual.act",
                                       "Residual.fc2", "Residual[4]"]
    # edges: input->norm->fc1->act->fc2->add (5) + the residual input->add (1) = 6
    assert [(e.src, e.dst) for e in g.edges] == [
        ("input", "Residual.norm"), ("Residual.norm", "Residual.fc1"),
        ("Residual.fc1", "Residual.act"), ("Residual.act", "Residual.fc2"),
        ("input", "Residual[4]"), ("Residual.fc2", "Residual[4]")]
    # bytes: x is [2, 4] fp32 = 32 B; fc1's output [2, 8] = 64 B
    assert [e.bytes for e in g.edges] == [32, 32, 64, 64, 32, 32]
    fc1 = g.nodes[2]
    # fc1: addmm [2, 4] x [4, 8] + bias: 2*2*4*8 + 2*8 = 144 FLOPs; params 4*8 + 8 = 40
    assert (fc1.cls, fc1.params, fc1.flops) == ("Linear", 40, 144)
    assert fc1.measured_s is not None  # real tensors: timed
    # fc1 moves x [2, 4] + W [8, 4] + b [8] + out [2, 8] = (8 + 32 + 8 + 16) * 4 = 256 B.
    # roofline: 256 B / 3.35e12 B/s = 76.4 ps (memory bound). predicted (h100-sxm has no
    # op_efficiency / op_overhead_s: predict.py's defaults): 2 rows is a GEMV, DEFAULT_EFFICIENCY
    # 0.8: memory 256 / 2.68e12 = 95.5 ps; compute charged 8 rows (ROW_BLOCK): 144 * 8 / 2 = 576
    # FLOPs / (0.8 * 67e12 fp32) = 10.7 ps; + DEFAULT_OVERHEAD_S cuda eager 8 us, of which a
    # GPU shows what its kernels do not hide: each of the 5 ops keeps 8 us x (1 - W / 40 us),
    # W the 5 ops' work: each a GPU kernel's fixed 2.7 us (DEFAULT_KERNEL_S) + its bytes (each
    # < 300 B at 2.68 TB/s: w < 0.2 ns), W = 13.5 us + w_sum, so fc1 = 8 us - W/5 + 2.7 us +
    # 95.5 ps = 8 us - w_sum/5 + 95.5 ps
    assert fc1.roofline_s == pytest.approx(76.4e-12, abs=0.1e-12)
    assert 8e-6 + 95.5e-12 - 0.2e-9 < fc1.predicted_s < 8e-6 + 95.5e-12
    s = g.stats()
    assert (s["nodes"], s["edges"]) == (6, 6)
    # 5 op calls (layer_norm, addmm, relu, addmm, add), each 8 us of overhead + < 0.1 ns
    assert s["predicted_s"]["total"] == pytest.approx(sum(n.predicted_s or 0 for n in g.nodes))
    assert s["predicted_s"]["total"] == pytest.approx(5 * 8e-6, abs=1e-9)
    assert s["roofline_s"]["total"] == pytest.approx(sum(n.roofline_s or 0 for n in g.nodes))


def test_toy_op_graph_counts(toy):
    model, x = toy
    g = op_graph(record_forward(model, x))
    # aten ops: native_layer_norm, addmm, relu, addmm, add = 5 (t() is a view: no node);
    # edges between ops only (x comes from outside): ln->addmm->relu->addmm->add = 4
    assert [n.cls for n in g.nodes] == ["aten.native_layer_norm.default", "aten.addmm.default",
                                        "aten.relu.default", "aten.addmm.default",
                                        "aten.add.Tensor"]
    assert [(e.src, e.dst) for e in g.edges] == [("op0", "op1"), ("op1", "op2"), ("op2", "op3"),
                                                  ("op3", "op4")]
    assert g.nodes[0].predicted_s is None and g.nodes[0].roofline_s is None  # no device given


def test_a_layer_with_a_stored_weight_keeps_its_edges(toy):
    model, x = toy
    set_stored_nbytes(model.fc1.weight, 16)  # fc1 counted whole, as one op (subclass_linear)
    try:
        g = module_graph(record_forward(model, x))
        ops = op_graph(record_forward(model, x))
    finally:
        set_stored_nbytes(model.fc1.weight, None)
    # the same 6 module edges as the plain model: norm -> fc1 -> act runs through the layer
    assert [(e.src, e.dst) for e in g.edges] == [
        ("input", "Residual.norm"), ("Residual.norm", "Residual.fc1"),
        ("Residual.fc1", "Residual.act"), ("Residual.act", "Residual.fc2"),
        ("input", "Residual[4]"), ("Residual.fc2", "Residual[4]")]
    fc1 = g.nodes[2]
    # fc1 as stored: x [2, 4] 32 B + W 16 B (stored) + b [8] 32 B read, out [2, 8] 64 B written
    assert fc1.bytes == 32 + 16 + 32 + 64 and fc1.measured_s is not None
    # op graph: layer_norm, linear (fc1 whole), relu, addmm, add: 4 edges, as for the plain model
    assert [n.cls for n in ops.nodes][1] == "aten.linear.default"
    assert len(ops.edges) == 4


def test_recording_counts_as_the_mode_does(toy):
    model, x = toy
    rec = record_forward(model, x)
    with torch.no_grad(), PerformanceCounterMode() as mode:
        model(x)
    assert rec.trace.flops == mode.get_total_flops()
    assert rec.trace.per_op_bytes == mode.trace().per_op_bytes
    assert sum(n.flops for n in module_graph(rec).nodes) == rec.trace.executed_flops


def test_exports(toy, tmp_path):
    model, x = toy
    g = module_graph(record_forward(model, x), get_device_spec("h100-sxm"))
    doc = g.to_json(tmp_path / "g.json")
    assert json.loads((tmp_path / "g.json").read_text()) == json.loads(json.dumps(doc))
    assert doc["stats"]["nodes"] == 6 and len(doc["edges"]) == 6
    assert {"predicted_s", "roofline_s", "measured_s"} <= set(doc["nodes"][1])
    dot = g.to_dot()
    assert dot.startswith("digraph module_graph {") and dot.rstrip().endswith("}")
    assert dot.count(" -> ") == 6 and '"input" -> "Residual.norm"' in dot
    assert "subgraph cluster_" in dot  # the leaf modules grouped under Residual
    text = g.to_text()
    for part in ("## Nodes", "## Edges", "## Stats", "nodes: 6", "edges: 6",
                 "input -> Residual[4]", "predicted time: total", "roofline time: total"):
        assert part in text


def _tiny_llama():
    import transformers
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


def test_hf_llama_module_graph_has_the_layer_edges():
    g = module_graph(record_forward(_tiny_llama(), input_ids=torch.tensor([[1, 2, 3, 4, 5]]),
                                    use_cache=False))
    edges = {(e.src.replace("LlamaForCausalLM.model.", ""),
              e.dst.replace("LlamaForCausalLM.model.", "")) for e in g.edges}
    for i in (0, 1):
        L, prev = f"layers.{i}", "embed_tokens" if i == 0 else "layers.0[4]"
        a, m = f"{L}.self_attn", f"{L}.mlp"
        expected = {
            (prev, f"{L}.input_layernorm"), (prev, f"{L}[2]"),  # the residual stream
            *((f"{L}.input_layernorm", f"{a}.{p}") for p in ("q_proj", "k_proj", "v_proj")),
            *((f"{a}.{p}", f"{a}[3]") for p in ("q_proj", "k_proj", "v_proj")),
            ("rotary_emb", f"{a}[3]"),  # cos, sin into RoPE (+ attention) in the attention's code
            (f"{a}[3]", f"{a}.o_proj"), (f"{a}.o_proj", f"{L}[2]"),  # the first residual add
            (f"{L}[2]", f"{L}.post_attention_layernorm"), (f"{L}[2]", f"{L}[4]"),
            (f"{L}.post_attention_layernorm", f"{m}.gate_proj"),
            (f"{L}.post_attention_layernorm", f"{m}.up_proj"),
            (f"{m}.gate_proj", f"{m}.act_fn"), (f"{m}.act_fn", f"{m}[3]"),
            (f"{m}.up_proj", f"{m}[3]"), (f"{m}[3]", f"{m}.down_proj"),  # act(gate) * up
            (f"{m}.down_proj", f"{L}[4]")}  # the second residual add
        assert len(expected) == 20
        assert expected <= edges, expected - edges
    # nodes: input, embed_tokens, model[1] (positions), rotary_emb, 14 per layer x 2, norm,
    # lm_head = 4 + 28 + 2 = 34; edges: input->embed, model[1]->rotary, 20 per layer x 2,
    # layers.1[4]->norm, norm->lm_head = 44
    assert (len(g.nodes), len(g.edges)) == (34, 44)
    assert ("layers.1[4]", "norm") in edges and ("norm", "LlamaForCausalLM.lm_head") in edges


def test_cli_graph_writes_every_format(tmp_path, capsys):
    base = tmp_path / "tiny"
    config = tmp_path / "config.json"
    config.write_text(json.dumps(dict(
        model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=48,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=64)))
    assert main(argv=["graph", "--config", str(config), "--prompt_length", "5",
                      "--device_spec", "h100-sxm", "--out", str(base)]) == 0
    for level in ("module", "op"):
        for fmt in ("txt", "json", "dot"):
            assert (tmp_path / f"tiny_{level}.{fmt}").is_file()
    doc = json.loads((tmp_path / "tiny_module.json").read_text())
    assert (doc["stats"]["nodes"], doc["stats"]["edges"]) == (34, 44)  # as counted above
    assert doc["stats"]["measured_s"] is None  # fake tensors: nothing measured
    assert "module graph: 34 nodes, 44 edges" in capsys.readouterr().out
    assert main(argv=["graph", "--model", str(config), "--phase", "decode", "--level",
                      "module", "--device_spec", "h100-sxm", "--prompt_length", "5"]) == 0
    # the default 128-token prompt is past this config's 64 positions: refused, not counted
    assert main(argv=["graph", "--model", str(config), "--device_spec", "h100-sxm"]) == 2
    assert "## Edges" in capsys.readouterr().out


@pytest.mark.parametrize("flags, message", [
    (["--out", "/nonexistent/dir/g"], "folder /nonexistent/dir does not exist"),
    (["--format", "png"], "--format 'png'"),
])
def test_cli_graph_bad_input(flags, message, capsys):
    assert main(argv=["graph", "--model", "llama-2-7b", *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_graph_gguf_type_records_the_files_bytes(tmp_path, capsys):
    """--gguf_type Q4_0 on a 2-layer model of dim 32 (tests/conftest.tiny_args, intermediate
    64): Q4_0 stores 32 weights in 18 B. Decode reads each linear once: wqkv 64 rows x 32 =
    2,048 weights = 64 blocks = 1,152 B; wo 1,024 weights = 576 B; w1, w3, w2 2,048 = 1,152 B
    each; the output's 2,048 weights at Q8_0 (rows of 32, no multiple of 256: llama.cpp's
    fallback), 64 blocks x 34 B = 2,176 B; the embedding one row of 32 weights, 18 B."""
    from conftest import tiny_args
    from perfcounter.cli.graph import record_config
    from perfcounter.trace import ROLES
    config = tmp_path / "config.json"
    config.write_text(json.dumps(tiny_args(intermediate_size=64).__dict__))
    rec = record_config(config, phase="decode", gguf_type="Q4_0")
    weight = ROLES.index("weight")
    read = {}
    for r in rec.trace.records:
        read[r.module] = read.get(r.module, 0) + r.read[weight]
    assert read["Transformer.layers.1.attention.wqkv"] == 1152
    assert read["Transformer.layers.0.attention.wo"] == 576
    assert read["Transformer.layers.0.feed_forward.w2"] == 1152
    assert read["Transformer.output"] == 2176 and read["Transformer.tok_embeddings"] == 18
    assert main(argv=["graph", "--model", "llama-2-7b", "--gguf_type", "Q4_K_X"]) == 2
    err = capsys.readouterr().err  # refused alone: no warning about the device spec before it
    assert err.count("\n") == 1 and "gguf_type 'Q4_K_X' is not valid" in err
