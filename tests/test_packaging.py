"""`pip install .` (not only -e) must ship the device registry inside the package."""
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_ships_device_specs(tmp_path):
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps",
                        "--no-build-isolation", "-q", "-w", str(tmp_path)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"pip wheel failed:\n{r.stderr[-2000:]}")
    wheel = next(tmp_path.glob("perfcounter-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {Path(n).name for n in names if n.startswith("perfcounter/device_specs/")}
    assert {p.name for p in (ROOT / "device_specs").glob("*.yaml")} <= shipped
    assert "perfcounter/counting/mode.py" in names
    sources = {p.relative_to(ROOT).as_posix() for p in (ROOT / "perfcounter").rglob("*.py")}
    assert sources <= set(names), f"not in the wheel: {sorted(sources - set(names))[:5]}"


def test_registry_finds_the_installed_layout(tmp_path, monkeypatch):
    import perfcounter.devices.registry as reg

    pkg = tmp_path / "perfcounter"
    (pkg / "device_specs").mkdir(parents=True)
    (pkg / "device_specs" / "x.yaml").write_text("{}")
    monkeypatch.setattr(reg, "__file__", str(pkg / "devices" / "registry.py"))
    assert reg._shipped_dir() == pkg / "device_specs"
