"""Producer rules on what a capsule describes: shape, strides, 0-d and size-0 arrays."""

from . import abi
from .producer import each_export
from .rules import MUST, SHOULD, Violation, expect, rule


def _exports(target, kind):
    sample = target.producer.sample(kind)
    found = list(each_export(sample))
    if not found:
        raise Violation(f"the {kind} array exports no capsule at all")
    return sample, found


@rule("producer.zero-size", "a size-0 array exports, with its shape", MUST, "python-spec", "Implementation",
      """If the array is of size zero, the data pointer in DLTensor should be set to either NULL or 0. [checker's
      note: so a size-0 array is exported, and a capsule must describe its array: ndim and shape]""")
def zero_size(target):
    sample, found = _exports(target, "zero-size")
    for how, s in found:
        expect(s.ndim == len(sample.shape) and s.shape == list(sample.shape),
               f"{how} of a {sample.shape} array: ndim {s.ndim}, shape {s.shape}")


@rule("producer.zero-size-null-data", "a size-0 array's data pointer is NULL", SHOULD, "dlpack.h", "DLTensor.data",
      "Note that if the tensor is of size zero, then the data pointer should be set to `NULL`.")
def zero_size_null_data(target):
    _, found = _exports(target, "zero-size")
    for how, s in found:
        expect(s.data == 0, f"{how}: the data pointer is not NULL")


@rule("producer.0d", "a 0-d array exports ndim 0 and one readable element", MUST, "dlpack.h",
      "DLTensor.shape, DLTensor.strides",
      """The shape of the tensor When ndim == 0, shape can be set to NULL. ... When ndim == 0, strides can be set to
      NULL. [checker's note: NULL shape and strides are the permitted variants; a 0-d array still holds one
      element, so its data pointer is not NULL]""")
def zero_d(target):
    _, found = _exports(target, "0-d")
    for how, s in found:
        expect(s.ndim == 0, f"{how}: ndim is {s.ndim}")
        expect(s.data != 0, f"{how}: data is NULL, but a 0-d array has one element")
        if s.device[0] in abi.CPU_LIKE:
            expect(len(abi.values_of(s) or []) == 1, f"{how}: cannot read its one element")
    return ", ".join(sorted({f"shape {'NULL' if s.shape is None else s.shape}" for _, s in found}))


@rule("producer.strides", "strides count elements (row-major for a C-contiguous array); NULL only before 1.2",
      MUST, "dlpack.h", "DLTensor.strides", """strides of the tensor (in number of elements, not bytes), can not be NULL if ndim != 0, must
      points to an array of ndim elements that specifies the strides, so consumer can always rely on strides[dim]
      being valid for 0 <= dim < ndim. ... Before DLPack v1.2, strides can be NULL to indicate contiguous data. This
      is not allowed in DLPack v1.2 and later.""")
def strides(target):
    notes = []
    for kind in ("plain", "zero-size", "0-d"):
        sample, found = _exports(target, kind)
        for how, s in found:
            if s.strides is None:
                if s.ndim and s.versioned:
                    expect(s.version < (1, 2), f"{kind} array, {how}: strides NULL in a {s.version} capsule")
                if s.ndim:
                    notes.append(f"NULL in {s.name}")
                continue
            if kind == "plain":
                want = abi.row_major(sample.shape)
                wrong = [i for i, (n, a, b) in enumerate(zip(sample.shape, s.strides, want)) if n != 1 and a != b]
                expect(not wrong, f"{how} of a C-contiguous {sample.shape} array: strides {s.strides}, want {want}")
    return "; ".join(sorted(set(notes)))


@rule("producer.shape", "shape is never NULL for ndim > 0, and matches the array", MUST, "dlpack.h",
      "DLTensor.shape", """The shape of the tensor When ndim == 0, shape can be set to NULL. [checker's note: only
      then; a shape that is not the array's describes another array]""")
def shape(target):
    for kind in ("plain", "zero-size", "0-d"):
        sample, found = _exports(target, kind)
        for how, s in found:
            expect(s.ndim == len(sample.shape), f"{kind} array, {how}: ndim {s.ndim}, want {len(sample.shape)}")
            if s.ndim:
                expect(s.shape is not None, f"{kind} array, {how}: shape is NULL with ndim {s.ndim}")
                expect(s.shape == list(sample.shape),
                       f"{kind} array, {how}: shape {s.shape}, want {list(sample.shape)}")
