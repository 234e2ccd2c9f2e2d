"""The catalogue: every rule module, imported in order so that each registers its rules, and the
rules a run selects. The registry itself (rules.py) imports none of them."""

from typing import Optional

from . import consumer, exchange, layout, lifetime, producer  # noqa: F401 (each registers its rules)
from .rules import RULES


def load_all():
    """Every rule, in a stable order (the modules' registration order: producer, layout, lifetime,
    exchange, consumer)."""
    order = {"producer": 0, "layout": 1, "lifetime": 2, "exchange": 3, "consumer": 4}
    return dict(sorted(RULES.items(), key=lambda item: order.get(item[1].probe.__module__.rsplit(".", 1)[-1], 5)))


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
