"""What `make test-gpu WHEELS=DIR` installs on the GPU machine's image (tests/gpu-image.txt), by pip's own resolution:
`make wheels` downloads it, tests/test_gpu_wheels.py checks it.

pip cannot be told what another machine holds, so the image is modelled as installed metadata: a folder of
`NAME-VERSION.dist-info` stubs, one per listed package, on the path of a bare virtualenv that pip resolves for (`pip
--python`), with the image's Python version and platform (`--python-version`, `--platform`, `--only-binary=:all:`).
pip then keeps what a stub satisfies and reports what it would install: what the image lacks. A stub requires nothing
(the image holds its packages' own requirements). A package listed without a version gets UNKNOWN_VERSION, above any
bound: an upper bound on it (botocore's python-dateutil<3) puts its wheel among the lacking, which at worst carries a
wheel the image did not need. A pattern (nvidia-*) gets no stub: only the CUDA torch needs those, and its stub
requires nothing.

    python tests/gpu_image.py WHEELS PYTHON_VERSION [--no-index]

prints the requirements (name==version) that `pip install litgpt-vocagnolm` and what `make test-gpu` imports (pytest,
hypothesis) add to the image, resolved with this package's wheel and the others already in WHEELS, and the versions
of tests/gpu-wheels.txt. With --no-index it resolves from WHEELS alone and fails unless they hold all of it.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

TESTS = Path(__file__).resolve().parent
IMAGE = TESTS / "gpu-image.txt"
PINS = TESTS / "gpu-wheels.txt"
ROOTS = ["litgpt-vocagnolm", "pytest", "hypothesis"]  # the install, and what `make test-gpu` runs and imports
UNKNOWN_VERSION = "9999"
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]  # x86_64 Linux, glibc 2.28+


def image_packages() -> dict[str, str | None]:
    """The image's packages from tests/gpu-image.txt: name -> version (None where the list gives none)."""
    packages = {}
    for line in IMAGE.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            packages[name] = version or None
    return packages


def write_stubs(folder: Path) -> Path:
    """A `NAME-VERSION.dist-info` (METADATA alone) per listed package of the image, patterns aside."""
    for name, version in image_packages().items():
        if "*" in name:
            continue
        version = version or UNKNOWN_VERSION
        dist_info = folder / f"{re.sub(r'[-.]+', '_', name)}-{version}.dist-info"
        dist_info.mkdir(parents=True)
        (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return folder


def lacking(wheels: Path, python_version: str, offline: bool = False) -> list[str]:
    """What pip would install on the image (name==version each), for CPython `python_version` on x86_64 Linux."""
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", work / "bare"], check=True)
        report = work / "report.json"
        command = [sys.executable, "-m", "pip", "--python", str(work / "bare" / "bin" / "python"), "install"]
        command += ["--dry-run", "--quiet", "--report", str(report), "--find-links", str(wheels), "-c", str(PINS)]
        command += ["--python-version", python_version, "--implementation", "cp", "--only-binary=:all:"]
        command += [f"--platform={platform}" for platform in PLATFORMS] + ["--no-index"] * offline + ROOTS
        env = os.environ | {"PYTHONPATH": str(write_stubs(work / "image"))}
        subprocess.run(command, check=True, env=env)
        installs = json.loads(report.read_text())["install"]
    return sorted(f"{i['metadata']['name']}=={i['metadata']['version']}" for i in installs)


if __name__ == "__main__":
    print("\n".join(lacking(Path(sys.argv[1]), sys.argv[2], offline="--no-index" in sys.argv)))
