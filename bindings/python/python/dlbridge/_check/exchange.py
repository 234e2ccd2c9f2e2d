"""Rules for the DLPack 1.3 C exchange API (`type(x).__dlpack_c_exchange_api__`), probed on producers
that have one: the table's capsule, version and pointers, each function called once through ctypes,
and the tensor the table exports compared with the one `__dlpack__` exports for the same array."""

import ctypes

from . import abi
from .lifetime import PY_DELETER
from .producer import export
from .rules import MAY, MUST, SHOULD, NotApplicable, Permitted, Violation, describe, expect, rule

EXCHANGE_NAME = "dlpack_exchange_api"
REQUIRED = ("managed_tensor_allocator", "managed_tensor_from_py_object_no_sync",
            "managed_tensor_to_py_object_no_sync", "current_work_stream")
_decref = ctypes.PYFUNCTYPE(None, ctypes.c_void_p)(("Py_DecRef", abi.api))


def _capsule(target):
    sample = target.producer.sample("plain")
    cls = type(sample.obj)
    capsule = getattr(cls, "__dlpack_c_exchange_api__", None)
    if capsule is None:
        if getattr(sample.obj, "__dlpack_c_exchange_api__", None) is not None:
            raise Violation(f"{cls.__name__} instances have __dlpack_c_exchange_api__, but the type does not")
        raise NotApplicable(f"{cls.__module__}.{cls.__name__} has no __dlpack_c_exchange_api__")
    return sample, capsule


def table(target):
    """(sample, ExchangeAPI) for the target's array type; NotApplicable if the capsule is unusable."""
    sample, capsule = _capsule(target)
    try:
        ok = abi.capsule_name(capsule) == EXCHANGE_NAME
    except TypeError:
        ok = False
    if not ok:
        raise NotApplicable("its __dlpack_c_exchange_api__ is not a usable capsule (see exchange.capsule)")
    return sample, abi.ExchangeAPI.from_address(abi.capsule_pointer(capsule))


@rule("exchange.capsule", "the table is a 'dlpack_exchange_api' capsule on the type, one per type", MUST,
      "exchange", "DLPackExchangeAPI", """This attribute must be set on the type as a Python PyCapsule with name "dlpack_exchange_api". ... The
      DLPackExchangeAPI* must stay alive throughout the lifetime of the process.""")
def capsule(target):
    sample, cap = _capsule(target)
    try:
        name = abi.capsule_name(cap)
    except TypeError:
        raise Violation(f"__dlpack_c_exchange_api__ is a {type(cap).__name__}, not a PyCapsule") from None
    expect(name == EXCHANGE_NAME, f"the capsule is named {name!r}, not {EXCHANGE_NAME!r}")
    other = target.producer.sample("0-d").obj
    if type(other) is type(sample.obj):
        again = type(other).__dlpack_c_exchange_api__
        expect(abi.capsule_pointer(again) == abi.capsule_pointer(cap), "two lookups give different tables")


@rule("exchange.version", "the table's header says 1.x (x >= 2), with an older-first prev_api chain", MUST,
      "exchange", "DLPackExchangeAPIHeader", """The provided DLPack version the consumer must check major version compatibility before using this struct.
      ... Optional pointer to an older DLPackExchangeAPI in the chain. It must be NULL if the framework does not
      support older versions.""")
def version(target):
    _, api = table(target)
    v = (api.header.version.major, api.header.version.minor)
    expect(v[0] == 1 and v[1] >= 2, f"header version {v[0]}.{v[1]}: the table exists from 1.2, and 2.x is another ABI")
    seen, prev = [v], api.header.prev_api
    while prev and len(seen) < 16:
        p = (prev.contents.version.major, prev.contents.version.minor)
        expect(p < seen[-1], f"prev_api chain is not older-first: {seen + [p]}")
        seen.append(p)
        prev = prev.contents.prev_api
    expect(not prev, "prev_api chain longer than 16 (a loop?)")
    return " -> ".join(f"{a}.{b}" for a, b in seen)


@rule("exchange.pointers", "the four required functions are not NULL", MUST, "exchange", "DLPackExchangeAPI",
      """managed_tensor_allocator ... This function must not be NULL. ... managed_tensor_from_py_object_no_sync
      ... This function must be not NULL. ... managed_tensor_to_py_object_no_sync ... This function must be not
      NULL. ... dltensor_from_py_object_no_sync ... This function can be NULL when the producer does not support
      this function. ... current_work_stream ... This function must be not NULL.""")
