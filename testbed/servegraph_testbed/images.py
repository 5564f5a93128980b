"""Container images for the node tier, built here without Docker and without a registry.

Every image is built with `buildah bud` from a Dockerfile: the two we ship to users
(docker/ray.Dockerfile, docker/operator.Dockerfile) exactly as written, with local base
images passed as build arguments, and the test bed's own (hack/images/, plus the pause
image's Dockerfile from Kubernetes itself). Bases that cannot be pulled here are made
locally: a Debian bookworm root filesystem from mmdebstrap stands in for python:3.11-slim,
and hack/images/ray-base.Dockerfile for rayproject/ray. pip installs from wheelhouses
downloaded once on the host (`--build-context wheels=DIR`, `PIP_NO_INDEX=1`), so every
build runs with no network.

Each image is cached as an OCI archive under ~/.cache/servegraph/images/, keyed by the
hash of all its inputs (Dockerfile, base, wheels, build context, binaries), so a second
run builds nothing and a changed source file rebuilds only the images that contain it.

    python -m servegraph_testbed.images    # build what is missing; last line: the image set (JSON)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from servegraph_testbed.binaries import REPO_ROOT, Binaries, find_binaries
from servegraph_testbed.locks import exclusive

ENV_VAR = "SERVEGRAPH_IMAGES"  # path of an image set (JSON) that images.py printed
CACHE = Path(os.environ.get("SERVEGRAPH_CACHE", Path.home() / ".cache" / "servegraph"))
RAY_VERSION = "2.60.0"
DEBIAN_SUITE = "bookworm"  # its python3 is 3.11, as the operator requires
BASE_PACKAGES = ("python3", "python3-venv", "python-is-python3", "bash", "wget", "ca-certificates", "passwd")
# python:3.11-slim has a pip that may install system-wide; Debian's python3 does not
# (and disables ensurepip). Make the stand-in behave like it: drop the PEP 668 marker and
# install pip from the wheel Debian ships for venvs, by running pip from that wheel.
BASE_HOOK = (
    'rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED && chroot "$1" sh -c '
    '\'w=$(ls /usr/share/python-wheels/pip-*.whl) && python3 "$w/pip" install -q --no-index --no-cache-dir "$w"\''
)
# The builds' wheelhouses add setuptools: pip builds the servegraph wheel in isolation.
BUILD_REQUIREMENTS = ("setuptools>=75",)


class ImageBuildError(RuntimeError):
    """A step of an image build failed; the message carries the command and its output tail."""


@dataclass(frozen=True)
class ImageSet:
    """The archives of one build: image reference → OCI archive path."""

    archives: Mapping[str, Path]
    path: Path  # the JSON file describing this set

    @classmethod
    def load(cls, path: Path) -> ImageSet:
        data = json.loads(path.read_text())
        archives = {ref: Path(p) for ref, p in data["archives"].items()}
        missing = [str(p) for p in archives.values() if not p.is_file()]
        if missing:
            raise ImageBuildError(f"{path}: archives missing ({', '.join(missing)}); rerun python -m {__name__}")
        return cls(archives, path)

    def ref(self, role: str) -> str:
        """The image reference of a role ('ray', 'operator', 'kuberay', 'coredns', 'traefik', 'pause')."""
        data = json.loads(self.path.read_text())
        ref: str = data["roles"][role]
        return ref


@dataclass
class _Image:
    role: str
    ref: str
    dockerfile: Path
    context: Path
    build_args: dict[str, str] = field(default_factory=dict)
    contexts: dict[str, Path] = field(default_factory=dict)  # --build-context name=dir
    ignorefile: Path | None = None
    inputs: list[str] = field(default_factory=list)  # digests of everything else it depends on


class Builder:
    """Runs buildah with the cache's own storage (nothing in /var/lib/containers)."""

    def __init__(self, cache: Path = CACHE, log: Path | None = None) -> None:
        self.cache = cache
        self.images = cache / "images"
        self.images.mkdir(parents=True, exist_ok=True)
        self.storage = cache / "buildah"
        self.log_path = log or self.images / "build.log"

    def buildah(self, *args: str) -> str:
        argv = [
            "buildah",
            f"--root={self.storage / 'root'}",
            f"--runroot={self.storage / 'run'}",
            "--storage-driver=overlay",
            *args,
        ]
        return self._run(argv)

    def _run(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
        with self.log_path.open("ab") as log:
            log.write(f"\n=== {time.strftime('%H:%M:%S')} {' '.join(argv)}\n".encode())
            log.flush()
            proc = subprocess.run(list(argv), stdout=subprocess.PIPE, stderr=log, env=env, check=False)
        if proc.returncode != 0:
            tail = "\n".join(self.log_path.read_text(errors="replace").splitlines()[-40:])
            raise ImageBuildError(f"`{' '.join(argv)}` failed with exit code {proc.returncode}:\n{tail}")
        return proc.stdout.decode()

    def has_image(self, ref: str) -> bool:
        try:
            self.buildah("inspect", "--type=image", "--format={{.FromImageID}}", ref)
        except ImageBuildError:
            return False
        return True

    # ---- the pieces -----------------------------------------------------------------

    def python_base(self) -> tuple[str, str]:
        """A Debian root filesystem standing in for python:3.11-slim; (ref, key)."""
        key = _digest(DEBIAN_SUITE, *BASE_PACKAGES, BASE_HOOK)
        ref = f"localhost/servegraph-testbed/python-base:{DEBIAN_SUITE}-{key[:12]}"
        if self.has_image(ref):
            return ref, key
        _say(f"building {ref} with mmdebstrap (first run only)")
        with tempfile.TemporaryDirectory(prefix="sg-base-", dir=self.images) as tmp:
            tar = Path(tmp) / "rootfs.tar"
            self._run(
                [
                    "mmdebstrap",
                    "--variant=minbase",
                    f"--include={','.join(BASE_PACKAGES)}",
                    f"--customize-hook={BASE_HOOK}",
                    DEBIAN_SUITE,
                    str(tar),
                ]
            )
            container = self.buildah("from", "scratch").strip()
            try:
                self.buildah("add", container, str(tar), "/")
                self.buildah(
                    "config",
                    "--env=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    "--env=LANG=C.UTF-8",
                    "--cmd=python3",
                    container,
                )
                self.buildah("commit", "--quiet", container, ref)
            finally:
                self.buildah("rm", container)
        return ref, key

    def wheelhouse(self, name: str, requirements: Sequence[str]) -> tuple[Path, str]:
        """Wheels for `requirements`, downloaded once by the host's pip; (dir, key).

        The host runs the same CPython minor and glibc as the images' Debian base, so what
        pip picks here installs there.
        """
        key = _digest(sys.version_info[:2].__repr__(), *sorted(requirements))
        out = self.images / f"wheels-{name}-{key[:16]}"
        if not (out / ".complete").is_file():
            _say(f"downloading the {name} wheelhouse (first run only)")
            shutil.rmtree(out, ignore_errors=True)
            env = {k: v for k, v in os.environ.items() if k != "PIP_FIND_LINKS"}
            self._run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--quiet",
                    "--only-binary=:all:",
                    f"--dest={out}",
                    *requirements,
                ],
                env=env,
            )
            (out / ".complete").write_text("\n".join(requirements) + "\n")
        return out, key

    def build(self, image: _Image) -> Path:
        """The OCI archive of `image`, built unless the cache has one for the same inputs."""
        key = _digest(
            image.ref,
            image.dockerfile.read_text(),
            json.dumps(image.build_args, sort_keys=True),
            *image.inputs,
        )
        slug = image.ref.rsplit("/", 1)[-1].replace(":", "-")
        archive = self.images / f"{slug}-{key[:16]}.tar"
        if archive.is_file():
            return archive
        shown = (
            image.dockerfile.relative_to(REPO_ROOT) if image.dockerfile.is_relative_to(REPO_ROOT) else image.dockerfile
        )
        _say(f"building {image.ref} from {shown}")
        start = time.monotonic()
        argv = [
            "bud",
            "--isolation=chroot",
            "--pull=never",
            "--layers=false",
            f"--file={image.dockerfile}",
            f"--tag={image.ref}",
        ]
        argv += [f"--build-arg={k}={v}" for k, v in image.build_args.items()]
        argv += [f"--build-context={k}={v}" for k, v in image.contexts.items()]
        if image.ignorefile is not None:
            argv.append(f"--ignorefile={image.ignorefile}")
        self.buildah(*argv, str(image.context))
        tmp = archive.with_suffix(".tmp")
        tmp.unlink(missing_ok=True)
        self.buildah("push", "--quiet", image.ref, f"oci-archive:{tmp}:{image.ref}")
        tmp.rename(archive)
        _say(f"built {image.ref} in {time.monotonic() - start:.0f} s")
        return archive


