"""`make wheels`, then `make test-gpu WHEELS=DIR` with no package index on the GPU machine's image (gpu-image.txt):
it installs, and the GPU test skips where torch sees no GPU (`make test-wheels`; 3-5 minutes of this 2-core machine
with pip's cache warm, most of it building the stand-in image's environment, so not in `make test`).

What the image lacks is pip's resolution against the image's list, never a list kept by hand: `make wheels` resolves
for Python 3.12 (the image's) on x86_64 Linux with the image's packages as installed (tests/gpu_image.py), downloads
that, and resolves again from DIR alone with no index, which proves DIR complete for 3.12's tags and markers against
the list. This machine's Python is 3.11, so the install itself runs here in a 3.11 virtualenv that holds, of the
image's packages, those the install keeps (every one a wheel in DIR requires and DIR does not hold, and pytest and
hypothesis, which `make test-gpu` runs and imports), at the image's versions, but for two stand-ins: the CPU torch
2.13.0 (the image's CUDA torch 2.11.0 is gigabytes; never an unpinned torch) and numpy below 2.5 (2.5.2 needs Python
3.12). It does not prove the image's own versions of the packages it lists without one (the resolution takes any), nor
Python 3.12's imports, nor anything on a GPU.
"""

import os
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from conftest import ROOT
from gpu_image import ROOTS, image_packages
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

pytestmark = pytest.mark.wheels
STAND_INS = {"torch": "torch==2.13.0", "numpy": "numpy<2.5"}  # for Python 3.11 on a CPU (see above)


def make(*args: str, **env: str) -> subprocess.CompletedProcess:
    out = subprocess.run(
        ["make", *args], cwd=ROOT, capture_output=True, text=True, timeout=1200, env={**os.environ, **env}
    )
    assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-5000:]
    return out


def wheel_requirements(wheel: Path) -> set[str]:
    """The names a wheel requires here (no extra, this Python's markers)."""
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [name for name in archive.namelist() if name.endswith(".dist-info/METADATA")]
        requires = Parser().parsestr(archive.read(metadata).decode()).get_all("Requires-Dist") or []
    requirements = [Requirement(line) for line in requires]
    return {canonicalize_name(r.name) for r in requirements if not r.marker or r.marker.evaluate({"extra": ""})}


def image_environment(folder: Path, wheels: Path) -> Path:
    """A virtualenv holding the image's packages that the install from `wheels` keeps; its python."""
    held = {canonicalize_name(w.name.split("-")[0]) for w in wheels.glob("*.whl")}
    needed = set(map(canonicalize_name, ROOTS)).union(*(wheel_requirements(w) for w in wheels.glob("*.whl"))) - held
    image = {canonicalize_name(name): version for name, version in image_packages().items()}
    assert needed <= image.keys(), f"neither in the image nor in {wheels}: {sorted(needed - image.keys())}"
    keep = [STAND_INS.get(name) or (f"{name}=={image[name]}" if image[name] else name) for name in sorted(needed)]
    subprocess.run([sys.executable, "-m", "venv", folder], check=True)
    python = folder / "bin" / "python"
    install = [python, "-m", "pip", "install", "--quiet", "-c", ROOT / "constraints.txt", *keep]
    subprocess.run(install, check=True, capture_output=True, timeout=1200)
    return python


def test_the_wheels_install_with_no_index_and_the_gpu_test_skips(tmp_path):
    wheels = tmp_path / "wheels"
    make("wheels", f"WHEELS={wheels}")
    python = image_environment(tmp_path / "image", wheels)
    out = make(
        "test-gpu", f"WHEELS={wheels}", f"PYTHON={python}", f"CHAIN_LOG={tmp_path / 'chain.log'}", PIP_NO_INDEX="1"
    )
    assert "Successfully installed" in out.stdout and "litgpt-vocagnolm-0.1.0" in out.stdout
    assert "1 skipped" in out.stdout
