"""A search's result as text: its inputs, how many candidates ran, the front, the choice."""
from __future__ import annotations

from perfcounter.format import format_table
from perfcounter.plan import evaluate as ev
from perfcounter.plan.candidates import Candidate
from perfcounter.serve.engines import engine_profile
from perfcounter.serve.launch import for_candidate

HEADER = ("#", "devices", "weights", "KV", "TP", "PP", "DP", "EP", "seqs", "GPUs",
          "tok/s/GPU", "TPOT ms", "p99 TTFT ms", "goodput/GPU", "SLO met", "$/1M tok", "J/tok",
          "W/GPU")


def _num(value, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def where(c: Candidate) -> str:
    """'h100-sxm', or 'h100-sxm 2P -> a100-sxm4-80gb 6D' for a disaggregated one."""
    if not c.disaggregated:
        return c.device
    return f"{c.device} {c.num_prefill_instances}P -> {c.decode_device} {c.num_decode_instances}D"


def row(i: int, c: Candidate, f: dict) -> tuple:
    return (i, where(c), c.quantization or c.dtype, c.kv_cache_dtype or "-",
            c.tensor_parallel_size, c.pipeline_parallel_size,
            "-" if c.disaggregated else c.data_parallel_size,
            "yes" if c.enable_expert_parallel else "-", c.max_num_seqs, c.num_gpus,
            _num(f.get("output_throughput_per_gpu"), 4), _num(f.get("median_tpot_ms")),
            _num(f.get("p99_ttft_ms")), _num(f.get("goodput_per_gpu")),
            "-" if f.get("slo_met_fraction") is None else f"{f['slo_met_fraction']:.0%}",
            _num(f.get("usd_per_1m_output_tokens")), _num(f.get("j_per_output_token")),
            _num(None if f.get("mean_power_w") is None else f["mean_power_w"] / c.num_gpus))


def steps_text(result) -> str:
    """The regime steps are priced in: --execution, and where CUDA graphs were asked of a
    kind that replays none, what it runs instead (evaluate.execution)."""
    job = result.job
    if job.execution != "cudagraphs":
        return job.execution
    profile = engine_profile(job.engine)
    other = [f"{profile.regime(k.spec).value} on {k.name}" for k in result.kinds
             if profile.regime(k.spec).value != "cudagraphs"]
    return job.execution + (f" ({', '.join(other)}: no CUDA graphs there)" if other else "")


def none_fits(result) -> str:
    """Why nothing was simulated: what did not fit the pool."""
    pool = ", ".join(f"{k.count} x {k.name}" for k in result.kinds)
    unstored = [f["error"] for f, ok in zip(result.figures, result.fits) if not ok and f]
    if len(unstored) == len(result.figures):
        return f"no candidate fits {pool}: the weight scheme cannot store a rank ({unstored[0]})"
    return (f"no candidate fits {pool}: a rank's weights and workspace leave no KV cache"
            + (f" ({len(unstored)} more: a rank the weight scheme cannot store)" if unstored
               else "") + "; give more or larger devices (--devices) or smaller weights "
            "(--quantize)")


def pruned_text(result) -> str:
    """'12 pruned (9 by bounds, 3 by a short run), 4 from a run simulated for another, ' (the
    pruned search's, prune.py), or '' (an exhaustive search)."""
    rules = result.pruned
    out = ""
    if rules:
        how = {"bound": "by bounds", "halving": "by a short run"}
        out = (f"{sum(rules.values())} pruned ("
               + ", ".join(f"{n} {how.get(rule, rule)}" for rule, n in sorted(rules.items()))
               + "), ")
    if result.same_run:
        out += f"{result.same_run} from a run simulated for another, "
    return out


def plan_text(result) -> str:
    """The text `perfcounter plan` prints (search.PlanResult)."""
    job = result.job
    pool = ", ".join(f"{k.count} x {k.name} (" + ("no price listed" if k.usd_per_hour is None
                                                  else f"${k.usd_per_hour:g} a GPU-hour") + ")"
                     for k in result.kinds)
    errors = sum(1 for f, ok in zip(result.figures, result.fits)
                 if ok and f is not None and "error" in f)
    unstored = sum(1 for f, ok in zip(result.figures, result.fits) if not ok and f)
    runner = {"serial": "in this process", "processes": "on a process pool",
              "ray": "on Ray"}[result.backend]
    lines = [f"plan: {job.model_name} on {pool}",
             f"workload: {job.qps:g} requests/s, {job.num_requests} requests, prompt "
             f"{job.prompt_length}, output {job.max_new_tokens} tokens; SLO {job.slo} for "
             f"{result.slo_attainment:.0%} of requests; steps {steps_text(result)}",
             f"candidates: {len(result.candidates)} enumerated, "
             f"{result.fits.count(False) - unstored} left out (no KV cache fits a rank), "
             + (f"{unstored} left out (a rank the weight scheme cannot store), "
                if unstored else "") + pruned_text(result)
             + f"{result.simulated} simulated {runner}"
             + (f", {errors} refused by serve (their error in the JSON)" if errors else "")]
    lines.append("")
    lines.append("Pareto front (output tokens/s per GPU against median TPOT):")
    front = [row(i, result.candidates[i], result.figures[i]) for i in result.front]
    lines.append(format_table(front, HEADER, rule=True) if front else "  (no candidate ran "
                 "without overload)" if result.simulated else "  (no candidate was simulated)")
    lines.append("")
    if not any(result.fits):
        lines.append(f"recommended: none; {none_fits(result)}")
    elif result.recommended is None:
        lines.append(f"recommended: none; no candidate meets {job.slo} for "
                     f"{result.slo_attainment:.0%} of requests at {job.qps:g} requests/s")
    else:
        i = result.recommended
        lines.append(f"recommended (the highest goodput per GPU meeting the SLO): #{i}")
        lines.append(format_table([row(i, result.candidates[i], result.figures[i])], HEADER,
                                  rule=True))
        lines.append("reproduce it:")
        lines.append(f"  {result.commands[i]}")
        launch = launch_of(result, i)
        lines.append(f"run it ({launch.version}'s flags):" if launch.argv else "run it: none")
        lines += [f"  {launch.text}"] * bool(launch.argv) + [f"  note: {n}" for n in launch.notes]
    return "\n".join(lines)


def launch_of(result, i: int):
    """Candidate i's engine command (serve/launch.py), in the regime it was priced in."""
    c = result.candidates[i]
    return for_candidate(c, result.job, ev.execution(c, result.job))


def plan_dict(result) -> dict:
    """--save_path's JSON: the search's (PlanResult.to_dict) with each simulated candidate's
    engine command and notes, and the recommended one's at the top (`launch_command`)."""
    out = result.to_dict()
    for row in out["candidates"]:
        if row["serve_command"] is not None:
            row.update(launch_of(result, row["index"]).to_dict())
    best = result.recommended
    out.update(launch_of(result, best).to_dict() if best is not None else
               {"launch_command": None, "launch_engine": None, "launch_notes": []})
    return out
