"""python -m dlbridge [COMMAND] [options]. COMMAND is `report` (the default), the interop report (see
dlbridge._report), or `check TARGET`, the DLPack conformance checker (see dlbridge._check)."""

import importlib
import sys

# Each command is a module with main(argv) -> exit status, imported only when it runs.
COMMANDS = {"report": "dlbridge._report", "check": "dlbridge._check"}


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv.pop(0) if argv and argv[0] in COMMANDS else "report"
    return importlib.import_module(COMMANDS[command]).main(argv)


if __name__ == "__main__":
    sys.exit(main())
