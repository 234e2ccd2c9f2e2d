"""python -m dlbridge [COMMAND] [options]. COMMAND is `report` (the default), the interop report (see
dlbridge._report), or `check TARGET`, the DLPack conformance checker (see dlbridge._check)."""

import importlib
import sys

# Each command is a module with main(argv) -> exit status, imported only when it runs.
COMMANDS = {"report": "dlbridge._report", "check": "dlbridge._check"}
SUMMARY = {
    "report": "the interop table: dtypes, layouts and flags from each installed library through dlbridge to each "
              "other (the default)",
    "check": "the DLPack conformance checker: `check TARGET` judges a library's producer and consumer against the "
             "specifications' MUST, SHOULD and MAY sentences",
}


def usage():
    lines = ["usage: python -m dlbridge [COMMAND] [options]", "", "commands:"]
    lines += [f"  {name:<8} {SUMMARY[name]}" for name in COMMANDS]
    lines += ["", "`python -m dlbridge COMMAND --help` describes a command's options."]
    return "\n".join(lines)


def main(argv=None, program=False):
    """Runs a command; `program`: the process exits when it returns (a command may then leave what
    libraries print at exit off its stdout)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    command = argv.pop(0) if argv and argv[0] in COMMANDS else "report"
    return importlib.import_module(COMMANDS[command]).main(argv, program=program)


if __name__ == "__main__":
    sys.exit(main(program=True))
