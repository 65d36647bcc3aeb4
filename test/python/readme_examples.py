"""The examples of README.md and docs/*.md: every fenced block after an
`<!-- example: c -->` or `<!-- example: python -->` marker, so tests run
the examples as written, never a copy.  As a program: writes README.md's
first C and first Python example to OUTDIR/example.c and
OUTDIR/example.py.
Usage: readme_examples.py SOURCE_ROOT OUTDIR
SPDX-License-Identifier: MIT
"""
import glob
import os
import re
import sys

_MARKER = re.compile(r"^<!-- example: (c|python) -->\n```\w*\n(.*?)^```$",
                     re.M | re.S)


def examples(src, pages=None):
    """[(page, kind, code)] in page order; pages default to README.md and
    docs/*.md."""
    if pages is None:
        pages = [os.path.join(src, "README.md")] + sorted(
            glob.glob(os.path.join(src, "docs", "*.md")))
    found = []
    for page in pages:
        with open(page) as f:
            for m in _MARKER.finditer(f.read()):
                found.append((os.path.relpath(page, src), m.group(1),
                              m.group(2)))
    return found


if __name__ == "__main__":
    src, out = sys.argv[1], sys.argv[2]
    readme = examples(src, [os.path.join(src, "README.md")])
    for kind, name in (("c", "example.c"), ("python", "example.py")):
        code = [c for _, k, c in readme if k == kind]
        if not code:
            sys.exit("README.md has no %s example" % kind)
        with open(os.path.join(out, name), "w") as f:
            f.write(code[0])