def pointers(target):
    _, api = table(target)
    missing = [n for n in REQUIRED if not getattr(api, n)]
    expect(not missing, f"NULL: {', '.join(missing)}")
    return "" if api.dltensor_from_py_object_no_sync else "no dltensor_from_py_object_no_sync (optional)"


def _through_table(api, obj):
    """("ok", Snapshot, values) or ("refused", why): an owning export through the table, freed after."""
    out = ctypes.c_void_p()
    try:
        rc = abi.FROM_PY(api.managed_tensor_from_py_object_no_sync)(obj, ctypes.byref(out))
    except Exception as exc:
        return "refused", describe(exc)
    if rc != 0 or not out.value:
        return "refused", f"returned {rc}"
    s = abi.snapshot_address(out.value, True, "table export")
    values = abi.values_of(s)
    if s.deleter:
        PY_DELETER(s.deleter)(out.value)
    return "ok", s, values


def _through_dltensor(api, obj):
    """The non-owning fill, as a Snapshot-like tuple, or ("refused", why)."""
    t = abi.DLTensor()
    try:
        rc = abi.DLTENSOR_FROM_PY(api.dltensor_from_py_object_no_sync)(obj, ctypes.byref(t))
    except Exception as exc:
        return "refused", describe(exc)
    if rc != 0:
        return "refused", f"returned {rc}"
    holder = abi.DLManagedTensor(dl_tensor=t)
    s = abi.snapshot_address(ctypes.addressof(holder), False, "dltensor fill")
    return "ok", s, abi.values_of(s)


def _through_dlpack(obj):
    try:
        capsule, s = export(obj, max_version=(1, 3))
    except Exception as exc:
        return "refused", describe(exc)
    values = abi.values_of(s)
    del capsule
    return "ok", s, values


def _layout(s):
    shape = s.shape if s.shape is not None or s.ndim else []
    strides = s.strides if s.strides is not None else (abi.row_major(shape) if shape is not None else None)
    return {"device": s.device, "dtype": s.dtype, "ndim": s.ndim, "shape": shape, "strides": strides,
            "data": s.start}


def _differences(a, b, flags=True):
    (_, sa, va), (_, sb, vb) = a, b
    la, lb = _layout(sa), _layout(sb)
    diff = [f"{k} {la[k]} vs {lb[k]}" for k in la if la[k] != lb[k]]
    if flags and sa.versioned and sb.versioned and (sa.flags ^ sb.flags) & abi.READ_ONLY:
        diff.append(f"READ_ONLY {bool(sa.flags & abi.READ_ONLY)} vs {bool(sb.flags & abi.READ_ONLY)}")
    if va != vb:
        diff.append("different values")
    return diff


@rule("exchange.matches-dlpack", "the table exports what __dlpack__ exports: same tensor, flags and refusals",
      SHOULD, "exchange", "DLPackManagedTensorFromPyObjectNoSync",
      """Exports a PyObject* Tensor/NDArray to a DLManagedTensorVersioned. ... \\return The owning
      DLManagedTensorVersioned* or NULL on failure with a Python exception set. If the data cannot be described
      using DLPack this should be a BufferError if possible. [checker's note: what __dlpack__ refuses as not
      describable in DLPack, the table should refuse too]""")
def matches_dlpack(target):
    _, api = table(target)
    if not api.managed_tensor_from_py_object_no_sync:
        raise NotApplicable("managed_tensor_from_py_object_no_sync is NULL (see exchange.pointers)")
    arrays = []
    for kind in ("plain", "readonly", "0-d", "zero-size"):
        try:
            arrays.append((f"{kind} array", target.producer.sample(kind).obj))
        except NotApplicable:
            pass
    arrays += target.producer.specials()
    bad = []
    for label, obj in arrays:
        ref = _through_dlpack(obj)
        paths = [("managed_tensor_from_py_object_no_sync", _through_table(api, obj))]
        if api.dltensor_from_py_object_no_sync:
            paths.append(("dltensor_from_py_object_no_sync", _through_dltensor(api, obj)))
        for path, got in paths:
            if got[0] != ref[0]:
                def said(outcome):
                    return "exported it" if outcome[0] == "ok" else f"refused ({outcome[1]})"

                bad.append(f"{label}: {path} {said(got)} but __dlpack__ {said(ref)}")
            elif got[0] == "ok":
                diff = _differences(got, ref, flags=path.startswith("managed"))
                if diff:
                    bad.append(f"{label}: {path} differs from __dlpack__: {', '.join(diff)}")
    expect(not bad, "; ".join(bad))
    return f"{len(arrays)} arrays compared"


