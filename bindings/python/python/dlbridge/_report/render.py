"""Printing the table: Markdown, or plain text grouped by producer with errors listed in full."""

import dlbridge

from .cases import CASES
from .libs import HELPERS, probe
from .peers import PEERS

LEGEND = [
    "✔ = zero-copy: the consumer sees the right values in the producer's own memory; "
    "copy = the right values, in other memory; copy (unaligned source) = the consumer copies memory "
    "that is not 64-byte aligned; an error is the consumer's unless marked [producer] or [into dlbridge]; "
    "not available (why) = the case cannot be built here: a library is missing, or the producer "
    "cannot hold it.",
    "(writable!) = the consumer got a writable array from a source that was read-only, or whose "
    "writability is unknown. The rule (README.md, section \"Writability\"): a legacy capsule cannot carry "
    "READ_ONLY; dlbridge treats writability from a legacy import as unknown and re-exports it as read-only.",
]


def libraries_line():
    """'found: numpy 2.4, torch ...; not installed: jax, ...; unusable: ...' for the peers and helpers."""
    groups: dict[str, list[str]] = {"found": [], "not installed": [], "unusable": []}
    for name in [*PEERS, *HELPERS]:
        status, detail = probe(name)
        if status == "found":
            groups[status].append(f"{name} {detail}")
        else:
            groups[status].append(f"{name} ({detail})" if detail else name)
    return "; ".join(f"{status}: {', '.join(names)}" for status, names in groups.items() if names)


def header():
    major, minor = dlbridge.DLPACK_VERSION
    title = f"dlbridge {dlbridge.__version__} (DLPack {major}.{minor}); paths are producer → dlbridge → consumer"
    return [title, libraries_line(), ""]


def nothing_to_pair():
    """In place of the table when no column can be made: what is missing, and what to install."""
    takers = ", ".join(name for name, peer in PEERS.items() if peer.consumer)
    return header() + [
        f"Nothing to pair: each column takes one library's arrays through dlbridge into a library that takes "
        f"them in ({takers}), and none of those imports here.",
        "Install one to see the table, e.g. `pip install numpy` (or torch, jax, ...).",
    ]


def markdown(table, keys):
    names = [f"{p} → {c}" for p, c in keys]
    lines = ["| case | " + " | ".join(names) + " |", "|---|" + "---|" * len(keys)]
    for name, _ in CASES:
        lines.append(f"| {name} | " + " | ".join(table[name][k].replace("|", "\\|") for k in keys) + " |")
    return header() + lines + [""] + LEGEND


def _is_error(verdict):
    return not verdict.startswith(("✔", "copy", "not available"))


def plain(table, keys, width=24):
    """One block per producer; cells cut to `width`, so errors are repeated in full at the end."""
    lines = header()
    first = max(len(name) for name, _ in CASES)
    for producer in dict(keys):  # producers, in order
        group = [k for k in keys if k[0] == producer]
        lines.append(f"producer: {producer}")
        titles = "  ".join(f"→ {c}".ljust(width) for _, c in group)
        lines.append(("  " + "case".ljust(first) + "  " + titles).rstrip())
        for name, _ in CASES:
            cells = [table[name][k].replace("not available", "n/a") for k in group]
            cut = [(c if len(c) <= width else c[:width - 1] + "…").ljust(width) for c in cells]
            lines.append("  " + name.ljust(first) + "  " + "  ".join(cut).rstrip())
        lines.append("")
    lines += LEGEND
    errors = sorted({(f"{p} → {c}", name, table[name][p, c])
                     for name, _ in CASES for p, c in keys if _is_error(table[name][p, c])})
    if errors:
        lines += ["", "errors in full:"] + [f"  {key:>22}  {name}: {value}" for key, name, value in errors]
    return lines
