"""Disaggregated prefill and decode (serve/disaggregated.py): the KV each request moves
between the pools, derived by hand; metrics per pool and overall; bad pools refused."""
import numpy as np
import pytest
import torch

from perfcounter import get_device_spec
from perfcounter.models.args import ModelArgs
from perfcounter.parallel import LinkError, ParallelError
from perfcounter.pricing.links import pool_link
from perfcounter.serve.disaggregated import Pool, kv_transfer
from perfcounter.serve import kv_bytes_per_token, synthetic
from perfcounter.serve.api import deployment, disaggregated, serve

# KV a token: 2 (K, V) x 2 layers x 2 KV heads x head_dim 8 x 2 B = 128 B
TINY = ModelArgs(block_size=4608, vocab_size=64, n_layer=2, n_head=4, n_local_heads=2, dim=32,
                 intermediate_size=64)


def test_pools_parse_as_mapping_options():
    assert Pool.parse("h100-sxm") == Pool("h100-sxm", 1, 1)
    assert Pool.parse("a100-sxm4-80gb,instances=3,tp=2").gpus == 6
    with pytest.raises(ParallelError, match="'gpus=3' is not instances=N or tp=T"):
        Pool.parse("h100-sxm,gpus=3", "--decode_pool")


def test_kv_transfer_bytes_by_hand():
    assert kv_bytes_per_token(TINY, torch.bfloat16) == 128
    l8 = ModelArgs.from_name("llama-3-8b")  # 2 x 32 x 8 x 128 x 2 B = 131072 B a token
    link = pool_link(get_device_spec("h100-sxm"), get_device_spec("a100-sxm4-80gb"))
    # the slower end: DGX A100's 200 Gb/s HDR port a GPU, 25 GB/s x 0.8 (H100's: 50 GB/s)
    assert (link.kind, link.busbw, link.latency_s) == ("network", 20e9, 5e-6)
    nbytes, seconds, joules = kv_transfer(np.array([512, 1]), kv_bytes_per_token(l8, torch.bfloat16),
                                          link, senders=2)
    assert nbytes.tolist() == [512 * 131072, 131072] == [67_108_864, 131_072]
    # two prefill ranks send their halves at once: 67108864 / (2 x 20e9) + 5 us
    assert seconds[0] == pytest.approx(67_108_864 / 40e9 + 5e-6)
    assert joules.tolist() == [0.0, 0.0]  # no pJ/bit given for the node link: 0 J, stated


def test_disaggregated_run_moves_every_prompts_kv():
    w = synthetic(12, 64, 8, qps=20, seed=0)
    r = disaggregated(TINY, w, "h100-sxm,instances=2", "a100-sxm4-80gb,tp=2", execution="bound")
    # 12 requests x 64 prompt tokens x 128 B = 98304 B over the pools' link
    assert r.overall["kv_transfer_bytes"] == 12 * 64 * 128 == 98_304
    assert r.overall["completed"] == r.prefill["completed"] == r.decode["completed"] == 12
    assert r.overall["gpus"] == 4 and r.link.kind == "network"
    # a request's first token is its prefill's; its end, its decode's
    assert r.overall["mean_ttft_ms"] == pytest.approx(r.prefill["mean_ttft_ms"])
    assert r.overall["mean_e2el_ms"] > r.overall["mean_ttft_ms"]
    agg = serve(deployment(TINY, "h100-sxm", execution="bound", data_parallel_size=4), w)
    assert agg.metrics["completed"] == 12  # the aggregated deployment on as many GPUs
    assert set(r.to_dict()) == {"prefill_pool", "decode_pool", "link", "prefill", "decode",
                                "overall"}


def test_a_pim_decode_pool_takes_kv_over_its_host_link():
    spec = get_device_spec("pim-ai-4chip")
    link = pool_link(get_device_spec("h100-sxm"), spec)
    assert link.kind == "pcie" and link.busbw == pytest.approx(spec.host_to_device_bw * 0.625)


def test_a_pool_without_a_link_is_refused_before_counting():
    with pytest.raises(LinkError, match="'generic-cpu' has no link to move KV caches"):
        disaggregated(TINY, synthetic(2, 8, 2, qps=1, seed=0), "generic-cpu", "h100-sxm")


def test_serve_command_line_pools(capsys):
    from perfcounter.cli.main import main
    argv = ["serve", "--model", "smollm2-135m", "--qps", "4", "--num_requests", "6",
            "--prompt_length", "64", "--max_new_tokens", "4"]
    assert main(argv=[*argv, "--prefill_pool", "h100-sxm", "--decode_pool", "h100-sxm"]) == 0
    out = capsys.readouterr().out
    # 6 requests x 64 tokens x (2 x 30 layers x 3 KV heads x 64 x 2 B = 23040 B a token)
    assert "disaggregated, 2 GPUs" in out and "aggregated, 2 x h100-sxm (DP2)" in out
    assert f"KV moved between the pools: {6 * 64 * 23040 / 1e9:.3f} GB over network" in out
    for extra, message in ((["--prefill_pool", "h100-sxm"], "go together: give both"),
                           (["--prefill_pool", "generic-cpu", "--decode_pool", "h100-sxm"],
                            "'generic-cpu' has no link to move KV caches"),
                           (["--prefill_pool", "h100-sxm", "--decode_pool", "h100-sxm",
                             "--tp", "3"], "--tensor_parallel_size: a disaggregated run")):
        assert main(argv=[*argv, *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0]
