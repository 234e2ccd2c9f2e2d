"""Which optional libraries this interpreter can import; the report runs with any subset of them."""

import functools
import importlib

HELPERS = ("ml_dtypes",)  # not a peer, but NumPy needs it for bfloat16 and float8


class Unavailable(Exception):
    """A case or step needs something this environment lacks; the cell says 'not available (why)'."""


@functools.lru_cache(maxsize=None)
def probe(name):
    """("found", version), ("not installed", None) or ("unusable", "Error: message") for module `name`.

    Imports it once: a library that is installed but fails to import (JAX without NumPy, say) is told
    apart from one that is absent, so the report can say which."""
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name:
            return "not installed", None
        return "unusable", f"{type(exc).__name__}: {first_line(exc)}"
    except Exception as exc:  # a broken install must not stop the report; Ctrl-C still does
        return "unusable", f"{type(exc).__name__}: {first_line(exc)}"
    return "found", str(getattr(module, "__version__", "?"))


def found(name):
    return probe(name)[0] == "found"


def need(name):
    """Raises Unavailable("no NAME") unless `name` imports."""
    if not found(name):
        raise Unavailable(f"no {name}")


def first_line(exc):
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""
