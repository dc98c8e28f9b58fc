#!/usr/bin/env python3
"""The shape of src/: the largest files and longest functions (test modules
not counted), what the filesystem core imports from the adapter, and the
import circles between modules.

    scripts/structure.py [--top N]

Lines are counted as in the file, up to its `#[cfg(test)] mod tests` block;
files that hold only tests (`tests.rs`, `*_tests.rs`) are left out. A
function is measured from its `fn` line to its closing brace at the same
indent. A module's imports are the `crate::a::b` paths it names (in `use`
lines or inline) and the `super::x` paths of a file inside a directory
module; a circle is a strongly connected set of two or more modules.
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")


def module_of(path):
    rel = os.path.relpath(path, ROOT)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib"):
        rel = rel[:-1]
    return "/".join(rel) or "lib"


def code_lines(text):
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if line.strip() == "#[cfg(test)]" and i + 1 < len(lines) and re.match(r"\s*mod \w+", lines[i + 1]):
            return lines[:i]
    return lines


def functions(lines):
    """(length, name, first line) of each function with a body."""
    out = []
    start = re.compile(r"^(\s*)(pub(\([^)]*\))? )?(const |async |unsafe )*fn (\w+)")
    for i, line in enumerate(lines):
        m = start.match(line)
        if not m or line.rstrip().endswith(";"):
            continue
        if line.count("{") and line.count("{") == line.count("}"):
            out.append((1, m.group(5), i + 1))
            continue
        close = m.group(1) + "}"
        for j in range(i + 1, len(lines)):
            if lines[j].startswith(close) and not lines[j].startswith(close + " else"):
                out.append((j - i + 1, m.group(5), i + 1))
                break
    return out


def resolve(dotted, modules):
    """The longest known module a `crate::a::b::c` path names."""
    parts = dotted.split("::")
    for n in range(len(parts), 0, -1):
        cand = "/".join(parts[:n])
        if cand in modules:
            return cand
    return None


def main():
    top = 8
    if "--top" in sys.argv:
        top = int(sys.argv[sys.argv.index("--top") + 1])
    files, where = {}, {}
    for d, _, names in os.walk(ROOT):
        for n in names:
            if n.endswith(".rs") and n != "tests.rs" and not n.endswith("_tests.rs"):
                p = os.path.join(d, n)
                files[module_of(p)] = code_lines(open(p).read())
                where[module_of(p)] = os.path.relpath(p, os.path.join(ROOT, ".."))
    modules = set(files)
    print(f"files: {len(files)}; over 1000 lines: {sum(len(v) > 1000 for v in files.values())}")
    print("largest files (lines before the test module):")
    for mod, lines in sorted(files.items(), key=lambda kv: -len(kv[1]))[:top]:
        print(f"  {len(lines):5}  {where[mod]}")
    fns = [(n, f"{mod}::{name}", line) for mod, lines in files.items() for n, name, line in functions(lines)]
    fns.sort(reverse=True)
    print(f"functions: {len(fns)}; over 100 lines: {sum(n > 100 for n, _, _ in fns)}")
    print("longest functions:")
    for n, name, line in fns[:top]:
        print(f"  {n:5}  {name} (line {line})")
    edges = {m: set() for m in modules}
    pat = re.compile(r"crate::((?:\w+::)*\w+)")
    for mod, lines in files.items():
        # Doc links and comments name modules without importing them.
        text = "\n".join(l for l in lines if not l.lstrip().startswith("//"))
        paths = pat.findall(text)
        parent = mod.rsplit("/", 1)[0] if "/" in mod else None
        if parent:
            for s in re.findall(r"super::((?:\w+::)*\w+)", text):
                paths.append(parent.replace("/", "::") + "::" + s)
        for use in re.findall(r"use crate::\{([^;]*)\};", text, re.S):
            for item in re.split(r"[,\s]+", use):
                if item and item[0].isalpha():
                    paths.append(item)
        for p in paths:
            target = resolve(p, modules)
            if target and target != mod and not mod.startswith(target + "/") and not (parent and target == parent):
                edges[mod].add(target)
    core = sorted(f"{a} -> {b}" for a in edges for b in edges[a] if a.startswith("fs") and b.startswith("fuse"))
    print(f"imports from fs/ into fuse/: {len(core)}")
    for e in core:
        print(f"  {e}")
    # Tarjan's strongly connected components.
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(modules):
        if v not in index:
            visit(v)
    print(f"import circles: {len(sccs)}")
    for c in sorted(sccs):
        print("  " + " <-> ".join(c))


if __name__ == "__main__":
    main()
