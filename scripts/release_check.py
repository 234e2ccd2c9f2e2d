"""Checks a wheelhouse that scripts/release.sh built, file by file, and prints it with each wheel's tags.

    python scripts/release_check.py WHEELHOUSE VERSION PYTHONS...   (PYTHONS: 3.10 3.11 ...)

Fails (exit 1, one line per problem) unless:
- there is one sdist and exactly one wheel per (CPython version, architecture): x86_64 and aarch64;
- each wheel is tagged cpXY-cpXY-manylinux2014_ARCH.manylinux_2_17_ARCH (cpXY-cpXYt-... for a
  free-threaded build, PYTHONS naming it 3.14t), its WHEEL file says the same, and its native module
  is named for that ABI and is an ELF file for that machine;
- the version is VERSION everywhere (file names, METADATA, PKG-INFO);
- METADATA names the licence (License-Expression) and both licence files, which are inside, byte for
  byte the repository's LICENSE-MIT and LICENSE-APACHE (the sdist carries them too).
The platform tag's truth (no symbol newer than glibc 2.17) is auditwheel's check, run by release.sh.
"""

import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LICENSES = ("LICENSE-MIT", "LICENSE-APACHE")
# ELF e_machine of each architecture, as the wheel tag spells it.
MACHINES = {"x86_64": 62, "aarch64": 183}


def elf_machine(data):
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None  # not a 64-bit little-endian ELF file
    return int.from_bytes(data[18:20], "little")


def check_wheel(path, version, problems):
    name, ver, pytag, abitag, plat = path.name[: -len(".whl")].split("-")
    arch = "x86_64" if plat.endswith("x86_64") else "aarch64" if plat.endswith("aarch64") else "?"
    want_plat = f"manylinux2014_{arch}.manylinux_2_17_{arch}"
    if (name, ver) != ("dlbridge", version):
        problems.append(f"{path.name}: expected dlbridge {version}")
    if not pytag.startswith("cp") or abitag not in (pytag, pytag + "t") or plat != want_plat:
        problems.append(f"{path.name}: expected cpXY-cpXY-{want_plat} or cpXY-cpXYt-{want_plat}")
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        info = f"dlbridge-{ver}.dist-info"
        wheel = Parser().parsestr(z.read(f"{info}/WHEEL").decode())
        tags = sorted(wheel.get_all("Tag") or [])
        want_tags = sorted(f"{pytag}-{abitag}-{p}" for p in plat.split("."))
        if tags != want_tags:
            problems.append(f"{path.name}: WHEEL says {tags}, the name says {want_tags}")
        meta = Parser().parsestr(z.read(f"{info}/METADATA").decode())
        check_metadata(path.name, meta, version, problems)
        for lic in LICENSES:
            member = f"{info}/licenses/{lic}"
            if member not in names:
                problems.append(f"{path.name}: {member} is missing")
            elif z.read(member) != (ROOT / lic).read_bytes():
                problems.append(f"{path.name}: {member} differs from the repository's {lic}")
        so = f"dlbridge/_native.cpython-{abitag[2:]}-{arch}-linux-gnu.so"
        if so not in names:
            problems.append(f"{path.name}: no {so} (found {[n for n in names if n.endswith('.so')]})")
        elif elf_machine(z.read(so)[:20]) != MACHINES.get(arch):
            problems.append(f"{path.name}: {so} is not an ELF file for {arch}")
    return abitag, arch, tags


def check_metadata(where, meta, version, problems):
    if meta["Version"] != version:
        problems.append(f"{where}: metadata version {meta['Version']}, expected {version}")
    if meta["License-Expression"] != "MIT OR Apache-2.0":
        problems.append(f"{where}: License-Expression is {meta['License-Expression']!r}")
    if sorted(meta.get_all("License-File") or []) != sorted(LICENSES):
        problems.append(f"{where}: License-File entries {meta.get_all('License-File')}")


def check_sdist(path, version, problems):
    top = path.name[: -len(".tar.gz")]
    if top != f"dlbridge-{version}":
        problems.append(f"{path.name}: expected dlbridge-{version}.tar.gz")
    with tarfile.open(path) as tar:
        names = set(tar.getnames())
        meta = Parser().parsestr(tar.extractfile(f"{top}/PKG-INFO").read().decode())
        check_metadata(path.name, meta, version, problems)
        for lic in LICENSES:
            if f"{top}/{lic}" not in names:
                problems.append(f"{path.name}: {top}/{lic} is missing")
            elif tar.extractfile(f"{top}/{lic}").read() != (ROOT / lic).read_bytes():
                problems.append(f"{path.name}: {lic} differs from the repository's")
        for needed in ("Cargo.lock", "pyproject.toml", "dlbridge/src/lib.rs", "dlbridge-pyo3/src/lib.rs"):
            if f"{top}/{needed}" not in names:
                problems.append(f"{path.name}: {needed} is missing")


def main(argv):
    house, version, pythons = Path(argv[0]), argv[1], argv[2:]
    problems = []
    wheels = sorted(house.glob("*.whl"))
    sdists = sorted(house.glob("*.tar.gz"))
    seen = {}
    rows = []
    for path in wheels:
        abitag, arch, tags = check_wheel(path, version, problems)
        seen.setdefault((abitag, arch), []).append(path.name)
        rows.append((path.name, path.stat().st_size, ", ".join(tags)))
    want = {(f"cp{v.replace('.', '')}", arch) for v in pythons for arch in MACHINES}
    for key in sorted(want - set(seen)):
        problems.append(f"no wheel for {key[0]} {key[1]}")
    for key, names in sorted(seen.items()):
        if key not in want or len(names) > 1:
            problems.append(f"unexpected wheel(s) for {key[0]} {key[1]}: {names}")
    if len(sdists) != 1:
        problems.append(f"expected one sdist, found {[p.name for p in sdists]}")
    for path in sdists:
        check_sdist(path, version, problems)
        rows.append((path.name, path.stat().st_size, "sdist"))

    width = max(len(r[0]) for r in rows) if rows else 0
    print(f"wheelhouse {house}:")
    for name, size, tags in rows:
        print(f"  {name:<{width}}  {size / 1024:7.0f} KiB  {tags}")
    for p in problems:
        print(f"release check: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
