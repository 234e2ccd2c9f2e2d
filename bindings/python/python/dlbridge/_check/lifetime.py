"""Producer rules on a capsule's lifetime: dropped unused it frees its tensor, used it does not, and its
destructor leaves an exception in flight alone. Each needs a DLPack capsule to judge: anything else a
__dlpack__ returns breaks the rule. A broken producer can crash here (double frees, a destructor that
runs Python code with an exception set), which is why rules run in child processes."""

import ctypes
import gc
import sys

from . import abi
from .producer import call, export
from .rules import MUST, Violation, expect, rule

PY_DELETER = ctypes.PYFUNCTYPE(None, ctypes.c_void_p)  # a consumer frees its array with the GIL held


def _requests(sample):
    """The keyword sets the sample exports under (a read-only array may refuse the legacy one)."""
    out = []
    for kw in ({}, {"max_version": (1, 3)}):
        try:
            call(sample.obj, **kw)
        except BufferError:
            continue
        out.append(kw)
    gc.collect()
    return out


@rule("producer.drop-frees", "a capsule dropped unconsumed frees its tensor: the array's refcount returns",
      MUST, "python-spec", "Implementation", """The producer must set the PyCapsule name to "dltensor" so that it can be inspected by name,
      and set PyCapsule_Destructor that calls the deleter of the DLManagedTensor when the "dltensor"-named capsule is
      no longer needed.""")
def drop_frees(target):
    sample = target.producer.sample("plain")
    obj = sample.obj
    requests = _requests(sample) or [{"max_version": (1, 3)}]
    base = sys.getrefcount(obj)
    held = False
    for kw in requests:
        for _ in range(3):
            capsule = export(obj, **kw)[0]
            held |= sys.getrefcount(obj) > base
            del capsule
    gc.collect()
    after = sys.getrefcount(obj)
    expect(after == base, f"the array's refcount went {base} -> {after} after dropping "
                          f"{3 * len(requests)} unconsumed capsules: their tensors were never freed")
    return "" if held else "the capsules hold no reference to the Python object, so only its leak is visible"


@rule("producer.consumed-not-freed", "a consumed (renamed) capsule does not free its tensor; its deleter does",
      MUST, "python-spec", "Implementation", """renaming the capsule to "used_dltensor" to ensure that PyCapsule_Destructor will not get
      called (ensured if PyCapsule_Destructor calls deleter only for capsules whose name is "dltensor")""")
def consumed_not_freed(target):
    sample = target.producer.sample("plain")
    obj = sample.obj
    base = sys.getrefcount(obj)
    for kw in _requests(sample) or [{"max_version": (1, 3)}]:
        capsule, s = export(obj, **kw)
        during = sys.getrefcount(obj)
        # As a consumer would: take the tensor, rename the capsule, drop it. Our own deleter goes in
        # the struct, so a destructor that ignores the name is seen calling it.
        calls = []
        spy = abi.DELETER(calls.append)
        field = (abi.DLManagedTensorVersioned if s.versioned else abi.DLManagedTensor).deleter.offset
        slot = ctypes.c_void_p.from_address(s.address + field)
        slot.value = ctypes.cast(spy, ctypes.c_void_p).value
        abi.api.PyCapsule_SetName(capsule, abi.static_name("used_" + s.name))
        del capsule
        gc.collect()
        expect(not calls, f"dropping a used_{s.name} capsule called the deleter")
        expect(sys.getrefcount(obj) == during, f"dropping a used_{s.name} capsule released the array "
                                               f"(refcount {during} -> {sys.getrefcount(obj)})")
        slot.value = s.deleter  # the consumer is done with it: the producer's own deleter frees
        if s.deleter:
            PY_DELETER(s.deleter)(s.address)
        gc.collect()
        expect(sys.getrefcount(obj) == base, f"the {s.name} deleter left the array's refcount at "
                                             f"{sys.getrefcount(obj)}, not {base}")


def _drop_while_raising(obj, kw):
    zero = 0
    try:
        # The capsule is still on the value stack when the division raises, so it is freed while
        # the ZeroDivisionError is in flight: its destructor runs with the error set.
        (call(obj, **kw), 1 // zero)
    except ZeroDivisionError as exc:
        return exc
    return None


@rule("producer.destructor-keeps-exception", "a capsule freed while an exception is in flight leaves it intact",
      MUST, "python-spec", "Implementation (the capsule destructor)", """/* an exception may be in-flight, we must save it in case we create another one */
      PyObject *type, *value, *traceback; PyErr_Fetch(&type, &value, &traceback); ... PyErr_Restore(type, value,
      traceback);""")
def destructor_keeps_exception(target):
    sample = target.producer.sample("plain")
    unraisable = []
    previous, sys.unraisablehook = sys.unraisablehook, unraisable.append
    try:
        for kw in _requests(sample) or [{"max_version": (1, 3)}]:
            export(sample.obj, **kw)  # a DLPack capsule (Violation otherwise), with a destructor to judge
            try:
                exc = _drop_while_raising(sample.obj, kw)
            except BaseException as other:  # noqa: B902 - whatever replaced the ZeroDivisionError
                raise Violation(f"the exception in flight became {type(other).__name__}: {other}") from None
            expect(isinstance(exc, ZeroDivisionError) and "by zero" in str(exc),
                   f"the exception in flight was lost ({exc!r})")
    finally:
        sys.unraisablehook = previous
    expect(not unraisable, "the destructor reported an unraisable exception: "
                           + "; ".join(f"{type(u.exc_value).__name__}: {u.exc_value}" for u in unraisable[:2]))
