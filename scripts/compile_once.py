"""Checks that CI compiles each heavy dependency once: every unit of a heavy crate's tree (HEAVY)
that an example extension's own build (`maturin develop`, a `cargo rustc -p EXAMPLE` in the dev
profile) compiles must be the very unit that `cargo test --workspace --all-features` (./dev test)
compiled before it, with the same features and profile, so that cargo finds it fresh. Run by
`./dev house`; prints each difference and exits 1 on any. Reads cargo's unit graphs
(`-Z unstable-options --unit-graph`, on the stable toolchain through RUSTC_BOOTSTRAP).

Light crates (half, num-traits, syn, ...) may build twice, in seconds: unifying them too would put
workspace-only dependencies into the examples that users copy. PyO3 builds twice by necessity: an
extension module does not link libpython, which its build scripts decide."""

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Crates whose trees take minutes to compile.
HEAVY = ("candle-core",)


def unit_graph(*args):
    env = dict(os.environ, RUSTC_BOOTSTRAP="1")
    out = subprocess.run(["cargo", *args, "-Z", "unstable-options", "--unit-graph"], cwd=ROOT, env=env,
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)["units"]


def package_name(pkg_id):
    # "registry+https://...#name@1.2.3", or "path+file:///...#0.1.0" for a member named by its folder.
    tail = pkg_id.rsplit("#", 1)[-1]
    return tail.split("@")[0] if "@" in tail else None


def unit_key(unit):
    """What makes cargo compile a unit again: its package, target, mode, platform, features and the
    whole profile (but its name: `test` and `dev` units with the same settings are one)."""
    profile = {k: v for k, v in unit["profile"].items() if k != "name"}
    return (unit["pkg_id"], unit["target"]["name"], unit["mode"], unit["platform"],
            tuple(unit["features"]), profile.get("opt_level"), profile.get("debuginfo"), json.dumps(profile, sort_keys=True))


def heavy_units(units):
    """The units of the heavy crates and of everything they depend on."""
    pending = [i for i, u in enumerate(units) if package_name(u["pkg_id"]) in HEAVY]
    seen = set()
    while pending:
        i = pending.pop()
        if i not in seen:
            seen.add(i)
            pending.extend(d["index"] for d in units[i]["dependencies"])
    return {unit_key(units[i]) for i in seen}


def differences(workspace_units, example_units):
    """The example's heavy units that the workspace build did not compile, sorted."""
    return sorted(heavy_units(example_units) - heavy_units(workspace_units))


def examples():
    for pyproject in sorted((ROOT / "examples").glob("*/pyproject.toml")):
        manifest = tomllib.loads((pyproject.parent / "Cargo.toml").read_text())
        features = tomllib.loads(pyproject.read_text()).get("tool", {}).get("maturin", {}).get("features", [])
        # ./dev builds an example that has a `testing` feature with it.
        yield manifest["package"]["name"], features + (["testing"] if "testing" in manifest.get("features", {}) else [])


def report(build, reference, found):
    for key in found:
        print(f"compile_once: {build} compiles {key[0].rsplit('#', 1)[-1]} ({key[1]}, {key[2]}) "
              f"with features {list(key[4])}, opt-level {key[5]}, debuginfo {key[6]}, which {reference} "
              f"does not: add what differs to tests/workspace-unify")
    return bool(found)


def main():
    # Full builds: `./dev test`'s cargo test, then each example's maturin develop.
    workspace = unit_graph("test", "--workspace", "--all-features", "--no-run")
    failed = False
    for name, features in examples():
        args = ["rustc", "-p", name, "--lib"] + (["--features", ",".join(features)] if features else [])
        failed |= report(f"{name}'s own build", "`cargo test --workspace --all-features`",
                         differences(workspace, unit_graph(*args)))
    # Metadata-only builds: clippy's check build, then rustdoc's (`./dev doc`).
    checked = unit_graph("check", "--workspace", "--all-targets", "--all-features")
    documented = unit_graph("doc", "--no-deps", "-p", "dlbridge", "-p", "dlbridge-pyo3", "-p", "workspace-unify",
                            "--all-features")
    failed |= report("`./dev doc`", "clippy's check build", differences(checked, documented))
    if not failed:
        print(f"compile_once: {', '.join(HEAVY)} is compiled once and checked once: each example's build and "
              f"rustdoc reuse the units of `cargo test` and of clippy")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
