"""The counting side was split into op_plan / storage / module_path / trace: every
per-op record of a Llama and a Qwen2 prefill + two decode steps (dynamic and static
caches, no_grad and inference_mode) is what it was before the move."""
import json
from pathlib import Path

from records_snapshot import snapshot

BEFORE = Path(__file__).parent / "data" / "records_before_restructure.json"


def test_records_equal_those_before_the_restructure():
    before = json.loads(BEFORE.read_text())
    now = json.loads(json.dumps(snapshot()))
    assert now.keys() == before.keys()
    for phase in before:
        assert now[phase]["records"] == before[phase]["records"], phase
        for key in ("compulsory_read", "compulsory_written", "kv_cache_valid_read"):
            assert now[phase][key] == before[phase][key], (phase, key)
