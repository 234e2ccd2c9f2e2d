"""DLPack conformance rules for another library's own tests: the rules of `python -m dlbridge check`, as
functions and as a pytest plugin. Each failure names the rule, what happened, and the specification
sentence it breaks. A rule carries its sentence's strength: breaking a MUST rule fails, a SHOULD rule
warns (a pytest warning), a MAY rule or a variant the sentence allows passes with a note. A crash or
a hang in a child process fails its rule, whatever the level.

As functions:

    from dlbridge.testing import check_producer, check_consumer
    check_producer(mylib.zeros).assert_ok()       # make(shape) -> a C-contiguous array of that shape
    check_consumer(mylib.from_dlpack).assert_ok()  # from_dlpack(x) -> an array

A producer callable may also take `readonly=True` (then the read-only rules run) and may raise
NotImplementedError for what it cannot make. Rules run in child processes when the callables are
importable by name (a crash is then a failed rule, not a dead test run), else in this process.

In pytest, one line in a test module gives one test per rule:

    test_dlpack = dlbridge.testing.conformance_tests(producer=mylib.zeros, consumer=mylib.from_dlpack)

or `@pytest.mark.parametrize("case", conformance_cases(...))` with `case.check()` in the test; or no code:

    pytest -p dlbridge.testing --dlpack-producer mylib:zeros --dlpack-consumer mylib:from_dlpack
"""

import importlib
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

from ._check import runner
from ._check.catalogue import select
from ._check.rules import RULES, Result, Rule
from ._check.targets import from_callables

__all__ = ["ConformanceReport", "Case", "DLPackWarning", "check_producer", "check_consumer", "check", "conformance_cases",
           "conformance_tests", "rules", "Result", "Rule"]


def rules(role: Optional[str] = None) -> List[Rule]:
    """The rules for a "producer" or a "consumer" (exchange API rules count as producer rules), or all.

        >>> from dlbridge.testing import rules
        >>> r = rules("producer")[0]
        >>> r.id, r.level
        ('producer.keywords', 'MUST')
        >>> len(rules()) == len(rules("producer")) + len(rules("consumer"))
        True
    """
    return select(role)


def explain(result: Result) -> str:
    r = RULES[result.rule]
    return f"{r.id}: {r.title}\n    what happened: {result.detail}\n    {r.citation()}"


class DLPackWarning(UserWarning):
    """A SHOULD rule broken: a conformance warning, not a failure. `Case.check` issues it, so pytest
    shows it in the warnings summary; `-W error::dlbridge.testing.DLPackWarning` makes it fail.

        >>> import warnings
        >>> from dlbridge.testing import DLPackWarning
        >>> with warnings.catch_warnings(record=True) as seen:
        ...     warnings.simplefilter("always")
        ...     warnings.warn(DLPackWarning("producer.x: ..."))
        >>> seen[0].category is DLPackWarning and issubclass(DLPackWarning, UserWarning)
        True
    """


@dataclass
class ConformanceReport:
    """The results of one role's rules on one target. `str(report)` is the checker's plain text;
    `assert_ok()` raises AssertionError naming each MUST rule broken.

        >>> import numpy as np
        >>> from dlbridge.testing import check_consumer
        >>> report = check_consumer(np.from_dlpack, only=["consumer.negative-strides"], isolate=False)
        >>> report.ok, report.failures, report.warnings
        (True, [], [])
        >>> report.results
        [Result(rule='consumer.negative-strides', status='pass', detail='...')]
        >>> report.assert_ok()
        >>> print(report)
        dlbridge check from_dlpack
          PASS  consumer.negative-strides: ...
    """

    target: str
    results: List[Result]

    @property
    def failures(self):
        """MUST rules broken, and rules whose probe crashed or hung."""
        return [r for r in self.results if r.status == "fail"]

    @property
    def warnings(self):
        """SHOULD rules broken."""
        return [r for r in self.results if r.status == "warn"]

    @property
    def ok(self):
        """No MUST rule broken, no crash, no hang."""
        return not self.failures

    def __str__(self):
        from ._check import render

        return "\n".join(render.plain([(self.target, self.results)]))

    def assert_ok(self):
        """Raises AssertionError naming each MUST rule broken, what happened and its sentence."""
        if self.failures:
            raise AssertionError(f"{self.target} breaks {len(self.failures)} DLPack rule(s):\n"
                                 + "\n".join(explain(r) for r in self.failures))


