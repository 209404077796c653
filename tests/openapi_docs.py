"""Public OpenAPI documents shipped in npm packages, fetched once with ``npm pack`` and cached.

The import tests run on real documents: readme's ``@readme/oas-examples`` (Petstore as Swagger 2.0,
OpenAPI 3.0 and 3.1, JSON and YAML; circular $refs) and GitHub's ``@octokit/openapi`` (the whole
REST API). ``npm pack PKG@VERSION`` downloads a package's tarball through npm's own client (and its
registry settings); each tarball's sha512 is pinned here, so a test never reads a changed document.

Cache: ``$REACH_TEST_CACHE`` (default ``~/.cache/agent-reach-test``)/npm, one folder per package
holding its tarball and the members extracted so far. Safe for parallel test processes (a file lock).
A missing ``npm`` or an unreachable registry FAILS the test that needs the document, saying so.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

NPM_TIMEOUT = 600  # seconds for one `npm pack` (GitHub's package is 28 MB)


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    integrity: str  # the registry's dist.integrity for this version

    @property
    def folder(self) -> str:
        return f"{self.name.replace('@', '').replace('/', '+')}-{self.version}"


OAS_EXAMPLES = Package(
    "@readme/oas-examples",
    "8.2.2",
    "sha512-uytlvlylq3zpemG0h1R7ijlMBCajqXU0VpMI1Iw+j92s77Y/oT6pBf3BZN0lYl0WIGTh7POM4Jdu7L14eCzwXQ==",
)
OCTOKIT = Package(
    "@octokit/openapi",
    "23.0.2",
    "sha512-pV8M7L9GY23AybNvTmo2nyjmpmnt6+2sRE/tqr0ZLQcPS4lnw7u5eZGNmwRNkBC3D7gZXbFx5AHzLUVRBXGDhg==",
)

# the members the tests read (paths inside the package, as `tar tzf` lists them less "package/")
PETSTORE_20 = (OAS_EXAMPLES, "2.0/json/petstore.json")
PETSTORE_30 = (OAS_EXAMPLES, "3.0/json/petstore.json")
PETSTORE_30_YAML = (OAS_EXAMPLES, "3.0/yaml/petstore.yaml")
PETSTORE_31 = (OAS_EXAMPLES, "3.1/json/petstore.json")
PETSTORE_31_YAML = (OAS_EXAMPLES, "3.1/yaml/petstore.yaml")
CIRCULAR_30 = (OAS_EXAMPLES, "3.0/json/circular.json")
SCHEMA_CIRCULAR_30 = (OAS_EXAMPLES, "3.0/json/schema-circular.json")
SCHEMA_CIRCULAR_20 = (OAS_EXAMPLES, "2.0/json/schema-circular.json")
CIRCULAR_BODIES_30 = (OAS_EXAMPLES, "3.0/yaml/circular-request-bodies.yaml")
SECURITY_30 = (OAS_EXAMPLES, "3.0/json/security.json")
SCHEMA_TYPES_31 = (OAS_EXAMPLES, "3.1/json/schema-types.json")
SERVER_VARIABLES_30 = (OAS_EXAMPLES, "3.0/json/server-variables.json")
GITHUB = (OCTOKIT, "generated/api.github.com.json")


def cache_dir() -> Path:
    root = os.environ.get("REACH_TEST_CACHE") or str(Path.home() / ".cache" / "agent-reach-test")
    return Path(root) / "npm"


def document(which: tuple[Package, str]) -> Path:
    """The path of a cached document, fetched and extracted on first use."""
    package, member = which
    folder = cache_dir() / package.folder
    target = folder / member
    if target.is_file():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    with _locked(folder / ".lock"):
        if not target.is_file():
            _extract(_tarball(package, folder), member, target)
    return target


def read(which: tuple[Package, str]) -> bytes:
    return document(which).read_bytes()


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _tarball(package: Package, folder: Path) -> Path:
    tarball = folder / "package.tgz"
    if tarball.is_file() and _integrity(tarball) == package.integrity:
        return tarball
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail(
            f"npm is not installed: the OpenAPI import tests read {package.name}@{package.version} "
            "from the npm registry with `npm pack` (install Node.js and npm, e.g. `apt-get install npm`)"
        )
    with tempfile.TemporaryDirectory(dir=folder) as scratch:
        try:
            done = subprocess.run(
                [npm, "pack", f"{package.name}@{package.version}", "--pack-destination", scratch, "--silent"],
                cwd=scratch,
                capture_output=True,
                text=True,
                timeout=NPM_TIMEOUT,
            )
        except subprocess.TimeoutExpired:
            pytest.fail(f"`npm pack {package.name}@{package.version}` did not finish in {NPM_TIMEOUT} s")
        packed = sorted(Path(scratch).glob("*.tgz"))
        if done.returncode != 0 or len(packed) != 1:
            pytest.fail(
                f"`npm pack {package.name}@{package.version}` failed (exit {done.returncode}); is the npm "
                f"registry reachable? {done.stderr.strip()[-800:]}"
            )
        found = _integrity(packed[0])
        if found != package.integrity:
            pytest.fail(f"{package.name}@{package.version}: integrity {found} is not the pinned {package.integrity}")
        packed[0].replace(tarball)
    return tarball


def _integrity(path: Path) -> str:
    digest = hashlib.sha512()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return "sha512-" + base64.b64encode(digest.digest()).decode("ascii")


def _extract(tarball: Path, member: str, target: Path) -> None:
    with tarfile.open(tarball, "r:gz") as archive:
        try:
            entry = archive.getmember(f"package/{member}")
        except KeyError:
            pytest.fail(f"{tarball} has no package/{member} (check `tar tzf {tarball}`)")
        source = archive.extractfile(entry)
        assert source is not None, member
        partial = target.with_name(target.name + ".partial")
        target.parent.mkdir(parents=True, exist_ok=True)
        with source, partial.open("wb") as out:
            shutil.copyfileobj(source, out)
        partial.replace(target)
