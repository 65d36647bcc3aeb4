"""README's examples run as written: every fenced block after an
`<!-- example: c -->` or `<!-- example: python -->` marker in README.md and
docs/*.md (readme_examples.py) is extracted, the C ones compiled against
this build, and each run as a job of 4 ranks (two stages of t = 2) by stagelink_run.
Usage: test_examples.py SOURCE_ROOT BUILD_ROOT
SPDX-License-Identifier: MIT
"""
import os
import subprocess
import sys
import tempfile

from readme_examples import examples as find_examples

src, build = sys.argv[1], sys.argv[2]
examples = find_examples(src)
if not any(kind == "c" for _, kind, _ in examples) or not any(
        kind == "python" for _, kind, _ in examples):
    print("FAIL: README.md lost its C or Python example (found %d)"
          % len(examples))
    sys.exit(1)

run = [os.path.join(build, "tools", "stagelink_run"), "-n", "4", "-T", "120",
       "--"]
failed = 0
with tempfile.TemporaryDirectory() as tmp:
    for i, (page, kind, code) in enumerate(examples):
        path = os.path.join(tmp, "example%d.%s" % (i, "c" if kind == "c"
                                                   else "py"))
        with open(path, "w") as f:
            f.write(code)
        if kind == "c":
            exe = path[:-2]
            subprocess.run(["cc", "-std=c11", "-Wall", "-Werror",
                            "-I", os.path.join(src, "include"), "-o", exe,
                            path, "-L", os.path.join(build, "src"),
                            "-Wl,-rpath," + os.path.join(build, "src"),
                            "-lstagelink"], check=True)
            cmd = run + [exe]
        else:
            cmd = run + [sys.executable, path]
        out = subprocess.run(cmd, capture_output=True, text=True,
                             timeout=180)
        print("%s, %s example: exit %d\n%s%s" % (page, kind, out.returncode,
                                                 out.stdout, out.stderr))
        failed += out.returncode != 0
print("%d of %d examples failed" % (failed, len(examples)))
sys.exit(1 if failed else 0)