def _spec(fn) -> Optional[str]:
    """'module:qualname' when `fn` can be imported back by that name, so a child process can run it."""
    if isinstance(fn, str):
        return fn
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or module == "__main__" or "<" in qualname:
        return None
    spec = f"{module}:{qualname}"
    try:
        obj = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        return None
    return spec if obj is fn else None


def _check(role, fn, skip, only, isolate, name, ignores_readonly):
    chosen = select(role, only, skip)
    spec = _spec(fn)
    if isolate is None:
        isolate = spec is not None
    if isolate:
        if spec is None:
            raise ValueError(f"cannot run {fn!r} in a child process: it is not importable by name")
        return ConformanceReport(name or spec, runner.run_isolated(spec, chosen, role, ignores_readonly))
    if isinstance(fn, str):
        from ._check.targets import resolve

        target = resolve(fn, role, ignores_readonly)
    else:
        target = from_callables(**{"make" if role == "producer" else "from_dlpack": fn}, name=name,
                                ignores_readonly=ignores_readonly)
    return ConformanceReport(target.name, runner.run_in_process(target, chosen))


def check_producer(make: Callable, *, skip: Sequence[str] = (), only: Sequence[str] = (), isolate=None,
                   name=None) -> ConformanceReport:
    """Runs the producer (and C exchange API) rules on arrays from make(shape[, readonly=True]).
    `make` may also be a "module:function" string or a library name ("numpy"). Rules run in a child
    process when `make` is importable by name (isolate=None), so a crash is a failed rule.

        >>> import numpy as np
        >>> from dlbridge.testing import check_producer
        >>> check_producer(np.zeros, only=["producer.versioned", "producer.keywords"]).ok
        True
        >>> check_producer("numpy", skip=["producer.keywords"], isolate=False).target
        'numpy'
    """
    return _check("producer", make, skip, only, isolate, name, None)


def check_consumer(from_dlpack: Callable, *, ignores_readonly=None, skip: Sequence[str] = (),
                   only: Sequence[str] = (), isolate=None, name=None) -> ConformanceReport:
    """Runs the consumer rules on from_dlpack(x). `ignores_readonly=True` declares that the library has no
    read-only arrays, so results of READ_ONLY imports are writable by design (as the array API prefers).

        >>> import dlbridge
        >>> from dlbridge.testing import check_consumer
        >>> report = check_consumer(dlbridge.from_dlpack, name="dlbridge")
        >>> report.ok, report.target
        (True, 'dlbridge')
    """
    return _check("consumer", from_dlpack, skip, only, isolate, name, ignores_readonly)


def check(spec: str, **kwargs) -> List[ConformanceReport]:
    """Both roles of a library named as on the command line ("numpy", "mylib", "pkg.mod:function"), as
    `python -m dlbridge check` runs them: a report per role the target has.

        >>> from dlbridge.testing import check
        >>> [(r.target, r.ok) for r in check("numpy", only=["producer.versioned", "consumer.negative-strides"])]
        [('numpy', True), ('numpy', True)]
    """
    from ._check.targets import resolve

    target = resolve(spec)
    reports = []
    if target.producer:
        reports.append(check_producer(spec, **kwargs))
    if target.consumer:
        reports.append(check_consumer(spec, **kwargs))
    return reports


class Case:
    """One rule against one target, for pytest parametrization: check() fails with the rule's sentence,
    warns (DLPackWarning) for a SHOULD rule, and skips when the rule does not apply. Results of
    isolated runs are computed once, for all cases. `conformance_cases` makes them.

        >>> import numpy as np
        >>> from dlbridge.testing import conformance_cases
        >>> case = conformance_cases(producer=np.zeros, isolate=False)[0].values[0]
        >>> case
        producer.keywords
        >>> case.rule.level, case.check()
        ('MUST', None)
    """

    def __init__(self, rule: Rule, run: Callable[[], Result]):
        self.rule, self._run = rule, run

    def __repr__(self):
        return self.rule.id

    def check(self):
        result = self._run()
        if result.status == "n/a":
            import pytest

            pytest.skip(f"not applicable: {result.detail}")
        if result.status == "fail":
            raise AssertionError(explain(result))
        if result.status == "warn":
            import warnings

            warnings.warn(DLPackWarning(explain(result)), stacklevel=2)


