"""Every example in README.md and docs/*.md runs: each fenced code block (```python with
python; ```bash, ```sh with bash, line after line, stopping at the first failure; ```console:
its `$ ` lines) runs in a fresh folder, on tiny models. Placeholders a user fills are
written `<...>` in the docs and filled here (PLACEHOLDERS); a block that needs what this
machine may lack says so in a visible `# needs: cuda|download|minutes` comment and is
skipped for that marker only. ```text blocks are output, not run."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import make_hf_model

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
RUN = ("python", "bash", "sh", "console")
NEEDS = re.compile(r"#\s*needs:\s*([\w ,-]+)")
TINY = {"block_size": 4096, "vocab_size": 256, "n_layer": 2, "n_head": 4, "n_local_heads": 2,
        "dim": 64, "intermediate_size": 128}


def _blocks():
    for page in PAGES:
        text = page.read_text()
        for m in FENCE.finditer(text):
            if m.group(1) in RUN:
                line = text[:m.start()].count("\n") + 1
                yield pytest.param(m.group(1), m.group(2),
                                   id=f"{page.relative_to(REPO)}:{line}")


BLOCKS = list(_blocks())


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """What the placeholders name, made once: a tiny config.json of ours, a tiny Hugging Face
    folder (config.json + model.safetensors), the built-in GGUF."""
    import json
    from perfcounter.models.loading import default_checkpoint
    root = tmp_path_factory.mktemp("docs")
    (root / "config.json").write_text(json.dumps(TINY))
    make_hf_model("llama").save_pretrained(root / "hf_dir")
    try:
        gguf = default_checkpoint()
    except Exception:  # the built-in model is an install step of README's set-up
        gguf = None
    return {"<config.json>": root / "config.json", "<hf_dir>": root / "hf_dir",
            "<model.gguf>": gguf}


def _script(lang: str, body: str) -> str:
    if lang == "console":
        body = "\n".join(line[2:] for line in body.splitlines() if line.startswith("$ "))
    return body


@pytest.mark.slow
@pytest.mark.parametrize("lang, body", BLOCKS)
def test_every_example_runs(lang, body, folder, tmp_path):
    needs = NEEDS.search(body)
    if needs:
        pytest.skip(f"needs: {needs.group(1).strip()}")
    body = _script(lang, body)
    for placeholder, value in folder.items():
        if placeholder in body:
            if value is None:
                pytest.skip(f"{placeholder}: not on this machine")
            body = body.replace(placeholder, str(value))
    assert not re.findall(r"<[\w.-]+>", body), f"a placeholder this test does not fill: {body}"
    for name in ("generate.py", "benchmarks", "scripts"):  # as in the repository's root
        (tmp_path / name).symlink_to(REPO / name)
    env = dict(os.environ, PERFCOUNTER_HOME=str(tmp_path / "home"), PY=sys.executable,
               PYTHONPATH=str(REPO))
    if lang == "python":
        (tmp_path / "example.py").write_text(body)
        argv = [sys.executable, "example.py"]
    else:
        prelude = ('set -eo pipefail\n'
                   'perfcounter() { "$PY" -m perfcounter.cli "$@"; }\n'
                   'python() { "$PY" "$@"; }\n')
        (tmp_path / "example.sh").write_text(prelude + body)
        argv = ["bash", "example.sh"]
    run = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, f"{body}\n--- stdout\n{run.stdout[-3000:]}\n--- stderr\n" \
                                f"{run.stderr[-3000:]}"
