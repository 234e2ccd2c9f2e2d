"""Every public name of the package documents itself with an example, and every example runs.

Names defined in Rust are documented in the stub (_native.pyi), which is what pdoc shows (./dev docs);
names defined in Python in their docstrings. Each example runs as a doctest with `dlbridge` imported.
A class's properties and methods may be shown in the class's example instead of their own."""

import ast
import doctest
import inspect
import re
from pathlib import Path

import pytest

import dlbridge
import dlbridge.testing
from dlbridge import _native

STUB = Path(_native.__file__).with_name("_native.pyi")
ROOT = Path(__file__).resolve().parents[3]


def stub_entries():
    """{qualified name: (kind, docstring, line)} for the stub's functions, classes, their members and
    documented variables (a string right after an assignment)."""
    entries = {}

    def walk(body, prefix):
        for i, node in enumerate(body):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                name = prefix + node.name
                if isinstance(node, ast.ClassDef):
                    kind = "class"
                elif any(isinstance(d, ast.Name) and d.id == "property" for d in node.decorator_list):
                    kind = "property"
                else:
                    kind = "function"
                entries[name] = (kind, ast.get_docstring(node) or "", node.lineno)
                if isinstance(node, ast.ClassDef):
                    walk(node.body, name + ".")
            elif isinstance(node, (ast.AnnAssign, ast.Assign)):
                target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0]
                after = body[i + 1] if i + 1 < len(body) else None
                if isinstance(target, ast.Name) and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
                    entries[prefix + target.id] = ("variable", inspect.cleandoc(after.value.value), node.lineno)

    walk(ast.parse(STUB.read_text()).body, "")
    return entries


def python_entries():
    """The same for the public names defined in Python: dlbridge's own and dlbridge.testing's."""
    entries = {}
    native = set(_native.__all__)
    for module in (dlbridge, dlbridge.testing):
        prefix = "" if module is dlbridge else "testing."
        for name in module.__all__:
            if module is dlbridge and name in native:
                continue
            obj = getattr(module, name)
            kind = "class" if inspect.isclass(obj) else "function"
            entries[prefix + name] = (kind, inspect.getdoc(obj) or "", None)
            if kind == "class":
                for member, value in vars(obj).items():
                    if member.startswith("_") or member in ("probe",):
                        continue
                    is_property = isinstance(value, property)
                    if callable(value) or is_property:
                        entries[f"{prefix}{name}.{member}"] = ("property" if is_property else "function",
                                                               inspect.getdoc(value) or "", None)
    return entries


ENTRIES = {**stub_entries(), **python_entries()}
PROTOCOL = re.compile(r"__\w+__$")


def public(qualname):
    last = qualname.rsplit(".", 1)[-1]
    return not last.startswith("_") or last == "__version__"


def examples(doc):
    return [ex.source for ex in doctest.DocTestParser().get_examples(doc)]


def test_every_public_name_has_an_example():
    missing = []
    for qualname, (kind, doc, _) in ENTRIES.items():
        documented_protocol = PROTOCOL.match(qualname.rsplit(".", 1)[-1]) and doc
        if not (public(qualname) or documented_protocol):
            continue
        if examples(doc):
            continue
        # A member may be shown in its class's example instead.
        owner = qualname.rpartition(".")[0]
        member = qualname.rpartition(".")[2]
        if owner in ENTRIES and any(f".{member}" in src for src in examples(ENTRIES[owner][1])):
            continue
        missing.append(f"{qualname} ({kind})")
    assert not missing, "no example in the docstring of: " + ", ".join(missing)


def test_the_stub_documents_every_name_the_module_exports():
    exported = {name for name in _native.__all__ if public(name)}  # dev builds add private hooks
    assert exported <= set(ENTRIES), exported - set(ENTRIES)


WITH_EXAMPLES = sorted(q for q, (_, doc, _) in ENTRIES.items() if examples(doc))


@pytest.mark.parametrize("qualname", ["dlbridge"] + WITH_EXAMPLES)
def test_example_runs(qualname):
    if qualname == "dlbridge":
        doc, line, filename = dlbridge.__doc__, 0, dlbridge.__file__
    else:
        _, doc, line = ENTRIES[qualname]
        filename = str(STUB) if line is not None else qualname
    test = doctest.DocTestParser().get_doctest(doc, {"dlbridge": dlbridge}, qualname, filename, line or 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    out = []
    runner.run(test, out=out.append)
    assert runner.failures == 0, "".join(out)


def test_version_is_the_workspace_version():
    cargo = (ROOT / "Cargo.toml").read_text()
    (version,) = re.findall(r'(?ms)^\[workspace\.package\].*?^version = "([^"]+)"', cargo)
    assert dlbridge.__version__ == version
    # The crates name each other by this version too.
    for crate in ("dlbridge", "dlbridge-pyo3"):
        assert re.search(rf'^{crate} = {{ path = "{crate}", version = "{re.escape(version)}" }}$', cargo, re.M), crate
