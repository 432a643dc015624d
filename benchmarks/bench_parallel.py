"""The figures docs/parallel.md quotes: a rank's memory for Llama-3.1-70B by TP, the smallest
TP (and quantization) that fits, collectives priced on NVLink, and a TP / DP / PP deployment
of Llama-3-8B served with the same workload. All derived (no timing): run it anywhere.

    python benchmarks/bench_parallel.py
"""
import torch

from perfcounter import get_device_spec
from perfcounter.format import format_table
from perfcounter.models.args import ModelArgs
from perfcounter.parallel import ParallelConfig, fits_text, rank_args, smallest_fit
from perfcounter.pricing.collectives import all_reduce_s, collective_s
from perfcounter.pricing.links import within as link_for
from perfcounter.serve import deployment, serve, synthetic
from perfcounter.serve.memory import memory_plan

BF16 = torch.bfloat16


def memory_by_tp(model: str, device: str) -> None:
    args, spec = ModelArgs.from_name(model), get_device_spec(device, dtype=BF16)
    rows = []
    for tp in (1, 2, 4, 8):
        plan = memory_plan(rank_args(args, ParallelConfig(tensor_parallel_size=tp)), BF16, spec)
        rows.append([tp, f"{plan.weight_bytes / 1e9:.2f}", f"{plan.kv_bytes_per_token:,}",
                     f"{plan.workspace_bytes / 1e9:.2f}", f"{plan.kv_tokens:,}",
                     "yes" if plan.fits else "no"])
    print(f"{model} in bfloat16, one rank on {device} ({spec.vram / 1e9:.0f} GB, 0.9 usable):")
    print(format_table(rows, ["TP", "weights GB", "KV B/token", "workspace GB", "KV tokens",
                              "fits"], rule=True))
    fits = smallest_fit(args, lambda rank, q: memory_plan(rank, BF16, spec, weights=q),
                        quantizations=(None, "int8", "int4"))
    print(fits_text(fits, "bfloat16"))


def collectives_on(device: str) -> None:
    spec = get_device_spec(device, dtype=BF16)
    rows = []
    for ranks in (2, 4, 8, 16):
        link = link_for(spec, ranks)
        for nbytes, what in ((8192 * 2, "decode, 1 token x 8192 x bf16"),
                             (8192 * 2 * 2048, "prefill, 2048 tokens")):
            seconds, algo = all_reduce_s(nbytes, ranks, link)
            rows.append([ranks, link.kind, f"{link.busbw / 1e9:.0f}", what, algo,
                         f"{seconds * 1e6:.1f}"])
    print(f"\nall-reduce on {device} (ring within a node, NCCL's tree across nodes):")
    print(format_table(rows, ["ranks", "link", "busbw GB/s", "message", "algorithm", "us"],
                       rule=True))
    hop = collective_s("send_recv", 8192 * 2 * 2048, 2, link_for(spec, 2))
    print(f"pipeline hop of 2048 tokens x 8192 x bf16: {hop * 1e6:.1f} us")


def served(model: str, device: str) -> None:
    rows = []
    workload = synthetic(200, 512, 128, qps=20, seed=0)
    for kw in ({}, {"tensor_parallel_size": 2}, {"tensor_parallel_size": 4},
               {"data_parallel_size": 2}, {"pipeline_parallel_size": 2}):
        dep = deployment(model, device, execution="cudagraphs", **kw)
        m = serve(dep, workload).metrics
        rows.append([dep.name, f"{dep.plan.weight_bytes / 1e9:.2f}", f"{dep.plan.kv_tokens:,}",
                     f"{m['mean_ttft_ms']:.1f}", f"{m['mean_tpot_ms']:.2f}",
                     f"{m['output_throughput']:.0f}", f"{dep.usd_per_hour:.2f}"])
    print(f"\n{model} on {device}, 200 requests of 512 + 128 tokens at 20 requests/s, "
          "CUDA graphs (perfcounter's prediction):")
    print(format_table(rows, ["deployment", "weights GB a rank", "KV tokens a rank",
                              "mean TTFT ms", "mean TPOT ms", "output tok/s", "$/hour"],
                       rule=True))


if __name__ == "__main__":
    memory_by_tp("llama-3.1-70b", "h100-sxm")
    collectives_on("h100-sxm")
    served("llama-3-8b", "h100-sxm")
