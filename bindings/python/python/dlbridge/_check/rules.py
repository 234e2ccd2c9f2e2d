"""What a rule is, where its sentence comes from, how strong that sentence is, and how a rule is run.

A rule's probe takes a target (targets.py) and returns a detail string (pass), raises Permitted (a
variant the sentence allows: pass, noted), NotApplicable (with why) or Violation (what happened).
Any other exception from the library under test is a violation too, reported as it was raised.

A violation's verdict is the strength of the sentence the rule quotes: MUST fails, SHOULD warns,
and MAY passes with a note. A crash or a hang fails whatever the level: no sentence allows taking
the consumer's or the producer's process down. A rule's quote is the specification's text, verbatim ("..." where it
skips); text in [brackets] is the checker's note, saying what the rule infers where the sentence is
not explicit, and why the level is what it is where the sentence has no "must", "should" or "may"."""

from dataclasses import dataclass
from typing import Callable, Dict, Optional

from .._report.libs import first_line


@dataclass(frozen=True)
class Source:
    name: str  # the document's public name
    url: str


# The documents rules cite, by the short key a rule names.
SOURCES = {
    "array-api": Source("Python array API standard (v2023.12 and later)",
                        "https://data-apis.org/array-api/latest/API_specification/generated/"
                        "array_api.array.__dlpack__.html"),
    "interchange": Source("Python array API standard, Data interchange mechanisms",
                          "https://data-apis.org/array-api/latest/design_topics/data_interchange.html"),
    "python-spec": Source("DLPack Python specification",
                          "https://dmlc.github.io/dlpack/latest/python_spec.html"),
    "dlpack.h": Source("dlpack.h, the DLPack C header (v1.3)",
                       "https://github.com/dmlc/dlpack/blob/main/include/dlpack/dlpack.h"),
    "exchange": Source("dlpack.h v1.3, the C exchange API (DLPackExchangeAPI)",
                       "https://dmlc.github.io/dlpack/latest/c_api.html"),
}

MUST, SHOULD, MAY = "MUST", "SHOULD", "MAY"
LEVELS = (MUST, SHOULD, MAY)
VERDICT = {MUST: "fail", SHOULD: "warn", MAY: "noted"}  # what a violation of each level is
STATUSES = ("pass", "noted", "warn", "fail", "n/a")


class NotApplicable(Exception):
    """The rule cannot be probed on this target (no read-only arrays, no exchange API, ...)."""


class Violation(Exception):
    """The target broke the rule; the message says what happened."""


class Permitted(Exception):
    """The target does something other than the rule's main case, which its sentence allows: a pass,
    with the message as the note."""


def expect(condition, message):
    if not condition:
        raise Violation(message)


@dataclass(frozen=True)
class Rule:
    """One checkable sentence of a specification: its id, its strength (MUST, SHOULD, MAY), where it
    is written and its words, and the probe that tests a target against it.

        >>> from dlbridge.testing import rules
        >>> r = next(r for r in rules() if r.id == "producer.keywords")
        >>> r.role, r.applies_to, r.level, r.source
        ('producer', 'producer', 'MUST', 'array-api')
        >>> r.citation().startswith("MUST: " + r.reference())
        True
    """

    id: str  # "producer.copy-true": role, then name
    title: str  # what must hold, one line
    level: str  # MUST, SHOULD or MAY: the quoted sentence's strength
    source: str  # a key of SOURCES
    section: str  # where in the source: the method, parameter, field or heading
    quote: str  # the sentence (or sentences) the rule comes from, verbatim
    probe: Callable

    @property
    def role(self):
        """producer, consumer or exchange (exchange rules probe producers)."""
        return self.id.partition(".")[0]

    @property
    def applies_to(self):
        return "consumer" if self.role == "consumer" else "producer"

    def reference(self):
        """'Name, section <url>'."""
        s = SOURCES[self.source]
        return f"{s.name}, {self.section} <{s.url}>"

    def citation(self):
        return f'{self.level}: {self.reference()}: "{self.quote}"'


RULES: Dict[str, Rule] = {}


def rule(id, title, level, source, section, quote):
    """Registers the decorated probe as a rule."""

    def register(probe):
        assert id not in RULES, id
        assert source in SOURCES, source
        assert level in LEVELS, level
        RULES[id] = Rule(id, title, level, source, section, " ".join(quote.split()), probe)
        return probe

    return register


@dataclass
class Result:
    """The verdict of one rule on one target: status is "pass", "noted", "warn", "fail" or "n/a",
    with what happened in `detail`.

        >>> import numpy as np
        >>> from dlbridge.testing import check_producer
        >>> (result,) = check_producer(np.zeros, only=["producer.keywords"], isolate=False).results
        >>> result.rule, result.status, result.as_dict()["level"]
        ('producer.keywords', 'pass', 'MUST')
    """

    rule: str
    status: str  # one of STATUSES
    detail: str = ""

    def as_dict(self):
        r = RULES.get(self.rule)
        out = {"rule": self.rule, "status": self.status, "detail": self.detail}
        if r is not None:
            s = SOURCES[r.source]
            out.update(title=r.title, level=r.level, source=s.name, section=r.section, url=s.url, quote=r.quote)
        return out


def describe(exc):
    return f"{type(exc).__name__}: {first_line(exc)}".rstrip(": ")


def violated(r: Rule, detail: str) -> Result:
    """The verdict on a violation of `r`: fail, warn or noted, as its sentence's level says."""
    return Result(r.id, VERDICT[r.level], detail)


def died(r: Rule, detail: str) -> Result:
    """The verdict on a process that crashed or hung in `r`'s probe: a failure, whatever r's level."""
    return Result(r.id, "fail", detail)


def run_rule(r: Rule, target) -> Result:
    try:
        detail = r.probe(target)
    except NotApplicable as exc:
        return Result(r.id, "n/a", str(exc))
    except Permitted as exc:
        return Result(r.id, "noted", str(exc))
    except Violation as exc:
        return violated(r, str(exc))
    except Exception as exc:  # the library raised where the rule expects none; Ctrl-C still stops
        return violated(r, f"unexpected {describe(exc)}")
    return Result(r.id, "pass", detail or "")
