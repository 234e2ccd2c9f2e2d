"""scripts/house.py, which CI runs (`./dev house`), finds what it is for: a circle of Rust modules, a circle
of Python modules, a long file, and a function Python calls that does not register its thread first;
and a tree without them passes."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def load_house(root):
    spec = importlib.util.spec_from_file_location("house_under_test", ROOT / "scripts" / "house.py")
    house = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(house)
    house.ROOT = root
    house.RUST_CRATES = [root / "crate" / "src"]
    house.PYTHON_PACKAGES = [root / "pkg"]
    return house


def tree(root, files):
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


CLEAN = {
    "crate/src/lib.rs": "mod a;\nmod b;\npub use a::A;\n",
    "crate/src/a.rs": "use crate::b::B;\npub struct A(B);\n",
    "crate/src/b.rs": "pub struct B;\n",
    "crate/src/deep/mod.rs": "mod x;\nmod y;\n",
    "crate/src/deep/x.rs": "use super::y::Y;\n",
    "crate/src/deep/y.rs": "pub struct Y;\n",
    "pkg/__init__.py": "",
    "pkg/one.py": "from .two import f\n",
    "pkg/two.py": "def f(): pass\n",
}


def test_a_clean_tree_passes(tmp_path, capsys):
    tree(tmp_path, CLEAN)
    assert load_house(tmp_path).main() == 0
    assert "no import circles" in capsys.readouterr().out


def test_a_rust_circle_is_found_at_its_folder(tmp_path, capsys):
    tree(tmp_path, {**CLEAN, "crate/src/deep/y.rs": "use super::x::helper;\npub struct Y;\n"})
    assert load_house(tmp_path).main() == 1
    out = capsys.readouterr().out
    assert "import circle in crate/src/deep/: x <-> y" in out, out
    assert "crate/src/: " not in out, "the circle is inside deep/, not between the root's modules"


def test_a_circle_through_a_root_reexport_is_found(tmp_path, capsys):
    tree(tmp_path, {**CLEAN, "crate/src/b.rs": "use crate::A;\npub struct B;\n"})
    assert load_house(tmp_path).main() == 1
    assert "import circle in crate/src/: a <-> b" in capsys.readouterr().out


def test_a_python_circle_is_found(tmp_path, capsys):
    tree(tmp_path, {**CLEAN, "pkg/two.py": "from . import one\ndef f(): pass\n"})
    assert load_house(tmp_path).main() == 1
    assert "import circle in pkg/: one <-> two" in capsys.readouterr().out


def test_a_long_file_is_found(tmp_path, capsys):
    tree(tmp_path, {**CLEAN, "pkg/two.py": "x = 1\n" * 401})
    assert load_house(tmp_path).main() == 1
    assert "pkg/two.py has 401 lines (over 400)" in capsys.readouterr().out


ENTRIES = """#[pyfunction]
fn first(x: i64) -> i64 {
    entered();
    x
}

#[pymethods]
impl T {
    #[getter]
    fn shape(&self) -> usize {
        crate::python_calls::entered();
        let f = |y: usize| { y };
        f(1)
    }

    fn __len__(&self) -> usize {
        entered();
        0
    }
}
"""


def test_entries_that_register_first_pass(tmp_path, capsys):
    tree(tmp_path, {**CLEAN, "dlbridge-pyo3/src/entries.rs": ENTRIES})
    assert load_house(tmp_path).main() == 0, capsys.readouterr().out


@pytest.mark.parametrize("name, unregistered", [
    ("first", ENTRIES.replace("    entered();\n    x", "    x")),
    ("shape", ENTRIES.replace("        crate::python_calls::entered();\n", "")),
    ("__len__", ENTRIES.replace("        entered();\n        0", "        0")),
])
def test_an_entry_that_does_not_register_first_is_found(tmp_path, capsys, name, unregistered):
    tree(tmp_path, {**CLEAN, "dlbridge-pyo3/src/entries.rs": unregistered})
    assert load_house(tmp_path).main() == 1
    assert f"dlbridge-pyo3/src/entries.rs: {name} does not begin with entered()" in capsys.readouterr().out


def test_this_repository_keeps_the_rules(capsys):
    spec = importlib.util.spec_from_file_location("house_here", ROOT / "scripts" / "house.py")
    house = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(house)
    assert house.main() == 0, capsys.readouterr().out


def load_compile_once():
    spec = importlib.util.spec_from_file_location("compile_once_under_test", ROOT / "scripts" / "compile_once.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def unit(name, features=(), deps=(), debuginfo=2):
    return {"pkg_id": f"registry+https://github.com/rust-lang/crates.io-index#{name}@1.0.0",
            "target": {"name": name.replace("-", "_")}, "mode": "build", "platform": None,
            "features": list(features), "profile": {"opt_level": "0", "debuginfo": debuginfo, "panic": "unwind"},
            "dependencies": [{"index": i} for i in deps]}


def test_compile_once_finds_a_heavy_dependency_built_with_other_features():
    """scripts/compile_once.py names a crate under candle-core that an example would build again, and
    leaves alone one outside candle's tree."""
    compile_once = load_compile_once()
    workspace = [unit("candle-core", deps=[1]), unit("getrandom", ["std"]), unit("half", ["std"])]
    same = [unit("candle-core", deps=[1]), unit("getrandom", ["std"]), unit("half")]
    assert compile_once.differences(workspace, same) == []
    narrower = [unit("candle-core", deps=[1]), unit("getrandom"), unit("half")]
    found = compile_once.differences(workspace, narrower)
    # The cause is named: candle-core's own unit is the same, and rebuilds only because of it.
    assert [key[0].rsplit("#", 1)[-1] for key in found] == ["getrandom@1.0.0"]