@rule("exchange.allocator", "the allocator makes the prototype's tensor, and to_py_object turns it into the "
      "library's array", MUST, "exchange", "DLPackManagedTensorAllocator, DLPackManagedTensorToPyObjectNoSync",
      """[checker's note: what the two functions are for, which a table that "must not be NULL" provides] Create a new DLManagedTensorVersioned within the context of the producer
      library. The allocation is defined via the prototype DLTensor. Only the dtype, ndim, shape, and device
      fields are used. ... Convert an owning DLManagedTensorVersioned* to the Python tensor of the producer
      (implementer) library with the correct type.""")
def allocator(target):
    sample, api = table(target)
    if not (api.managed_tensor_allocator and api.managed_tensor_to_py_object_no_sync):
        raise NotApplicable("the allocator or to_py_object is NULL (see exchange.pointers)")
    shape = (ctypes.c_int64 * 2)(2, 3)
    proto = abi.DLTensor(None, abi.DLDevice(1, 0), 2, abi.DLDataType(2, 32, 1), shape, None, 0)
    errors = []
    on_error = abi.SET_ERROR(lambda ctx, kind, msg: errors.append(f"{kind.decode()}: {msg.decode()}"))
    out = ctypes.c_void_p()
    rc = abi.ALLOCATOR(api.managed_tensor_allocator)(ctypes.byref(proto), ctypes.byref(out), None, on_error)
    expect(rc == 0 and out.value, f"a float32 (2, 3) CPU prototype: returned {rc}, errors {errors}")
    s = abi.snapshot_address(out.value, True, "allocated")
    got = (s.version[0], s.device[0], s.ndim, s.shape, s.dtype)
    want = (1, 1, 2, [2, 3], (2, 32, 1))
    if got != want:
        if s.deleter:
            PY_DELETER(s.deleter)(out.value)
        raise Violation(f"allocated (major, device type, ndim, shape, dtype) = {got}, want {want}")
    new = ctypes.c_void_p()
    try:
        rc = abi.TO_PY(api.managed_tensor_to_py_object_no_sync)(out.value, ctypes.byref(new))
    except Exception as exc:
        raise Violation(f"to_py_object raised {describe(exc)}") from None
    expect(rc == 0 and new.value, f"to_py_object returned {rc}")
    obj = ctypes.cast(new, ctypes.py_object).value
    _decref(new.value)  # the new reference it handed over; `obj` holds its own
    want_type = type(sample.obj)
    expect(isinstance(obj, want_type), f"to_py_object made a {type(obj).__name__}, not a {want_type.__name__}")
    _, back = export(obj, max_version=(1, 3))
    expect(back.shape == [2, 3] and back.dtype == (2, 32, 1), f"the array it made exports {back.describe()}")


@rule("exchange.current-work-stream", "current_work_stream for CPU may succeed with NULL", MAY, "exchange",
      "DLPackExchangeAPI", """When device_type is kDLCPU, the consumer do not have to query the stream and the producer can simply
      return NULL when queried. ... So CPU only framework can just provide a dummy implementation that always set
      out_current_stream[0] to NULL.""")
def current_work_stream(target):
    _, api = table(target)
    if not api.current_work_stream:
        raise NotApplicable("current_work_stream is NULL (see exchange.pointers)")
    out = ctypes.c_void_p(0x5A5A)  # so a function that sets nothing is seen
    rc = abi.STREAM(api.current_work_stream)(1, 0, ctypes.byref(out))
    if rc != 0 or out.value:
        what = f"returned {rc}" if rc != 0 else f"set the stream to {out.value or 0:#x}"
        raise Permitted(f"{what} for kDLCPU; a consumer need not ask for a CPU stream, and NULL is what it may get")
