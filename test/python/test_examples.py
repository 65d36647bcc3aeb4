"""README's examples run as written: every fenced block after an
`<!-- example: c -->` or `<!-- example: python -->` marker in README.md and
docs/*.md (readme_examples.py) is extracted, the C ones compiled against
this build, and each run as a job of 4 ranks (two stages of t = 2) by
stagelink_run.
Usage: pytest test_examples.py --build-root BUILD_ROOT
SPDX-License-Identifier: MIT
"""
import os
import subprocess
import sys

import pytest

from readme_examples import examples as find_examples

SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
EXAMPLES = find_examples(SRC)


def test_readme_has_both():
    kinds = {kind for page, kind, _ in EXAMPLES if page == "README.md"}
    assert kinds == {"c", "python"}, \
        "README.md lost its C or Python example (found %s)" % sorted(kinds)


@pytest.mark.parametrize("page, kind, code", EXAMPLES,
                         ids=["%s-%s-%d" % (p, k, i) for i, (p, k, _) in
                              enumerate(EXAMPLES)])
def test_example(page, kind, code, tmp_path, request):
    build = request.config.getoption("--build-root")
    path = tmp_path / ("example.c" if kind == "c" else "example.py")
    path.write_text(code)
    if kind == "c":
        exe = str(tmp_path / "example")
        subprocess.run(["cc", "-std=c11", "-Wall", "-Werror",
                        "-I", os.path.join(SRC, "include"), "-o", exe,
                        str(path), "-L", os.path.join(build, "src"),
                        "-Wl,-rpath," + os.path.join(build, "src"),
                        "-lstagelink"], check=True)
        cmd = [exe]
    else:
        cmd = [sys.executable, str(path)]
    out = subprocess.run([os.path.join(build, "tools", "stagelink_run"),
                          "-n", "4", "-T", "120", "--"] + cmd,
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, "%s, %s example: exit %d\n%s%s" % (
        page, kind, out.returncode, out.stdout, out.stderr)
