"""What `pip install torch==2.13.0` downloads from PyPI on Linux x86_64: torch and the CUDA wheels it pins.

    python scripts/torch_download_size.py 3.13          # CPython 3.13 (INSTALL.md's figure)

Reads PyPI's JSON API (https://pypi.org/pypi/<name>/json) and each wheel's metadata file (PEP 658), follows
torch's Requires-Dist for Linux (with the extras cuda-toolkit is asked for), picks the newest matching
version's manylinux x86_64 (or pure-Python) wheel, and adds up the wheel sizes PyPI lists. Network access to
PyPI is needed; nothing is installed. A dependency needed by two packages is counted once, at the version met
first, so the total is close to, not exactly, what pip would pick.
"""
import json
import sys
import urllib.parse
import urllib.request

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

PYPI = "https://pypi.org/pypi/{}/json"


def fetch(url):
    with urllib.request.urlopen(url, timeout=60) as response:
        return response.read()


def linux_wheel(files, cp):
    """The first wheel among files that installs on CPython cp (e.g. 'cp313') on Linux x86_64."""
    for f in files:
        if not f["filename"].endswith(".whl"):
            continue
        for tag in parse_wheel_filename(f["filename"])[3]:
            platform_ok = tag.platform == "any" or ("linux" in tag.platform and "x86_64" in tag.platform)
            python_ok = tag.interpreter in (cp, "py3") or tag.interpreter.startswith("py3")
            if platform_ok and python_ok and tag.abi in ("none", "abi3", cp):
                return f
    return None


def pick(requirement, cp):
    """(version, wheel file entry) of the newest release that satisfies requirement."""
    url = PYPI.format(requirement.name)
    releases = json.loads(fetch(url))["releases"]
    matching = [v for v in releases if requirement.specifier.contains(v)]
    for version in sorted(matching, key=Version, reverse=True):
        wheel = linux_wheel(releases[version], cp)
        if wheel:
            return version, {**wheel, "url": urllib.parse.urljoin(url, wheel["url"])}
    raise SystemExit(f"no Linux x86_64 wheel for {requirement} on {cp}")


def dependencies(wheel, extras, environment):
    """The Requires-Dist entries of a wheel that apply to this environment and these extras."""
    try:
        metadata = fetch(wheel["url"] + ".metadata").decode()
    except OSError:
        return []  # no PEP 658 metadata: counted without its dependencies
    found = []
    for line in metadata.splitlines():
        if line.startswith("Requires-Dist:"):
            requirement = Requirement(line.split(":", 1)[1])
            marker = requirement.marker
            if marker is None or any(marker.evaluate({**environment, "extra": e}) for e in ["", *extras]):
                found.append(requirement)
    return found


def download_sizes(root, python):
    """{name: (version, bytes)} for root and everything it pulls in on Linux x86_64."""
    cp = "cp" + python.replace(".", "")
    environment = {**default_environment(), "python_version": python, "python_full_version": python + ".0",
                   "platform_system": "Linux", "sys_platform": "linux", "platform_machine": "x86_64"}
    sizes, queue = {}, [Requirement(root)]
    while queue:
        requirement = queue.pop(0)
        name = canonicalize_name(requirement.name)
        if name in sizes:
            continue
        version, wheel = pick(requirement, cp)
        sizes[name] = (version, wheel["size"])
        queue += dependencies(wheel, requirement.extras, environment)
    return sizes


def main():
    python = sys.argv[1] if len(sys.argv) > 1 else "3.13"
    sizes = download_sizes("torch==2.13.0", python)
    cuda = {n: s for n, s in sizes.items() if n.startswith(("nvidia", "cuda", "triton"))}
    for name, (version, size) in sorted(sizes.items(), key=lambda item: -item[1][1]):
        print(f"{size / 1e6:8.1f} MB  {name}=={version}")
    print(f"total {sum(s for _, s in sizes.values()) / 1e9:.2f} GB in {len(sizes)} wheels; torch "
          f"{sizes['torch'][1] / 1e6:.0f} MB; {len(cuda)} CUDA/NVIDIA/Triton wheels "
          f"{sum(s for _, s in cuda.values()) / 1e9:.2f} GB (CPython {python}, Linux x86_64, PyPI)")


if __name__ == "__main__":
    main()
