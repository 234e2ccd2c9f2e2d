"""The house rules, checked: no circle among the imports of the files in any one folder, no
source file over 400 lines, and every way in from Python to dlbridge-pyo3 registers its thread
first. Run by CI (`./dev house`); prints each breach and exits 1 on any.

A Rust file's imports are the modules it names through `crate::`, `super::` or `self::` paths;
a Python file's are its relative imports. Within each folder, every file (or subfolder, taken as
one node) is a node; an edge says one uses the other. A circle among them means two rooms that
need each other, which belong in one room, or need a third that both use."""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUST_CRATES = [ROOT / "dlbridge" / "src", ROOT / "dlbridge-pyo3" / "src"]
PYTHON_PACKAGES = [ROOT / "bindings" / "python" / "python" / "dlbridge"]
MAX_LINES = 400

RUST_PATH = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
PY_RELATIVE = re.compile(r"^\s*from\s+(\.+)([A-Za-z_][\w.]*)?\s+import\s+(.+)$", re.M)


def rust_module_path(crate_root, file):
    rel = file.relative_to(crate_root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] in ("mod", "lib"):
        parts = parts[:-1]
    return parts


ROOT_REEXPORT = re.compile(r"^pub use (\w+)::(?:\{([^}]*)\}|(\w+))", re.M)


def root_reexports(crate_root):
    """Names the crate root re-exports, with the module that defines them: `crate::Name` uses it."""
    names = {}
    for module, group, single in ROOT_REEXPORT.findall((crate_root / "lib.rs").read_text()):
        for item in (group.split(",") if group else [single]):
            item = item.strip().split(" as ")[-1].strip()
            if item and item.isidentifier():
                names[item] = module
    return names


def rust_edges(crate_root):
    """(module path of the user, module path it names) for every Rust file of a crate."""
    modules = {tuple(rust_module_path(crate_root, f)): f for f in crate_root.rglob("*.rs")}
    reexported = root_reexports(crate_root)
    edges = set()
    for path, file in modules.items():
        text = re.sub(r"//.*", "", file.read_text())
        # `use crate::{A, B}` names root re-exports.
        for group in re.findall(r"\bcrate::\{([^}]*)\}", text):
            for item in group.split(","):
                module = reexported.get(item.strip().split("::")[0].split(" as ")[0].strip())
                if module and (module,) != path:
                    edges.add((path, (module,)))
        for anchor, rest in RUST_PATH.findall(text):
            names = rest.strip(":").split("::")
            if anchor == "crate" and names[0] in reexported:
                names = [reexported[names[0]]] + names[1:]
            # `super` is the parent of this module, `self` the module itself,
            # whether it lives in foo.rs or foo/mod.rs.
            base = {"crate": [], "super": list(path[:-1]), "self": list(path)}[anchor]
            target = base + names
            # The longest prefix that is a module.
            while target and tuple(target) not in modules:
                target.pop()
            if target and tuple(target) != path:
                edges.add((path, tuple(target)))
    return modules, edges


def folder_cycles(nodes_of, edges):
    """Circles among the nodes of one folder: the strongly connected components of size > 1."""
    graph = {}
    for a, b in edges:
        if a != b:
            graph.setdefault(a, set()).add(b)
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
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
                out.append(sorted(comp))

    for v in list(nodes_of):
        if v not in index:
            visit(v)
    return out


def explain(crate_root, cycle, edges, depth):
    """Which uses make a circle: `a -> b` for each edge inside it."""
    members = set(cycle)
    uses = sorted({(a[depth], b[depth]) for a, b in edges if a[: depth + 1] in members and b[: depth + 1] in members and a[: depth + 1] != b[: depth + 1]})
    return ", ".join(f"{a}->{b}" for a, b in uses)


def rust_breaches(crate_root):
    modules, edges = rust_edges(crate_root)
    breaches = []
    folders = {p[:-1] for p in modules if p} | {()}
    for folder in sorted(folders):
        depth = len(folder)
        nodes = {p[: depth + 1] for p in modules if len(p) > depth and p[:depth] == folder}
        folder_edges = set()
        for a, b in edges:
            if len(a) > depth and len(b) > depth and a[:depth] == folder and b[:depth] == folder:
                na, nb = a[: depth + 1], b[: depth + 1]
                if na != nb:
                    folder_edges.add((na, nb))
        for cycle in folder_cycles(nodes, folder_edges):
            where = crate_root.joinpath(*folder).relative_to(ROOT)
            breaches.append(f"import circle in {where}/: " + " <-> ".join(n[-1] for n in cycle) + f"  ({explain(crate_root, cycle, edges, depth)})")
    return breaches


