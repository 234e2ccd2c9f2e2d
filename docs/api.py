"""Builds the Python API reference with pdoc: `python docs/api.py OUTDIR` (./dev docs runs it with -W error).

Documents `dlbridge` and `dlbridge.testing`. The names that `dlbridge` re-exports from its native
module are documented from the stub, `dlbridge/_native.pyi`: signatures, and docstrings with examples
(test_docstrings.py runs them). pdoc reads a module's own stub only, so the native module's stub is
applied to the package's re-exports here as well.
"""

import html
import re
import sys
import unittest.mock
from pathlib import Path

import pdoc
import pdoc.doc
import pdoc.doc_pyi
import pdoc.render

MODULES = ["dlbridge", "dlbridge.testing"]
NATIVE = "dlbridge._native"

_own_stub = pdoc.doc_pyi.include_typeinfo_from_stub_files


def include_stubs(module: pdoc.doc.Module) -> None:
    _own_stub(module)
    if module.modulename != "dlbridge":
        return
    stub = pdoc.doc_pyi.find_stub_file(NATIVE)
    if stub is None:
        raise RuntimeError(f"no stub for {NATIVE} on sys.path")
    imported = pdoc.doc_pyi._import_stub_file(NATIVE, stub)
    stub_module = pdoc.doc.Module(imported)
    with unittest.mock.patch.dict("sys.modules", {NATIVE: imported}):
        # By name: the native classes say they are dlbridge's (`__module__`), the functions _native's.
        for name in imported.__all__:
            if name in module.members:
                pdoc.doc_pyi._patch_doc(module.members[name], stub_module)


def main(out: str) -> None:
    pdoc.doc_pyi.include_typeinfo_from_stub_files = include_stubs
    pdoc.render.configure(docformat="markdown", show_source=False, footer_text="dlbridge")
    pdoc.pdoc(*MODULES, output_directory=Path(out))
    import dlbridge

    page = html.unescape(re.sub(r"<[^>]+>", "", (Path(out) / "dlbridge.html").read_text()))
    # The stub's examples must be what the page shows, not the native module's shorter docstrings.
    for needle in ("dlbridge.from_dlpack(a, copy=True)", "dltensor_versioned", "kDLBfloat", "DLPACK_VERSION"):
        if needle not in page:
            raise RuntimeError(f"{out}/dlbridge.html lacks {needle!r}: the stub was not applied")
    print(f"Python API reference for dlbridge {dlbridge.__version__}: {out}/index.html")


if __name__ == "__main__":
    main(sys.argv[1])