def conformance_cases(producer=None, consumer=None, *, ignores_readonly=None, skip: Sequence[str] = (),
                      isolate=None):
    """pytest.param(Case) per rule for `producer` (a make(shape) callable) and/or `consumer` (a
    from_dlpack), ids set to the rule ids: `@pytest.mark.parametrize("case", conformance_cases(...))`.

        >>> import numpy as np
        >>> from dlbridge.testing import conformance_cases, rules
        >>> params = conformance_cases(producer=np.zeros, consumer=np.from_dlpack)
        >>> len(params) == len(rules()), params[0].id
        (True, 'producer.keywords')
    """
    import pytest

    cases = []
    for role, fn in (("producer", producer), ("consumer", consumer)):
        if fn is None:
            continue
        cache = {}

        def run_all(role=role, fn=fn, cache=cache):
            if not cache:
                report = _check(role, fn, skip, (), isolate, None, ignores_readonly)
                cache.update((r.rule, r) for r in report.results)
            return cache

        for r in select(role, (), skip):
            cases.append(pytest.param(Case(r, lambda rid=r.id, run_all=run_all: run_all()[rid]), id=r.id))
    return cases


def conformance_tests(producer=None, consumer=None, **kwargs):
    """A test function, parametrized over every rule: `test_dlpack = conformance_tests(...)` in a test
    module gives one pytest test per rule.

        >>> import numpy as np
        >>> from dlbridge.testing import conformance_tests
        >>> test_dlpack = conformance_tests(producer=np.zeros)
        >>> test_dlpack.__name__, len(test_dlpack.pytestmark[0].args[1])
        ('test_dlpack_conformance', 27)
    """
    import pytest

    @pytest.mark.parametrize("case", conformance_cases(producer, consumer, **kwargs))
    def test_dlpack_conformance(case):
        case.check()

    return test_dlpack_conformance


# --- pytest plugin: `pytest -p dlbridge.testing --dlpack-producer mylib:zeros` --------------------


def pytest_addoption(parser):
    group = parser.getgroup("dlbridge", "DLPack conformance (dlbridge.testing)")
    group.addoption("--dlpack-producer", metavar="SPEC", help="library or module:function making arrays from a shape")
    group.addoption("--dlpack-consumer", metavar="SPEC", help="library or module:function, a from_dlpack")
    group.addoption("--dlpack-skip", action="append", default=[], metavar="RULE", help="leave a rule out")
    group.addoption("--dlpack-ignores-readonly", action="store_true", default=None,
                    help="the consumer has no read-only arrays, so it ignores READ_ONLY")


def pytest_collection_modifyitems(session, config, items):
    producer, consumer = config.getoption("--dlpack-producer"), config.getoption("--dlpack-consumer")
    if not (producer or consumer):
        return
    import pytest

    class ConformanceItem(pytest.Item):
        def __init__(self, *, case, **kw):
            super().__init__(**kw)
            self.case = case

        def runtest(self):
            self.case.check()

        def repr_failure(self, excinfo):
            return str(excinfo.value) if excinfo.errisinstance(AssertionError) else super().repr_failure(excinfo)

        def reportinfo(self):
            return "dlbridge.testing", None, self.name

    params = conformance_cases(producer, consumer, ignores_readonly=config.getoption("--dlpack-ignores-readonly"),
                               skip=config.getoption("--dlpack-skip"))
    for p in params:
        (case,) = p.values
        role = "consumer" if case.rule.applies_to == "consumer" else "producer"
        spec = consumer if role == "consumer" else producer
        items.append(ConformanceItem.from_parent(session, name=f"dlpack[{spec}][{case.rule.id}]", case=case))
