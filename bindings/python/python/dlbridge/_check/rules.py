"""What a rule is, where its sentence comes from, and how one is run.

A rule's probe takes a target (targets.py) and returns a detail string (pass), raises NotApplicable
(not applicable, with why) or Violation (fail, with what happened). Any other exception from the
library under test is a failure too, reported as it was raised.

A rule's quote is the specification's text, verbatim ("..." where it skips); text in [brackets] is the
checker's note, saying what the rule infers where the sentence is not explicit."""

from dataclasses import dataclass
from typing import Callable, Dict, Optional

from .._report.libs import first_line

# The documents rules cite, by the short name a row shows. Files under shared/spec/ hold the texts.
SOURCES = {
    "array-api": "Python array API standard, array.__dlpack__ (v2023.12+; shared/spec/array-api-dlpack-method.txt)",
    "interchange": "Python array API standard, Data interchange mechanisms (shared/spec/data-interchange.md)",
    "python-spec": "DLPack Python specification, 2022 (shared/spec/dlpack-python-spec-2022.rst)",
    "dlpack.h": "dlpack.h v1.3, the DLPack C header (dmlc/dlpack)",
    "exchange": "DLPack 1.3 C exchange API (dlpack.h v1.3 and python_spec, dmlc/dlpack PR #180; "
                "array API draft, array.__dlpack_c_exchange_api__)",
}
STATUSES = ("pass", "fail", "n/a")


class NotApplicable(Exception):
    """The rule cannot be probed on this target (no read-only arrays, no exchange API, ...)."""


class Violation(Exception):
    """The target broke the rule; the message says what happened."""


def expect(condition, message):
    if not condition:
        raise Violation(message)


@dataclass(frozen=True)
class Rule:
    id: str  # "producer.copy-true": role, then name
    title: str  # what must hold, one line
    source: str  # a key of SOURCES
    quote: str  # the sentence (or sentences) the rule comes from, verbatim
    probe: Callable

    @property
    def role(self):
        """producer, consumer or exchange (exchange rules probe producers)."""
        return self.id.partition(".")[0]

    @property
    def applies_to(self):
        return "consumer" if self.role == "consumer" else "producer"

    def citation(self):
        return f'{SOURCES[self.source]}: "{self.quote}"'


RULES: Dict[str, Rule] = {}


def rule(id, title, source, quote):
    """Registers the decorated probe as a rule."""

    def register(probe):
        assert id not in RULES, id
        assert source in SOURCES, source
        RULES[id] = Rule(id, title, source, " ".join(quote.split()), probe)
        return probe

    return register


@dataclass
class Result:
    rule: str
    status: str  # one of STATUSES
    detail: str = ""

    def as_dict(self):
        r = RULES.get(self.rule)
        out = {"rule": self.rule, "status": self.status, "detail": self.detail}
        if r is not None:
            out.update(title=r.title, source=SOURCES[r.source], quote=r.quote)
        return out


def describe(exc):
    return f"{type(exc).__name__}: {first_line(exc)}".rstrip(": ")


def run_rule(r: Rule, target) -> Result:
    try:
        detail = r.probe(target)
    except NotApplicable as exc:
        return Result(r.id, "n/a", str(exc))
    except Violation as exc:
        return Result(r.id, "fail", str(exc))
    except Exception as exc:  # the library raised where the rule expects none; Ctrl-C still stops
        return Result(r.id, "fail", f"unexpected {describe(exc)}")
    return Result(r.id, "pass", detail or "")


def load_all():
    """Imports the rule modules (each registers its rules) and returns RULES in a stable order."""
    from . import producer, layout, lifetime, exchange, consumer  # noqa: F401,I001 (registration, in this order)

    return RULES


def select(role: Optional[str] = None, only=(), skip=()):
    """Rules for targets of `role` ("producer"/"consumer"; None: all), minus skips, or just `only`."""
    rules = load_all()
    unknown = [r for r in (*only, *skip) if r not in rules]
    if unknown:
        raise KeyError(f"unknown rule(s): {', '.join(unknown)}; see `python -m dlbridge check --list`")
    chosen = [r for r in rules.values() if role is None or r.applies_to == role]
    if only:
        chosen = [r for r in chosen if r.id in only]
    return [r for r in chosen if r.id not in skip]
