"""serve/counts_cache.py: a step table's counts saved on disk and read back by a later run."""
import pickle

import numpy as np
import pytest
import torch

from conftest import tiny_args
from perfcounter.devices import get_device_spec
from perfcounter.serve import cache_clear, counts_cache
from perfcounter.serve.pricing import RooflinePricer, step_table


@pytest.fixture
def cache_on(tmp_path, monkeypatch):
    monkeypatch.setenv("PERFCOUNTER_HOME", str(tmp_path))
    monkeypatch.setenv(counts_cache.ENV, "1")
    cache_clear()
    yield tmp_path / counts_cache.FOLDER
    cache_clear()


def _table(args, kv=None):
    return step_table(args, torch.bfloat16, RooflinePricer(get_device_spec("h100-sxm")), kv=kv)


def test_a_table_counted_once_is_read_back_equal(cache_on, monkeypatch):
    args = tiny_args()
    first = _table(args)
    assert len(list(cache_on.glob("*.pkl"))) == 1
    cache_clear()  # a later run: nothing in this process's cache

    def refuse(*a, **k):
        raise AssertionError("counted again")
    monkeypatch.setattr("perfcounter.serve.pricing.count_table", refuse)
    again = _table(args)
    assert np.array_equal(again.counts.coef, first.counts.coef)
    assert again.counts.keys == first.counts.keys
    assert np.array_equal(again.counts.compulsory, first.counts.compulsory)
    step = [(4, 10), (1, 20)]
    assert again.price(step) == first.price(step)


def test_each_key_its_own_file(cache_on):
    _table(tiny_args())
    _table(tiny_args(), kv="fp8")  # another KV dtype
    _table(tiny_args(n_layer=3))  # another model
    assert len(list(cache_on.glob("*.pkl"))) == 3


def test_off_neither_reads_nor_writes(cache_on, monkeypatch):
    monkeypatch.setenv(counts_cache.ENV, "0")
    _table(tiny_args())
    assert not cache_on.exists() or not list(cache_on.glob("*.pkl"))


def test_an_unreadable_file_is_counted_again_with_a_warning(cache_on):
    args = tiny_args()
    _table(args)
    (path,) = cache_on.glob("*.pkl")
    path.write_bytes(b"not a pickle")
    cache_clear()
    with pytest.warns(UserWarning, match="could not be read back"):
        table = _table(args)
    assert table.counts is not None
    assert pickle.loads(path.read_bytes()) is not None  # saved again, whole


def test_the_code_digest_names_the_sources(cache_on, monkeypatch):
    key = ("a key",)
    before = counts_cache.path_of(key)
    monkeypatch.setattr(counts_cache, "code_digest", lambda: "another version")
    assert counts_cache.path_of(key) != before


def test_the_folder_is_held_to_its_size(cache_on, monkeypatch):
    _table(tiny_args())
    (first,) = cache_on.glob("*.pkl")
    size = first.stat().st_size
    monkeypatch.setattr(counts_cache, "MAX_BYTES", size + size // 2)  # room for one table
    import os
    os.utime(first, (1, 1))  # read long ago: removed first
    _table(tiny_args(n_layer=3))
    left = list(cache_on.glob("*.pkl"))
    assert len(left) == 1 and left[0] != first


@pytest.mark.parametrize("value", ["off", "yes", "2"])
def test_a_bad_switch_is_one_line_naming_it(cache_on, monkeypatch, value):
    from perfcounter.serve import ServeError
    monkeypatch.setenv(counts_cache.ENV, value)
    with pytest.raises(ServeError, match=f"PERFCOUNTER_TABLE_CACHE='{value}' is not valid; valid: 0"):
        _table(tiny_args())


def test_plan_refuses_a_bad_switch_before_any_candidate(cache_on, monkeypatch, capsys):
    # every candidate's run would fail on it and plan would answer "none meets the SLO"
    from perfcounter.cli.main import main
    monkeypatch.setenv(counts_cache.ENV, "off")
    assert main(argv=["plan", "--model", "smollm2-135m", "--devices", "h100-sxm:1", "--slo",
                      "ttft=1s,tpot=50ms", "--qps", "2", "--num_requests", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "PERFCOUNTER_TABLE_CACHE='off' is not valid" in err[0]