def build_images(binaries: Binaries | None = None, cache: Path = CACHE) -> ImageSet:
    """Build (or find in the cache) every image the node tier runs."""
    from servegraph import __version__

    binaries = binaries or find_binaries()
    lock_path = cache / "images" / ".lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with exclusive(lock_path):
        b = Builder(cache)
        base_ref, base_key = b.python_base()
        ray_wheels, ray_wheels_key = b.wheelhouse("ray", [f"ray[serve]=={RAY_VERSION}", *BUILD_REQUIREMENTS])
        op_wheels, op_wheels_key = b.wheelhouse("operator", [*_operator_requirements(), *BUILD_REQUIREMENTS])
        offline = {"PIP_NO_INDEX": "1"}
        sources = _tree_digest(REPO_ROOT, ("pyproject.toml", "README.md", "src"))

        ray_base = _Image(
            "ray-base",
            f"localhost/servegraph-testbed/ray-base:{RAY_VERSION}",
            REPO_ROOT / "hack" / "images" / "ray-base.Dockerfile",
            REPO_ROOT / "hack" / "images",
            {"PYTHON_IMAGE": base_ref, "RAY_VERSION": RAY_VERSION, **offline},
            {"wheels": ray_wheels},
            inputs=[base_key, ray_wheels_key],
        )
        ray_base_archive = b.build(ray_base)
        if not b.has_image(ray_base.ref):  # the archive came from the cache, the storage was wiped
            b.buildah("pull", "--quiet", f"oci-archive:{ray_base_archive}")

        images = [
            _Image(
                "ray",
                f"ghcr.io/servegraph/servegraph-ray:{__version__}",
                REPO_ROOT / "docker" / "ray.Dockerfile",
                REPO_ROOT,
                {"PYTHON_IMAGE": base_ref, "RAY_IMAGE": ray_base.ref, **offline},
                {"wheels": ray_wheels},
                REPO_ROOT / "docker" / "ray.Dockerfile.dockerignore",
                [base_key, ray_base_archive.name, ray_wheels_key, sources],
            ),
            _Image(
                "operator",
                f"ghcr.io/servegraph/servegraph-operator:{__version__}",
                REPO_ROOT / "docker" / "operator.Dockerfile",
                REPO_ROOT,
                {"PYTHON_IMAGE": base_ref, **offline},
                {"wheels": op_wheels},
                REPO_ROOT / "docker" / "operator.Dockerfile.dockerignore",
                [base_key, op_wheels_key, sources],
            ),
        ]
        roles = {"ray": images[0].ref, "operator": images[1].ref}
        archives = {i.ref: b.build(i) for i in images}
        with tempfile.TemporaryDirectory(prefix="sg-ctx-", dir=b.images) as tmp:
            for role, ref, dockerfile, files, args in _binary_images(binaries, Path(tmp)):
                image = _Image(role, ref, dockerfile, files, args, inputs=[_tree_digest(files, ("",))])
                archives[ref] = b.build(image)
                roles[role] = ref
        set_key = _digest(*sorted(str(p) for p in archives.values()))
        set_path = b.images / f"set-{set_key[:16]}.json"
        set_path.write_text(
            json.dumps({"archives": {r: str(p) for r, p in archives.items()}, "roles": roles}, indent=2) + "\n"
        )
        return ImageSet(archives, set_path)