def python_breaches(package):
    breaches = []
    for folder in [package, *[d for d in package.rglob("*") if d.is_dir() and (d / "__init__.py").exists()]]:
        files = {f.stem: f for f in folder.glob("*.py") if f.stem != "__init__"}
        subpackages = {d.name for d in folder.iterdir() if d.is_dir() and (d / "__init__.py").exists()}
        nodes = set(files) | subpackages
        edges = set()
        for name, file in files.items():
            for dots, module, imported in PY_RELATIVE.findall(file.read_text()):
                if len(dots) != 1:
                    continue
                if module:
                    target = module.split(".")[0]
                    if target in nodes and target != name:
                        edges.add((name, target))
                else:
                    for item in re.split(r"[,\s()]+", imported):
                        item = item.split(" as ")[0]
                        if item in nodes and item != name:
                            edges.add((name, item))
        for cycle in folder_cycles(nodes, edges):
            breaches.append(f"import circle in {folder.relative_to(ROOT)}/: " + " <-> ".join(cycle))
    return breaches


def long_files():
    roots = RUST_CRATES + PYTHON_PACKAGES
    files = [f for r in roots for f in list(r.rglob("*.rs")) + list(r.rglob("*.py"))]
    return [f"{f.relative_to(ROOT)} has {n} lines (over {MAX_LINES})"
            for f in sorted(files) if (n := len(f.read_text().splitlines())) > MAX_LINES]


# A function Python calls, and the first statement it must make (python_calls.rs): at interpreter
# exit CPython ends a daemon thread wherever Python code runs under it (a collection's finalizer,
# when the function allocates), and only a registered thread parks instead of unwinding Rust frames.
ENTRY = re.compile(r"#\[(pyfunction|pymethods)\b")
ENTERED = re.compile(r"\s*(crate::python_calls::)?entered\(\);")
UNREGISTERED_OK = {"testing.rs"}  # test hooks, never in a wheel
FN = re.compile(r"\bfn\s+(\w+)")


def block_end(text, brace):
    """The offset just past the block that opens at `brace`."""
    depth = 0
    for i in range(brace, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return i + 1
    return len(text)


def entry_functions(text):
    """(name, offset of the body) of each `#[pyfunction]`, and of each method with a body directly
    inside a `#[pymethods]` block (not closures or functions nested in a method)."""
    for m in ENTRY.finditer(text):
        start = text.find("{", m.end()) + 1 if m.group(1) == "pymethods" else m.end()
        end = block_end(text, start - 1) if m.group(1) == "pymethods" else len(text)
        position = start
        while (fn := FN.search(text, position, end)) is not None:
            brace, semicolon = text.find("{", fn.end()), text.find(";", fn.end())
            if brace != -1 and (semicolon == -1 or brace < semicolon):
                yield fn.group(1), brace + 1
                position = block_end(text, brace)
            else:
                position = fn.end()
            if m.group(1) == "pyfunction":
                break


def unregistered_entries():
    crate = ROOT / "dlbridge-pyo3" / "src"
    breaches = []
    for file in sorted(crate.rglob("*.rs")):
        if file.name in UNREGISTERED_OK:
            continue
        text = re.sub(r"//[^\n]*", "", file.read_text())
        for name, body in entry_functions(text):
            if not ENTERED.match(text, body):
                breaches.append(f"{file.relative_to(ROOT)}: {name} does not begin with entered()")
    return breaches


def main():
    breaches = [b for c in RUST_CRATES for b in rust_breaches(c)]
    breaches += unregistered_entries()
    breaches += [b for p in PYTHON_PACKAGES for b in python_breaches(p)]
    breaches += long_files()
    for b in breaches:
        print(b)
    print(f"house: {len(breaches)} breach(es)" if breaches else "house: no import circles, no file over 400 lines")
    return 1 if breaches else 0


if __name__ == "__main__":
    sys.exit(main())
