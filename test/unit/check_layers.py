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

And each object's fields are written only by its owner: the table
between <!-- owners --> and <!-- /owners --> in docs/design.md names, for
each struct, the files that may write its fields (| `struct` | files |).
A write is an assignment (=, +=, ...), ++ or -- of a member reached from a
variable whose declared type is known (`req->subs.n++` writes sl_req_subs's
n); a part set whole (`req->subs = ...`) is a write of the outer struct's
field.  Writes through pointers handed to functions are not seen.

  check_layers.py SOURCE_DIR             check the tree
  check_layers.py SOURCE_DIR --selftest  also check that an injected upward
                                         call, an injected circle and a
                                         planted write outside its owner fail
SPDX-License-Identifier: MIT
"""

import glob
import os
import re
import sys


def rows_of(design, marker):
    """(key, [names]) of each row | key | `a`, `b` | of the table between
    <!-- marker --> and <!-- /marker --> (the header rows left out)."""
    text = open(design).read()
    m = re.search(r"<!-- %s -->(.*?)<!-- /%s -->" % (marker, marker), text, re.S)
    if not m:
        sys.exit("%s has no <!-- %s --> table" % (design, marker))
    rows = []
    for row in m.group(1).splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) == 2 and (cells[0].isdigit() or cells[0].startswith("`")):
            rows.append((cells[0].strip("`"),
                         [f.strip().strip("`") for f in cells[1].split(",")]))
    if not rows:
        sys.exit("the %s table of %s lists nothing" % (marker, design))
    return rows


def layers_of(design):
    """{file: its layer, 1 on top}."""
    return {f: int(n) for n, files in rows_of(design, "layers") for f in files}


def owners_of(design):
    """{struct: [files that may write its fields]}."""
    return dict(rows_of(design, "owners"))


def strip(code):
    """Comments and strings out, lines kept (writes are named by line)."""
    code = re.sub(r"/\*.*?\*/", lambda m: " " + "\n" * m.group(0).count("\n"),
                  code, flags=re.S)
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
    return sorted(code), edges, code, headers


BODY = re.compile(r"\bstruct\s+(\w+)\s*\{(.*?)\}\s*(\w*)\s*;", re.S)
MEMBER = re.compile(r"(?:const\s+)?(?:struct\s+|enum\s+)?(\w+)\s*[\s*]\s*"
                    r"(?:const\s+)?(\w+)\s*(?:\[[^\]]*\])?$")
ALIAS = re.compile(r"typedef\s+struct\s+(\w+)\s+(\w+)\s*;")


def structs_of(headers):
    """({struct: {member: type}}, {typedef name: struct})."""
    fields, alias = {}, {}
    for path in headers:
        text = strip(open(path).read())
        for m in BODY.finditer(text):
            members = {}
            for decl in m.group(2).split(";"):
                decl = re.sub(r"\(\s*\*\s*(\w+)\s*\)\s*\(.*", r"void *\1",
                              " ".join(decl.split()))
                first = decl.split(",")[0]
                mm = MEMBER.search(first)
                if mm:
                    members[mm.group(2)] = mm.group(1)
                    for extra in decl.split(",")[1:]:
                        name = re.sub(r"[\s*]|\[.*", "", extra)
                        if name:
                            members[name] = mm.group(1)
            fields[m.group(1)] = members
            if m.group(3):
                alias[m.group(3)] = m.group(1)
        for m in ALIAS.finditer(text):
            alias[m.group(2)] = m.group(1)
    return fields, alias


CHAIN = r"(\w+(?:(?:->|\.)\w+(?:\[[^\]]*\])?)+)"
WRITE = re.compile(r"(?<![\w>.])" + CHAIN +
                   r"\s*(?:(?:[-+*/%|&^]|<<|>>)?=(?!=)|\+\+|--)")
PRE = re.compile(r"(?:\+\+|--)\s*" + CHAIN)
DECL = re.compile(r"\b(?:struct\s+)?((?:sl|stagelink)_\w+)\s*\*+\s*(?:const\s+)?(\w+)")


def writes_of(text, fields, alias):
    """[(struct, member, line)] of each write `text` makes."""
    def struct(name):
        name = alias.get(name, name)
        return name if name in fields else None

    types = {}
    for m in DECL.finditer(text):
        if struct(m.group(1)):
            types[m.group(2)] = struct(m.group(1))
    found = []
    for rx in (WRITE, PRE):
        for m in rx.finditer(text):
            hops = re.split(r"->|\.", re.sub(r"\[[^\]]*\]", "", m.group(1)))
            t = types.get(hops[0])
            for hop in hops[1:-1]:
                t = t and struct(fields[t].get(hop, ""))
            if t:
                found.append((t, hops[-1], text[:m.start()].count("\n") + 1))
    return found


def owner_problems(code, fields, alias, owners):
    found = []
    for name, text in sorted(code.items()):
        for t, member, line in writes_of(text, fields, alias):
            if t in owners and name not in owners[t]:
                found.append("%s:%d writes %s's %s, which only %s write" %
                             (name, line, t, member, ", ".join(owners[t])))
    return found


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
    files, edges, code, headers = edges_of(src, [os.path.join("plugin", "*", "*.c"),
                                                 os.path.join("src", "*", "*.c")])
    found = problems(files, edges, layer)
    owners = owners_of(os.path.join(src, "docs", "design.md"))
    fields, alias = structs_of(headers)
    for t in owners:
        if t not in fields:
            found.append("the owners table names %s, which no header of "
                         "plugin/ or src/ defines" % t)
    nwrites = sum(len(writes_of(text, fields, alias)) for text in code.values())
    found += owner_problems(code, fields, alias, owners)
    core, core_edges, _, _ = edges_of(src, [os.path.join("src", "*.c")])
    found += problems(core, core_edges, {})
    for p in found:
        print("FAIL: " + p)
    print("%d files in %d layers, %d calls between files checked; src/: %d "
          "files, %d calls; %d field writes of %d owned structs" %
          (len(files), len(set(layer.values())), len(edges), len(core),
           len(core_edges), nwrites, len(owners)))
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
        # A request's field written from a file that does not own it.
        planted = dict(code)
        outsider = next(f for f in sorted(code)
                        if f not in owners["stagelink_request"])
        planted[outsider] += ("\nstatic void sl_planted(sl_req_t *req)\n"
                              "{\n    req->status = 0;\n}\n")
        line = planted[outsider].count("\n") - 1
        if not any(p.startswith("%s:%d writes stagelink_request's status" %
                                (outsider, line))
                   for p in owner_problems(planted, fields, alias, owners)):
            print("FAIL: a write of stagelink_request's status planted in %s "
                  "passed" % outsider)
            found.append("selftest")
        print("selftest: an injected upward call and circle, and a planted "
              "write outside its owner, are caught")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
