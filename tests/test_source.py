"""simulation/source.read_source: the one reader of what simulate, the plots and the
Perfetto traces are given (a counter, PerformanceStats, a Trace, a dict of them, a
Simulation, a graph.Recording), and its one-line refusal naming what was given and what
the caller accepts."""
import pytest

from conftest import tiny_args
from perfcounter.generation.config_only import count_config
from perfcounter.report.plots import kind_rows
from perfcounter.report.trace_events import trace_events
from perfcounter.simulation.run import phases_of, simulate
from perfcounter.simulation.source import PHASES, SIMULATION, read_source


@pytest.fixture(scope="module")
def counted():
    return count_config(tiny_args(), batch_size=1, prompt_length=8, new_tokens=3,
                        device_spec="h100-sxm")


def test_every_accepted_form_reads_to_the_same_phases(counted):
    every = ("counter", "stats", "trace", "dict")
    whole = read_source(counted, "f()", every)
    assert whole.kind == PHASES and list(whole.phases) == list(counted.counts)
    prefill = counted.counts["prefill"]
    assert whole.phases["prefill"] == (prefill.trace, prefill.num_tokens, prefill)
    assert read_source(prefill, "f()", every).stats() == {"prefill": prefill}
    assert read_source(dict(counted.counts), "f()", every).stats() == dict(counted.counts)
    bare = read_source(prefill.trace, "f()", every)
    assert bare.phases == {"phase": (prefill.trace, 0, None)}  # a Trace: no tokens, no stats
    assert phases_of(prefill.trace) == {"phase": (prefill.trace, 0)}


def test_a_simulation_is_read_as_itself(counted):
    sim = simulate(counted, default_device="h100-sxm")
    src = read_source(sim, "f()", ("counter", "simulation"))
    assert src.kind == SIMULATION and src.value is sim and src.phases == {}


@pytest.mark.parametrize("call, message", [
    (lambda: simulate(42), "simulate() takes a TransformerPerformanceCounter, PerformanceStats, "
                           "a Trace, a dict of them; got int"),
    (lambda: simulate({"decode": "x"}), "simulate(): phase 'decode' is a str; expected "
                                        "PerformanceStats or a Trace"),
    (lambda: kind_rows([1]), "kind_rows() takes a TransformerPerformanceCounter, "
                             "PerformanceStats, a dict of them, a Simulation; got list"),
    (lambda: trace_events(3.0, "h100-sxm"), "trace_events() takes a TransformerPerformanceCounter, "
     "PerformanceStats, a dict of them, a Simulation, a graph.Recording; got float"),
])
def test_a_source_of_another_kind_is_refused_in_one_line(call, message):
    with pytest.raises(TypeError) as e:
        call()
    assert str(e.value) == message and "\n" not in message


def test_plots_take_no_bare_trace(counted):
    with pytest.raises(TypeError, match=r"^kind_rows\(\) takes .*; got Trace$"):
        kind_rows(counted.counts["prefill"].trace, ["h100-sxm"])
