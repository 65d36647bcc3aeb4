"""`pip install ./python` without pip (Debian's python3 has none): the same
PEP 517 build pip runs (setuptools' build_meta on python/pyproject.toml),
the wheel unpacked into a directory of its own, and the package imported
from there, with its version and every module.
Usage: test_wheel.py SOURCE_ROOT
SPDX-License-Identifier: MIT
"""
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

src = os.path.join(sys.argv[1], "python")
try:
    from setuptools import build_meta
except ImportError as e:
    print("SKIP: %s (install python3-setuptools)" % e)
    sys.exit(77)

with tempfile.TemporaryDirectory() as tmp:
    tree = shutil.copytree(src, os.path.join(tmp, "python"),
                           ignore=shutil.ignore_patterns("__pycache__"))
    os.chdir(tree)  # setuptools writes build/ and *.egg-info here
    wheel = build_meta.build_wheel(os.path.join(tmp, "dist"))
    site = os.path.join(tmp, "site")
    zipfile.ZipFile(os.path.join(tmp, "dist", wheel)).extractall(site)
    out = subprocess.run(
        [sys.executable, "-c",
         "import stagelink, stagelink.megatron, stagelink._install_paths"],
        env=dict(os.environ, PYTHONPATH=site), cwd=tmp, capture_output=True,
        text=True)
    # A wheel has no install record: it must say so by an ImportError of
    # _install_paths alone, after the rest imported.
    ok = ("No module named 'stagelink._install_paths'" in out.stderr and
          "stagelink/__init__" not in out.stderr)
    version = subprocess.run(
        [sys.executable, "-c", "import stagelink; print(stagelink.__version__,"
         " stagelink.__file__)"], env=dict(os.environ, PYTHONPATH=site),
        cwd=tmp, capture_output=True, text=True)
    print(wheel, version.stdout.strip(), version.stderr.strip())
    ok = ok and version.returncode == 0 and version.stdout.startswith(
        wheel.split("-")[1] + " " + site)
print("the wheel installs and imports" if ok else "FAIL: %s" % out.stderr)
sys.exit(0 if ok else 1)
