"""serve's text: the memory plan, one result in vLLM's benchmark layout, sweep and compare tables."""
from __future__ import annotations

from perfcounter.format import format_table
from perfcounter.parallel import fits_text, smallest_fit
from perfcounter.pricing.links import gpus_per_node
from perfcounter.serve.hf_model import HfArgs
from perfcounter.serve.hf_shard import smallest_fit as hf_smallest_fit
from perfcounter.serve.launch import for_deployment
from perfcounter.serve.memory import memory_plan
from perfcounter.serve.resolve import resolve_model

GB = 1e9


def _num(v, digits: int = 2) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, int):
        return f"{v:,}"
    return f"{v:,.{digits}f}"


def launch_text(dep) -> str:
    """The engine's command that runs `dep` (serve/launch.py), and what it cannot say."""
    launch = for_deployment(dep)
    head = f"run it ({launch.version}'s flags): {launch.text}" if launch.argv else "run it: none"
    return "\n".join([head, *(f"  note: {n}" for n in launch.notes)])


def plan_text(dep, context: int | None = None, batch: int | None = None) -> str:
    p = dep.plan
    lines = [dep.engine_line,
             f"memory plan: {dep.model_name} ({dep.precision}) on "
             f"{dep.name}" + (" (the KV cache's devices below)" if dep.devices else ""),
             f"  device memory {p.device_bytes / GB:.2f} GB x {p.gpu_memory_utilization:g} = "
             f"{p.usable_bytes / GB:.2f} GB usable",
             f"  weights {p.weight_bytes / GB:.2f} GB, activation workspace (estimate) "
             f"{p.workspace_bytes / GB:.2f} GB"]
    for d in dep.devices:  # a placement: each device's memory and what it holds
        kv = f", KV {d.kv_bytes_per_token:,} B a token: {d.kv_blocks:,} blocks" \
            if d.kv_bytes_per_token else ", no KV cache"
        lines.append(f"  {d.device}: memory {d.memory_bytes / GB:.2f} GB, weights "
                     f"{d.weight_bytes / GB:.2f} GB{kv}")
    if not p.fits:
        lines.append(f"  does not fit: {p.kv_capacity_bytes / GB:.2f} GB left for the KV cache")
        return "\n".join(lines)
    lines.append(f"  KV cache {p.kv_capacity_bytes / GB:.2f} GB = {p.kv_tokens:,} tokens "
                 f"({p.kv_blocks:,} blocks of {p.block_size}; {p.kv_bytes_per_token:,} B a token)")
    cost = getattr(dep.engine, "block_cost", None)
    windows = " (windowed layers holding their window's blocks only)" if cost else ""
    if context:
        most = int(p.kv_blocks // cost(context)) if cost else p.max_batch(context)
        lines.append(f"  largest batch at {context:,} tokens of context: {most:,}{windows}")
    if batch:
        longest = _longest(cost, p.kv_blocks / batch, p.max_model_len) if cost else \
            p.max_context(batch)
        lines.append(f"  longest context at batch {batch:,}: {longest:,} tokens "
                     f"(the model's limit: {p.max_model_len:,}){windows}")
    lines.append(launch_text(dep))
    return "\n".join(lines)


def smallest_fit_text(model, dep) -> str:
    """serve --plan's line: perfcounter's model's smallest TP whose rank fits, at the
    deployment's weights, int8, int4 (parallel.smallest_fit); a transformers model's fewest
    GPUs' layouts, as stored (hf_shard.smallest_fit)."""
    p = dep.plan
    if isinstance(dep.args, HfArgs):
        return hf_smallest_fit(dep.args, dep.dtype, p.usable_bytes - p.workspace_bytes,
                               gpus_per_node(dep.spec))
    limits = dict(gpu_memory_utilization=p.gpu_memory_utilization, block_size=p.block_size,
                  kv=dep.kv_dtype, max_num_batched_tokens=dep.engine.max_num_batched_tokens,
                  max_num_seqs=dep.engine.max_num_seqs,
                  kv_scales=dep.settings.get("kv_scales") or "token_head")
    fits = smallest_fit(resolve_model(model), lambda rank, q: memory_plan(
        rank, dep.dtype, dep.spec, weights=q, **limits),
        list(dict.fromkeys([dep.weights.name if dep.weights else None, "int8", "int4"])))
    return fits_text(fits, str(dep.dtype).replace("torch.", ""))


def _longest(cost, blocks: float, limit: int) -> int:
    """The most tokens whose blocks (`cost`, growing with the tokens) fit in `blocks`, at
    most `limit` (bisection)."""
    lo, hi = 0, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if cost(mid) <= blocks else (lo, mid - 1)
    return lo


def result_text(result) -> str:
    """One served workload, in vLLM's benchmark_serving layout plus our engine lines."""
    m, dep = result.metrics, result.deployment
    rows = [dep.engine_line,
            f"serve: {dep.model_name} ({dep.precision}) on {dep.name}, "
            f"{result.workload.source}, {len(result.workload):,} requests",
            f"step costs: {dep.table.label}" + (
                f"; experts routed {dep.expert_load}" if dep.expert_load else ""),
            "{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="=")]

    def row(label, value, digits=2):
        rows.append(f"{label:<40}{_num(value, digits):>10}")

    row("Successful requests:", m["completed"])
    row("Benchmark duration (s):", m["duration"])
    row("Total input tokens:", m["total_input_tokens"])
    row("Total generated tokens:", m["total_output_tokens"])
    row("Request throughput (req/s):", m["request_throughput"])
    if "request_goodput" in m:
        row("Request goodput (req/s):", m["request_goodput"])
    row("Output token throughput (tok/s):", m["output_throughput"])
    row("Total Token throughput (tok/s):", m["total_token_throughput"])
    if m["overloaded"]:
        rows.append(m["overload"])
    else:
        for name, title in (("ttft", "Time to First Token"), ("tpot", "Time per Output Token "
                            "(excl. 1st token)"), ("itl", "Inter-token Latency"),
                            ("e2el", "End-to-end Latency")):
            rows.append("{s:{c}^{n}}".format(s=title, n=50, c="-"))
            label = name.upper()
            row(f"Mean {label} (ms):", m[f"mean_{name}_ms"])
            row(f"Median {label} (ms):", m[f"median_{name}_ms"])
            row(f"P90 {label} (ms):", m[f"p90_{name}_ms"])
            row(f"P99 {label} (ms):", m[f"p99_{name}_ms"])
    rows.append("{s:{c}^{n}}".format(s="Engine", n=50, c="-"))
    row("Mean batch size (sequences a step):", m["mean_batch_size"])
    row("Peak batch size:", m["peak_batch_size"])
    row("Mean KV cache utilisation (%):", 100 * m["mean_kv_cache_utilization"])
    row("Peak KV cache utilisation (%):", 100 * m["peak_kv_cache_utilization"])
    row("Preemptions:", m["preemptions"])
    row("Steps:", m["steps"])
    row("Energy per output token (J):", m["j_per_output_token"], 4)
    row("Energy per request (J):", m["j_per_request"])
    row("Mean power, every GPU (W):", m.get("mean_power_w"), 1)
    cost = m["usd_per_1m_output_tokens"]
    rows.append(f"{'$ per 1M output tokens (device time):':<40}"
                f"{_num(cost, 4) if cost is not None else 'n/a (give --usd_per_hour)':>10}")
    energy_cost = m["usd_per_1m_output_tokens_energy"]
    if energy_cost is not None:
        row("$ per 1M output tokens (energy):", energy_cost, 4)
    rows.append("=" * 50)
    rows.append(launch_text(dep))
    return "\n".join(rows)


SWEEP_COLUMNS = (("qps", "qps", 2), ("req/s", "request_throughput", 2),
                 ("out tok/s", "output_throughput", 1), ("mean TTFT ms", "mean_ttft_ms", 1),
                 ("p99 TTFT ms", "p99_ttft_ms", 1), ("mean TPOT ms", "mean_tpot_ms", 2),
                 ("p99 TPOT ms", "p99_tpot_ms", 2), ("goodput req/s", "request_goodput", 2),
                 ("batch", "mean_batch_size", 1), ("J/out tok", "j_per_output_token", 4),
                 ("mean W", "mean_power_w", 0), ("$/1M out", "usd_per_1m_output_tokens", 4))


def table(rows: list[dict], columns=SWEEP_COLUMNS, first: tuple | None = None) -> str:
    """An aligned table of result dicts (format.format_table; None: n/a, overloaded rows say
    so in a last cell)."""
    cols = ([first] if first else []) + list(columns)
    body = []
    for r in rows:
        cells = [v if isinstance(v, str) else _num(v, digits)
                 for _, key, digits in cols for v in [r.get(key)]]
        body.append(cells + (["overload"] if r.get("overloaded") else []))
    return format_table(body, [c[0] for c in cols], align="r" * len(cols) + "l")
