"""Container images for the real test node, built here without a registry (no registry is reachable).

* `pause_image`: the pod sandbox, pause.c built with `gcc -static`, FROM scratch.
* `busybox_image`: Debian's busybox-static with its applet links, FROM scratch: the test workloads.
* `product_image`: rmd-agent or rmd-operator from Containerfile.agent / Containerfile.operator, on a Debian 12
  base bootstrapped here with debootstrap (or `RMD_IMAGE_BASE`).

Each image is tagged with a hash of what it is built from, and buildah keeps it in its own storage, so a
second run finds it and builds nothing; `import_images` then loads them into a containerd (docker-archive
through `ctr images import`), which takes seconds.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

log = logging.getLogger(__name__)

REPOSITORY = "localhost/rmd-k8s"
BASE_IMAGE = f"{REPOSITORY}/debian-base:bookworm"
DEBIAN_MIRROR = os.environ.get("RMD_DEBIAN_MIRROR", "http://deb.debian.org/debian")
PAUSE_SOURCE = Path(__file__).with_name("pause.c")
BUSYBOX = Path("/bin/busybox")
# What each product image is built from (Containerfile COPY sources): a change to any of them is a new tag.
PRODUCT_SOURCES = {
    "agent": (
        "Containerfile.agent",
        "image-requirements.txt",
        "pyproject.toml",
        "README.md",
        "proto/rmd_api",
        "agent/rmd_agent",
    ),
    "operator": (
        "Containerfile.operator",
        "image-requirements.txt",
        "pyproject.toml",
        "README.md",
        "proto/rmd_api",
        "operator/rmd_operator",
    ),
}


class ImageBuildError(RuntimeError):
    """A build step failed; the message carries the command and the tail of its output."""


def _run(*cmd: str, timeout: float = 1500) -> str:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if result.returncode != 0:
        raise ImageBuildError(f"{' '.join(cmd)} failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
    return result.stdout


def missing_tools() -> list[str]:
    """The programs the builds need that are not installed (./dev installs them)."""
    tools = ("buildah", "gcc", "debootstrap", "ctr")
    absent = [tool for tool in tools if shutil.which(tool) is None]
    if not BUSYBOX.exists():
        absent.append("busybox-static")
    return absent


def _exists(tag: str) -> bool:
    probe = ["buildah", "inspect", "--type", "image", tag]
    return subprocess.run(probe, capture_output=True, check=False).returncode == 0


def _digest(paths: Iterable[Path], root: Path) -> str:
    """A hash over the files under `paths` (names relative to `root`, and contents), ignoring caches."""
    sha = hashlib.sha256()
    for path in paths:
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in files:
            if "__pycache__" in file.parts or file.suffix == ".pyc":
                continue
            sha.update(str(file.relative_to(root)).encode() + b"\0" + file.read_bytes() + b"\0")
    return sha.hexdigest()[:12]


def _from_scratch(
    tag: str, files: Sequence[tuple[Path, str]], entrypoint: str, *, links: Path | None = None
) -> None:
    container = _run("buildah", "from", "scratch").strip()
    try:
        for source, dest in files:
            _run("buildah", "copy", container, str(source), dest)
        if links is not None:
            _run("buildah", "copy", container, str(links), "/")
        _run("buildah", "config", "--entrypoint", f'["{entrypoint}"]', "--cmd", "", container)
        _run("buildah", "commit", "--quiet", container, tag)
    finally:
        subprocess.run(["buildah", "rm", container], capture_output=True, check=False)


def pause_image() -> str:
    tag = f"{REPOSITORY}/pause:{_digest([PAUSE_SOURCE], PAUSE_SOURCE.parent)}"
    if not _exists(tag):
        with tempfile.TemporaryDirectory(prefix="rmd-pause-") as tmp:
            binary = Path(tmp) / "pause"
            _run("gcc", "-static", "-O2", "-o", str(binary), str(PAUSE_SOURCE))
            _from_scratch(tag, [(binary, "/pause")], "/pause")
    return tag


def busybox_image() -> str:
    tag = f"{REPOSITORY}/busybox:{_digest([BUSYBOX], BUSYBOX.parent)}"
    if not _exists(tag):
        with tempfile.TemporaryDirectory(prefix="rmd-busybox-") as tmp:
            tree = Path(tmp) / "tree"
            (tree / "bin").mkdir(parents=True)
            for applet in _run(str(BUSYBOX), "--list").split():
                if applet != "busybox":
                    (tree / "bin" / applet).symlink_to("busybox")
            _from_scratch(tag, [(BUSYBOX, "/bin/busybox")], "/bin/sh", links=tree)
    return tag


def base_image() -> str:
    """RMD_IMAGE_BASE, or Debian 12 (minbase) bootstrapped here once and kept in buildah's storage."""
    if os.environ.get("RMD_IMAGE_BASE"):
        return os.environ["RMD_IMAGE_BASE"]
    if _exists(BASE_IMAGE):
        return BASE_IMAGE
    with tempfile.TemporaryDirectory(prefix="rmd-base-", dir="/var/tmp") as tmp:
        rootfs = Path(tmp) / "rootfs"
        log.info("bootstrapping Debian 12 for the product images (once)")
        _run("debootstrap", "--variant=minbase", "bookworm", str(rootfs), DEBIAN_MIRROR)
        shutil.rmtree(rootfs / "var/lib/apt/lists", ignore_errors=True)
        for deb in (rootfs / "var/cache/apt/archives").glob("*.deb"):
            deb.unlink()
        tarball = Path(tmp) / "rootfs.tar"
        _run("tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(tarball), ".")
        container = _run("buildah", "from", "scratch").strip()
        try:
            _run("buildah", "add", container, str(tarball), "/")
            _run("buildah", "commit", "--quiet", container, BASE_IMAGE)
        finally:
            subprocess.run(["buildah", "rm", container], capture_output=True, check=False)
    return BASE_IMAGE


def product_image(component: str, repo: Path) -> str:
    """rmd-<component> built from its Containerfile (about 2 minutes cold; cached by content afterwards)."""
    sources = [repo / rel for rel in PRODUCT_SOURCES[component]]
    base = base_image()
    tag = f"{REPOSITORY}/rmd-{component}:{_digest(sources, repo)}"
    if _exists(tag):
        return tag
    cmd = ["buildah", "build", "--isolation", "chroot", "--pull=never", "--layers=false"]
    cmd += ["-f", str(repo / f"Containerfile.{component}"), "--build-arg", f"BASE_IMAGE={base}", "-t", tag]
    if os.environ.get("PIP_CERT"):  # a private CA for PyPI traffic: mounted for the build only
        cmd += ["-v", f"{os.environ['PIP_CERT']}:/run/rmd-build-ca.crt:ro"]
        cmd += ["--build-arg", "PIP_CERT=/run/rmd-build-ca.crt"]
    log.info("building %s", tag)
    _run(*cmd, str(repo))
    return tag


def import_images(tags: Iterable[str], containerd_address: str, namespace: str = "k8s.io") -> None:
    """Load buildah images into a containerd, under the same names."""
    with tempfile.TemporaryDirectory(prefix="rmd-images-", dir="/var/tmp") as tmp:
        for index, tag in enumerate(tags):
            archive = Path(tmp) / f"{index}.tar"
            _run("buildah", "push", "--quiet", tag, f"docker-archive:{archive}:{tag}")
            _run("ctr", "--address", containerd_address, "-n", namespace, "images", "import", str(archive))
