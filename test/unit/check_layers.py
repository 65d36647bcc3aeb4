#!/usr/bin/env python3
"""The layer order of the plugins (plugin/*/) and the layers they are
built on (src/gather, src/gpu, src/staging) holds: no call goes from a
file to one in a layer above it, and no calls between files go round in a
circle; nor do the calls between the files of src/ (where logging sits at the bottom:
an error it logs must not call back into what reports it).  A macro
(SL_WARN, sl_log) counts as a call of the functions it expands to.

The order is declared once, in docs/design.md between the markers
<!-- layers --> and <!-- /layers -->: a table whose rows are
| N | file, file, ... |, layer 1 on top.  A call is a use of an sl_ function
defined (not static) in another file of plugin/, called or named (a
function a file stores as a pointer is its own to hand out); calls through
pointers handed down (UCX's callbacks, progress hooks, a gather backend's
ops) are how a lower layer reports upward.  Every .c file of plugin/*/
and src/*/ must be in the table.

  check_layers.py SOURCE_DIR             check the tree
  check_layers.py SOURCE_DIR --selftest  also check that an injected upward
                                         call and an injected circle fail
SPDX-License-Identifier: MIT
"""

import glob
import os
import re
import sys


def layers_of(design):
    text = open(design).read()
    m = re.search(r"<!-- layers -->(.*?)<!-- /layers -->", text, re.S)
    if not m:
        sys.exit("%s has no <!-- layers --> table" % design)
    layer = {}
    for row in m.group(1).splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].isdigit():
            for f in cells[1].split(","):
                layer[f.strip().strip("`")] = int(cells[0])
    if not layer:
        sys.exit("the layers table of %s lists no file" % design)
    return layer


def strip(code):
    code = re.sub(r"/\*.*?\*/", " ", code, flags=re.S)
    code = re.sub(r"//[^\n]*", " ", code)
    return re.sub(r'"(\\.|[^"\\])*"', '""', code)


DEF = re.compile(r"^(?!static\b)[A-Za-z_][\w \*]*?\b(sl_\w+)\s*\([^;{]*\)\s*\{",
                 re.M)
CALL = re.compile(r"\b(sl_\w+)\b")


MACRO = re.compile(r"^#define\s+(\w+)\((\\\n|[^\n])*", re.M)


def macros_of(headers):
    """{macro: the sl_ names its body uses}, for function-like macros."""
    found = {}
    for path in headers:
        for m in MACRO.finditer(strip(open(path).read())):
            body = m.group(0).split(")", 1)[-1]
            found[m.group(1)] = set(CALL.findall(body)) | set(
                re.findall(r"\b(SL_[A-Z_]+)\s*\(", body))
    return found


def edges_of(top, patterns):
    """Calls between the .c files matching `patterns` under `top`, named
    relative to it."""
    code, defined, headers = {}, {}, glob.glob(os.path.join(top, "src", "*.h"))
    for pattern in patterns:
        headers += glob.glob(os.path.join(top, pattern[:-1] + "h"))
        for path in sorted(glob.glob(os.path.join(top, pattern))):
            name = os.path.relpath(path, top)
            code[name] = strip(open(path).read())
            for m in DEF.finditer(code[name]):
                defined[m.group(1)] = name
    macros = macros_of(headers)

    def targets(word, seen):
        if word in defined:
            yield word
        for inner in macros.get(word, ()):
            if inner not in seen:
                seen.add(inner)
                yield from targets(inner, seen)

    edges = {}
    for name, text in code.items():
        for m in re.finditer(r"\b((?:sl|SL)_\w+)\b", text):
            for fn in targets(m.group(1), {m.group(1)}):
                target = defined[fn]
                if target != name:
                    edges.setdefault((name, target), set()).add(fn)
    return sorted(code), edges


def problems(files, edges, layer):
    found = []
    for f in files:
        if layer and f not in layer:
            found.append("%s is in no layer of docs/design.md" % f)
    for (a, b), calls in sorted(edges.items()):
        if a in layer and b in layer and layer[a] > layer[b]:
            found.append("%s (layer %d) calls up into %s (layer %d): %s"
                         % (a, layer[a], b, layer[b], ", ".join(sorted(calls))))
    # A circle: a path back to where it started (depth-first search).
    succ = {}
    for a, b in edges:
        succ.setdefault(a, []).append(b)
    state, path = {}, []

    def visit(f):
        state[f] = 1
        path.append(f)
        for g in sorted(succ.get(f, [])):
            if state.get(g) == 1:
                found.append("calls go round in a circle: " +
                             " -> ".join(path[path.index(g):] + [g]))
            elif g not in state:
                visit(g)
        path.pop()
        state[f] = 2

    for f in files:
        if f not in state:
            visit(f)
    return found


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    src = sys.argv[1]
    layer = layers_of(os.path.join(src, "docs", "design.md"))
    # The plugins and the layers under them (src/gather, src/gpu,
    # src/staging), by the table; the core (src/*.c) for circles alone.
    files, edges = edges_of(src, [os.path.join("plugin", "*", "*.c"),
                                  os.path.join("src", "*", "*.c")])
    found = problems(files, edges, layer)
    core, core_edges = edges_of(src, [os.path.join("src", "*.c")])
    found += problems(core, core_edges, {})
    for p in found:
        print("FAIL: " + p)
    print("%d files in %d layers, %d calls between files checked; src/: %d "
          "files, %d calls" % (len(files), len(set(layer.values())),
                               len(edges), len(core), len(core_edges)))
    if "--selftest" in sys.argv:
        low = max(layer, key=layer.get)
        high = min(layer, key=layer.get)
        up = dict(edges)
        up[(low, high)] = {"sl_injected_upward_call"}
        if not any("calls up" in p for p in problems(files, up, layer)):
            print("FAIL: an injected call from %s up into %s passed" % (low, high))
            found.append("selftest")
        same = [f for f in files if layer.get(f) == layer.get(low) and f != low]
        if same:
            circ = dict(edges)
            circ[(low, same[0])] = {"sl_injected_a"}
            circ[(same[0], low)] = {"sl_injected_b"}
            if not any("circle" in p for p in problems(files, circ, layer)):
                print("FAIL: an injected circle %s <-> %s passed" % (low, same[0]))
                found.append("selftest")
        print("selftest: an injected upward call and circle are caught")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
