"""What the checker checks: a producer (something that makes arrays) and/or a consumer (a from_dlpack),
named by a library ("numpy": the report's adapter for it), a callable ("pkg.module:function"), or
passed as a Python callable by dlbridge.testing.

A producer callable is called as make(shape) for a C-contiguous array of that shape (any dtype), and
as make(shape, readonly=True) for a read-only one; numpy.zeros, torch.zeros, jax.numpy.zeros and
dlbridge.zeros all fit the first form. It may raise NotImplementedError for what it cannot make. A
consumer callable is a from_dlpack: it takes an object with __dlpack__ and returns an array."""

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional

from .._report.libs import Unavailable, probe
from .._report.peers import CHECKABLE
from .rules import NotApplicable, describe

# The arrays producer rules ask for: the report's case for a library, the shape for a callable.
KINDS = {
    "plain": ({}, (3, 4)),
    "readonly": ({"readonly": True}, (3, 4)),
    "0-d": ({"layout": "0-d"}, ()),
    "zero-size": ({"layout": "zero-size"}, (0, 4)),
}


class TargetError(Exception):
    """The target cannot be checked at all (not installed, not importable, neither role)."""


@dataclass
class Sample:
    obj: Any
    shape: tuple
    readonly: Optional[bool]  # None: the maker does not say


class Producer:
    name = ""

    def sample(self, kind) -> Sample:
        raise NotImplementedError

    def specials(self):
        """[(label, object)] peculiar to the library (torch's conjugate views, ...)."""
        return []


class PeerProducer(Producer):
    def __init__(self, peer):
        self.peer, self.name = peer, peer.name

    def sample(self, kind):
        case, shape = KINDS[kind]
        try:
            obj = self.peer.make(case)
        except Unavailable as exc:
            raise NotApplicable(f"{self.name} cannot make a {kind} array here ({exc})") from None
        except Exception as exc:  # the adapter builds from NumPy data, which some libraries cannot take
            raise NotApplicable(f"{self.name} could not make a {kind} array: {describe(exc)}") from None
        writable = self.peer.writable(obj)
        readonly = None if writable is None else not writable
        if kind == "readonly" and readonly is False:
            raise NotApplicable(f"{self.name} has no read-only arrays")
        return Sample(obj, shape, readonly)

    def specials(self):
        return self.peer.special_arrays()


class CallableProducer(Producer):
    def __init__(self, make, name):
        self.make, self.name = make, name

    def sample(self, kind):
        _, shape = KINDS[kind]
        try:
            if kind == "readonly":
                return Sample(self.make(shape, readonly=True), shape, True)
            return Sample(self.make(shape), shape, None)
        except (TypeError, NotImplementedError) as exc:
            call = f"{self.name}({shape!r}{', readonly=True' if kind == 'readonly' else ''})"
            raise NotApplicable(f"{call} made no array: {describe(exc)}") from None


# Whether a library has read-only arrays. One without them is right to ignore READ_ONLY ("a consumer
# that does not support read-only arrays should ignore this flag"); one with them marks its results.
READ_ONLY_ARRAYS = {"numpy": True, "jax": True, "tensorflow": True, "dlbridge": True, "mpi4py": True,
                    "torch": False, "cupy": False, "tvm_ffi": False}


class Consumer:
    name = ""
    # True: it has no read-only arrays (known, or declared with --ignores-readonly), so it may ignore
    # READ_ONLY; False: it has them, so it marks results read-only; None: not known.
    ignores_readonly: Optional[bool] = None

    def consume(self, x):
        raise NotImplementedError

    def writable(self, y) -> Optional[bool]:
        return None


class PeerConsumer(Consumer):
    def __init__(self, peer, ignores_readonly=None):
        self.peer, self.name = peer, peer.name
        has = READ_ONLY_ARRAYS.get(peer.name)
        self.ignores_readonly = ignores_readonly or (None if has is None else not has)

    def consume(self, x):
        return self.peer.consume(x)

    def writable(self, y):
        return self.peer.writable(y)


class CallableConsumer(Consumer):
    def __init__(self, from_dlpack, name, ignores_readonly=None):
        self.from_dlpack, self.name, self.ignores_readonly = from_dlpack, name, ignores_readonly or None

    def consume(self, x):
        return self.from_dlpack(x)


@dataclass
class Target:
    name: str
    producer: Optional[Producer] = None
    consumer: Optional[Consumer] = None
    notes: List[str] = field(default_factory=list)

    def roles(self):
        return [r for r in ("producer", "consumer") if getattr(self, r) is not None]


def _import_attr(spec):
    module_name, _, attr = spec.partition(":")
    try:
        obj = importlib.import_module(module_name)
    except ImportError as exc:
        raise TargetError(f"cannot import {module_name}: {describe(exc)}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise TargetError(f"{module_name} has no attribute {attr!r}") from None
    if not callable(obj):
        raise TargetError(f"{spec} is not callable")
    return obj


def guess_role(spec):
    """A callable named like a from_dlpack consumes; anything else is taken to make arrays."""
    return "consumer" if "from_dlpack" in spec.rpartition(":")[2].lower() else "producer"


def resolve(spec: str, role: Optional[str] = None, ignores_readonly=None) -> Target:
    """The target a command-line argument names; `role` keeps only that role."""
    if ":" in spec:
        fn = _import_attr(spec)
        role = role or guess_role(spec)
        if role == "consumer":
            return Target(spec, consumer=CallableConsumer(fn, spec, ignores_readonly))
        return Target(spec, producer=CallableProducer(fn, spec))
    if spec in CHECKABLE:
        status, detail = probe(spec)
        if status != "found":
            raise TargetError(f"{spec} is {status}" + (f" ({detail})" if detail else ""))
        peer = CHECKABLE[spec]
        target = Target(spec, PeerProducer(peer) if peer.producer else None,
                        PeerConsumer(peer, ignores_readonly) if peer.consumer else None)
    else:
        target = _module_target(spec, ignores_readonly)
    if role:
        setattr(target, "consumer" if role == "producer" else "producer", None)
    if not target.roles():
        raise TargetError(f"{spec} has no {role or 'producer or consumer'} to check")
    return target


def _module_target(name, ignores_readonly):
    """Any other module: its from_dlpack consumes, its zeros makes arrays."""
    try:
        module = importlib.import_module(name)
    except ImportError as exc:
        raise TargetError(f"{name} is neither a known library nor importable: {describe(exc)}") from None
    target = Target(name)
    if callable(getattr(module, "zeros", None)):
        target.producer = CallableProducer(module.zeros, f"{name}.zeros")
        target.notes.append(f"arrays made by {name}.zeros(shape)")
    if callable(getattr(module, "from_dlpack", None)):
        target.consumer = CallableConsumer(module.from_dlpack, f"{name}.from_dlpack", ignores_readonly)
    return target


def from_callables(make: Optional[Callable] = None, from_dlpack: Optional[Callable] = None, name=None,
                   ignores_readonly=None) -> Target:
    """A target from Python callables (dlbridge.testing)."""
    label = name or getattr(make or from_dlpack, "__qualname__", None) or repr(make or from_dlpack)
    return Target(label, CallableProducer(make, label) if make else None,
                  CallableConsumer(from_dlpack, label, ignores_readonly) if from_dlpack else None)
