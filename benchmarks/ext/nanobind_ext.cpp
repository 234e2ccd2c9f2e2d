// The nanobind side of `./dev bench`'s extension-call rows: the same four
// functions as dlbridge_ext, with nanobind's typed ndarray arguments.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

namespace nb = nanobind;

using In = nb::ndarray<const float, nb::ndim<1>, nb::device::cpu>;
using Out = nb::ndarray<float, nb::ndim<1>, nb::device::cpu>;

static float total(const In &x) {
    auto v = x.view();
    float s = 0.0f;
    for (size_t i = 0; i < v.shape(0); ++i) s += v(i);
    return s;
}

static void twice(const Out &x) {
    auto v = x.view();
    for (size_t i = 0; i < v.shape(0); ++i) v(i) *= 2.0f;
}

NB_MODULE(nanobind_bench_ext, m) {
    m.def("sum1", [](In x) { return total(x); });
    m.def("sum3", [](In a, In b, In c) { return total(a) + total(b) + total(c); });
    m.def("scale1", [](Out x) { twice(x); });
    m.def("scale3", [](Out a, Out b, Out c) { twice(a); twice(b); twice(c); });
}