def find_images(binaries: Binaries | None = None) -> ImageSet:
    """$SERVEGRAPH_IMAGES if set, else build (or find in the cache) every image."""
    if configured := os.environ.get(ENV_VAR):
        return ImageSet.load(Path(configured))
    return build_images(binaries)


def _binary_images(binaries: Binaries, tmp: Path) -> Iterator[tuple[str, str, Path, Path, dict[str, str]]]:
    """(role, ref, Dockerfile, context, build args) of the images made of one static binary."""
    images = REPO_ROOT / "hack" / "images"
    version = binaries.versions
    for role, binary, ref in (
        ("kuberay", binaries.kuberay_operator, f"localhost/servegraph-testbed/kuberay-operator:{version['KUBERAY']}"),
        ("coredns", binaries.coredns, f"localhost/servegraph-testbed/coredns:{version['COREDNS']}"),
        ("traefik", binaries.traefik, f"localhost/servegraph-testbed/traefik:{version['TRAEFIK']}"),
    ):
        ctx = tmp / role
        ctx.mkdir()
        shutil.copy2(binary.resolve(), ctx / binary.name)
        yield role, ref, images / f"{binary.name}.Dockerfile", ctx, {}
    # Kubernetes' own pause Dockerfile: `FROM ${BASE}`, `ADD bin/pause-linux-${ARCH} /pause`.
    ctx = tmp / "pause"
    (ctx / "bin").mkdir(parents=True)
    shutil.copy2(binaries.pause.resolve(), ctx / "bin" / "pause-linux-amd64")
    ref = f"registry.k8s.io/pause:{version['PAUSE']}"
    yield "pause", ref, binaries.pause_dockerfile, ctx, {"BASE": "scratch", "ARCH": "amd64"}


def _operator_requirements() -> list[str]:
    """servegraph's own dependencies plus its `operator` extra, from pyproject.toml."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    return [*project["dependencies"], *project["optional-dependencies"]["operator"]]


def _digest(*parts: str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def _tree_digest(root: Path, entries: Sequence[str]) -> str:
    """sha256 over the paths and contents of files under root/entry (caches and eggs skipped)."""
    h = hashlib.sha256()
    for entry in entries:
        top = root / entry
        files = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
        for path in files:
            rel = path.relative_to(root).as_posix()
            if "__pycache__" in rel or ".egg-info" in rel or rel.endswith(".pyc"):
                continue
            h.update(rel.encode() + b"\0")
            h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def _say(text: str) -> None:
    print(f"images: {text}", file=sys.stderr, flush=True)


def main() -> int:
    argparse.ArgumentParser(prog=f"python -m {__name__}", description=__doc__).parse_args()
    try:
        images = build_images()
    except ImageBuildError as e:
        print(f"images: {e}", file=sys.stderr)
        return 1
    print(images.path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
