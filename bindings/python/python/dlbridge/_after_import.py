"""Run a function once a module has been imported, without importing it: how dlbridge registers its
Tensor with Dask and Ray only in processes that use them (`import dlbridge` imports neither).

`when_imported(name, callback)` calls `callback(module)` at once if `name` is already imported, else
right after the module's code has run, the first time anything imports it. The hook is a finder at
the front of `sys.meta_path` that lets the other finders find the module and wraps the loader they
return; it removes itself once every module it waits for has been imported."""

import sys
import threading
import warnings

_lock = threading.Lock()
_waiting = {}  # module name -> callbacks to run after its first import


def when_imported(name, callback):
    """Calls `callback(module)` now if `name` is imported, else right after its first import."""
    with _lock:
        module = sys.modules.get(name)
        if module is None:
            _waiting.setdefault(name, []).append(callback)
            if _FINDER not in sys.meta_path:
                sys.meta_path.insert(0, _FINDER)
            return
    _run(name, [callback], module)


def _run(name, callbacks, module):
    for callback in callbacks:
        try:
            callback(module)
        except Exception as exc:  # a failed registration must not fail the user's import of `name`
            warnings.warn(f"dlbridge could not register with {name}: {exc!r}", RuntimeWarning, stacklevel=2)


class _Finder:
    """Finds nothing itself: for a module that callbacks wait for, it asks the finders behind it
    and hands back their spec with a loader that runs the callbacks after the module's code."""

    def find_spec(self, name, path, target=None):
        if name not in _waiting:  # every import in the process passes here: one dict lookup
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _Loader(spec.loader, name)
        return spec


class _Loader:
    """The module's own loader, whose exec_module is followed by the callbacks; everything else
    (get_source, get_resource_reader, ...) is the wrapped loader's."""

    def __init__(self, loader, name):
        self._loader = loader
        self._name = name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)  # an import that fails runs no callback, and they keep waiting
        with _lock:
            callbacks = _waiting.pop(self._name, [])
            if not _waiting and _FINDER in sys.meta_path:
                sys.meta_path.remove(_FINDER)
        _run(self._name, callbacks, module)

    def __getattr__(self, attribute):
        return getattr(self._loader, attribute)


_FINDER = _Finder()
