"""`pip install` of the wheel where a torch is installed, as the README installs it: the torch stays, and neither
torchvision nor a CUDA build's packages (nvidia-*, triton) come with it.

What pip would add is asked of pip itself (`--dry-run --report`) for an environment that holds torch 2.8.0 (its
metadata alone), from the package index, the machine's pip configuration files aside (a constraint there could hide
what pip picks elsewhere). Then the real install (the `installed` fixture: this environment's torch, then the wheel)
keeps that torch. Needs the package index.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import checked

pytestmark = [pytest.mark.slow, pytest.mark.install]  # pip resolves from the package index: `make test-install`
CUDA_BUILD = re.compile(r"torch|torchvision|triton|nvidia-.*")  # a CUDA torch, and what it or torchvision brings


def environment_with(torch_version: str, folder: Path) -> Path:
    """A bare virtual environment whose only package is `torch_version`'s metadata; its python."""
    checked(sys.executable, "-m", "venv", "--without-pip", folder)
    (site,) = folder.glob("lib/python*/site-packages")
    dist_info = site / f"torch-{torch_version}.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {torch_version}\n")
    return folder / "bin" / "python"


def dry_run(python: Path, *requirements: str | Path) -> subprocess.CompletedProcess:
    """`pip install --dry-run` of `requirements` for `python`'s environment; its report in report.json beside it."""
    report = python.parents[1] / "report.json"
    command = [sys.executable, "-m", "pip", "--python", python, "install", "--dry-run", "--report", report]
    env = os.environ | {"PIP_CONFIG_FILE": os.devnull}
    return subprocess.run([str(c) for c in [*command, *requirements]], capture_output=True, text=True, env=env)


def test_an_install_beside_the_oldest_torch_supported_adds_no_torch_torchvision_or_cuda_packages(dist, tmp_path):
    """Beside torch 2.8.0 (a CPU build: the real install below). litdata after 0.2.44 requires torchvision, whose
    newest release pins the newest torch: pip replaced the installed torch with the newest, a CUDA build, with triton
    and its nvidia-* packages."""
    python = environment_with("2.8.0", tmp_path / "env")
    out = dry_run(python, next(dist.glob("*.whl")))
    assert out.returncode == 0, out.stderr[-3000:]
    added = {
        i["metadata"]["name"].lower(): i["metadata"]["version"]
        for i in json.loads((tmp_path / "env" / "report.json").read_text())["install"]
    }
    assert [name for name in added if CUDA_BUILD.fullmatch(name)] == []
    assert added["litgpt-vocagnolm"] == "0.1.0" and added["litdata"] == "0.2.44"


def test_pip_refuses_litgpt_extra_beside_it_naming_litdata(dist, tmp_path):
    """litgpt[extra] pins litdata 0.2.59, which requires torchvision: pip refuses the two in one install, and so
    changes nothing, rather than bring a torchvision and with it another torch."""
    python = environment_with("2.13.0+cpu", tmp_path / "env")
    out = dry_run(python, next(dist.glob("*.whl")), "litgpt[extra]")
    assert out.returncode != 0
    assert "litgpt-vocagnolm 0.1.0 depends on litdata==0.2.44" in out.stdout + out.stderr
    assert "depends on litdata==0.2.59" in out.stdout + out.stderr


def test_the_install_keeps_the_torch_it_found(installed):
    """The real install, into an environment holding this environment's torch: that torch, and no CUDA package."""
    script = "import importlib.metadata as m, json, torch; print(json.dumps([torch.__version__, "
    script += "[d.name for d in m.distributions()]]))"
    version, names = json.loads(checked(installed / "bin" / "python", "-c", script).stdout)
    assert version == torch.__version__
    assert sorted(name for name in names if CUDA_BUILD.fullmatch(name.lower())) == ["torch"]
