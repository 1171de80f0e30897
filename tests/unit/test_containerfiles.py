"""Containerfile.agent and Containerfile.operator: a lint of what they promise, and an opt-in real build.

The lint reads the files (no builder needed): the base image is a build argument with a pinned default,
the builds are multi-stage and the final stage carries only the interpreter and the venv, Python packages
are installed from image-requirements.txt with hashes only, only the needed sources are copied (and the
ignore file lets nothing else into the context), and the operator runs as a non-root numeric user.

The build test runs unless RMD_BUILD_IMAGES=0 (2.5 to 3.5 minutes on 2 cores when cold, network to a Debian
mirror and PyPI; ./dev installs buildah and debootstrap): rmd_sim.realnode.images builds both images with
buildah and chroot isolation from a base image bootstrapped here with debootstrap, or from RMD_IMAGE_BASE,
and keeps them by content hash (the real-node tier installs the same images); then each image's program runs
once.
Chroot isolation needs no OCI runtime or cgroups (crun refuses this machine's hybrid cgroup layout);
$PIP_CERT, when set, is mounted for the build only (a private CA in front of PyPI).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

from rmd_sim.realnode import images

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "image-requirements.txt"
IMAGES = {"agent": REPO / "Containerfile.agent", "operator": REPO / "Containerfile.operator"}
# What each image needs from the repository (besides the lock file and the distribution's metadata).
SOURCES = {
    "agent": {"proto/rmd_api", "agent/rmd_agent"},
    "operator": {"proto/rmd_api", "operator/rmd_operator"},
}
COMMON_SOURCES = {"image-requirements.txt", "pyproject.toml", "README.md"}


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str


@dataclass(frozen=True)
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction]

    def all(self, keyword: str) -> list[str]:
        return [i.args for i in self.instructions if i.keyword == keyword]


def parse(path: Path) -> tuple[list[Instruction], list[Stage]]:
    """Instructions before the first FROM, and the stages. Joins continuation lines, drops comments."""
    logical: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "dangling line continuation"
    preamble: list[Instruction] = []
    stages: list[Stage] = []
    for line in logical:
        keyword, _, args = line.partition(" ")
        instruction = Instruction(keyword.upper(), " ".join(args.split()))
        if instruction.keyword == "FROM":
            base, _, name = instruction.args.partition(" AS ")
            stages.append(Stage(base.strip(), name.strip() or None, []))
        elif stages:
            stages[-1].instructions.append(instruction)
        else:
            preamble.append(instruction)
    return preamble, stages


def base_image_default(preamble: list[Instruction]) -> str:
    args = dict(i.args.split("=", 1) for i in preamble if i.keyword == "ARG" and "=" in i.args)
    assert "BASE_IMAGE" in args, "the base image must be the build argument BASE_IMAGE"
    return args["BASE_IMAGE"]


def is_pinned(reference: str) -> bool:
    """A digest, or a tag that names one build: a date (bookworm-20251229-slim) or a full version (3.11.2)."""
    if re.search(r"@sha256:[0-9a-f]{64}$", reference):
        return True
    name, _, tag = reference.rpartition(":")
    if not name or "/" in tag:
        return False  # no tag at all (a registry port is not a tag)
    return tag != "latest" and bool(re.search(r"(^|\D)(\d{8}|\d+\.\d+\.\d+)(\D|$)", tag))


def apt_packages(run: str) -> list[str]:
    found = re.findall(r"apt-get install ((?:-\S+ )*)((?:[a-z0-9][a-z0-9.+-]* ?)+)", run)
    packages: list[str] = []
    for options, names in found:
        assert "--no-install-recommends" in options, run
        packages += names.split()
    return packages


@pytest.mark.parametrize(
    "reference", ["debian:bookworm-20251229-slim", "python:3.11.2-slim", "x@sha256:" + "0" * 64]
)
def test_pinned_references(reference: str) -> None:
    assert is_pinned(reference)


@pytest.mark.parametrize(
    "reference", ["debian:bookworm-slim", "debian:latest", "debian", "registry:5000/debian"]
)
def test_floating_references(reference: str) -> None:
    assert not is_pinned(reference)


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_base_image_is_a_pinned_build_argument(image: str) -> None:
    path = IMAGES[image]
    preamble, stages = parse(path)
    assert is_pinned(base_image_default(preamble))
    assert "latest" not in path.read_text()
    names = {s.name for s in stages if s.name}
    for stage in stages:
        assert stage.base == "${BASE_IMAGE}" or stage.base in names, stage.base


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_multi_stage_with_a_small_final_stage(image: str) -> None:
    _, stages = parse(IMAGES[image])
    assert len(stages) >= 2
    build, final = stages[0], stages[-1]
    assert build.name and final.name is None
    assert any(a.startswith(f"--from={build.name} ") for a in final.all("COPY"))
    # The final stage gets the interpreter only; build tools (venv, pip, setuptools) stay in the build stage.
    final_runs = final.all("RUN")
    assert [p for run in final_runs for p in apt_packages(run)] == ["python3"]
    assert "python3-venv" in [p for run in build.all("RUN") for p in apt_packages(run)]
    for stage in stages:
        for run in stage.all("RUN"):
            if "apt-get install" in run:
                assert "rm -rf /var/lib/apt/lists/*" in run  # in the same layer
    assert all(a.startswith(f"--from={build.name} ") for a in final.all("COPY"))  # only the venv
    build_runs = " ".join(build.all("RUN"))
    assert re.search(r"pip uninstall --yes \S* ?setuptools pip", build_runs), "build tools leave the venv"


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_python_packages_come_from_the_lock_with_hashes(image: str) -> None:
    _, stages = parse(IMAGES[image])
    installs = [r for s in stages for r in s.all("RUN") if "pip install" in r]
    locked = [r for r in installs if "-r /src/image-requirements.txt" in r]
    assert len(locked) == 1
    assert all(flag in locked[0] for flag in ("--require-hashes", "--no-deps", "--only-binary=:all:"))
    # Our own distribution: no dependency resolution, no build isolation (which would fetch setuptools).
    own = [r for r in installs if r not in locked]
    assert own and all("--no-deps" in r and "--no-build-isolation" in r for r in own)


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_copies_only_what_the_image_needs(image: str) -> None:
    _, stages = parse(IMAGES[image])
    copied: set[str] = set()
    for stage in stages:
        for args in stage.all("COPY"):
            if args.startswith("--from="):
                continue
            *sources, _ = args.split()
            copied |= set(sources)
    assert copied == COMMON_SOURCES | SOURCES[image]
    for source in copied:
        assert (REPO / source).exists(), source


def test_ignore_file_admits_exactly_the_copied_sources() -> None:
    lines = [ln for ln in (REPO / ".dockerignore").read_text().splitlines() if ln and not ln.startswith("#")]
    assert lines[0] == "*"  # everything out, then the needed paths back in
    admitted = {ln[1:].rstrip("/") for ln in lines if ln.startswith("!")}
    assert admitted == COMMON_SOURCES | set().union(*SOURCES.values())


def test_operator_runs_as_the_charts_non_root_user() -> None:
    _, stages = parse(IMAGES["operator"])
    users = stages[-1].all("USER")
    assert users, "the operator image sets USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) > 0 and (not gid or int(gid) > 0)  # numeric: runAsNonRoot can check it
    values = yaml.safe_load((REPO / "charts/rmd/values.yaml").read_text())
    assert values["operator"]["runAsUser"] == int(uid)


def test_agent_runs_as_root_by_design() -> None:
    """Its writes (resctrl, cpufreq, the kubelet's device-plugin directory) are root's; the chart drops every
    capability but the ones it lists."""
    _, stages = parse(IMAGES["agent"])
    assert stages[-1].all("USER") in ([], ["0"], ["root"])


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_entrypoint_and_ports_match_the_chart(image: str) -> None:
    _, stages = parse(IMAGES[image])
    final = stages[-1]
    (entrypoint,) = final.all("ENTRYPOINT")
    assert json.loads(entrypoint)[0].endswith(f"/rmd-{image}")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert f"rmd-{image}" in project["scripts"]
    values = yaml.safe_load((REPO / "charts/rmd/values.yaml").read_text())
    exposed = {int(p) for args in final.all("EXPOSE") for p in args.split()}
    assert exposed == set(values[image]["ports"].values())


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_no_console_script_of_a_package_the_image_lacks(image: str) -> None:
    """pip installs every console script of pyproject.toml; one whose package is not copied in (rmdctl and
    rmd-operator in the agent image) would fail with ModuleNotFoundError, so the build removes it."""
    _, stages = parse(IMAGES[image])
    runs = " ".join(r for stage in stages for r in stage.all("RUN"))
    removed = set(re.findall(r"rm (?:-f )?((?:/opt/rmd/bin/\S+ ?)+)", runs))
    removed_scripts = {path.rsplit("/", 1)[1] for group in removed for path in group.split()}
    packages = {source.rsplit("/", 1)[1] for source in SOURCES[image]}
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    lacking = {name for name, target in project["scripts"].items() if target.split(".")[0] not in packages}
    assert lacking, "every image lacks some package's scripts"
    assert removed_scripts == lacking


def lock_entries() -> dict[str, tuple[str, list[str]]]:
    """name -> (version, hashes) from image-requirements.txt."""
    text = LOCK.read_text().replace("\\\n", " ")
    entries: dict[str, tuple[str, list[str]]] = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        spec, *options = line.split()
        name, _, version = spec.partition("==")
        assert version, f"not pinned: {spec}"
        hashes = [o.removeprefix("--hash=sha256:") for o in options]
        assert hashes and all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes), spec
        entries[re.sub(r"[-_.]+", "-", name).lower()] = (version, hashes)
    return entries


def test_lock_pins_every_dependency_within_its_range() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    entries = lock_entries()
    required = pyproject["project"]["dependencies"] + pyproject["build-system"]["requires"]
    for spec in required:
        requirement = Requirement(spec)
        name = re.sub(r"[-_.]+", "-", requirement.name).lower()
        assert name in entries, f"{spec} is not in {LOCK.name}"
        assert requirement.specifier.contains(entries[name][0], prereleases=True), (spec, entries[name][0])


# -- the opt-in build ------------------------------------------------------------------------------------

BUILD = os.environ.get("RMD_BUILD_IMAGES", "1") != "0"


def _run(*cmd: str, timeout: float = 900) -> str:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    assert result.returncode == 0, f"{' '.join(cmd)}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout


@pytest.mark.skipif(not BUILD, reason="RMD_BUILD_IMAGES=0: image builds skipped")
@pytest.mark.parametrize("image", sorted(IMAGES))
@pytest.mark.timeout(1800)
def test_image_builds_and_runs(image: str) -> None:
    missing = [tool for tool in ("buildah", "debootstrap") if shutil.which(tool) is None]
    if missing or os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail(f"CI builds the images: {missing or 'root'} is missing; ./dev installs it")
        pytest.skip(f"cannot build images here: {missing or 'not root'}")
    # The builder the real-node tier uses: the same build, kept in buildah's storage by content hash.
    tag = images.product_image(image, REPO)
    config = json.loads(_run("buildah", "inspect", "--type", "image", tag))["OCIv1"]["config"]
    assert config["Entrypoint"] == [f"/opt/rmd/bin/rmd-{image}"]
    container = _run("buildah", "from", "--pull=never", tag).strip()
    try:
        if image == "agent":
            assert config.get("User", "") in ("", "0", "root")
            report = json.loads(
                _run(
                    "buildah", "run", "--isolation", "chroot", container, "--", "rmd-agent", "probe", "--json"
                )
            )
            assert "rdtL3Cat" in report["features"]
        else:
            assert config["User"] == "65532:65532"
            printed = _run(
                "buildah",
                "run",
                "--isolation",
                "chroot",
                "--user",
                "65532:65532",
                container,
                "--",
                "rmd-operator",
                "run",
                "--print-config",
            )
            assert json.loads(printed)["agent_server_name"] == "rmd-agent.{node}"
            usage = _run(
                "buildah",
                "run",
                "--isolation",
                "chroot",
                "--user",
                "65532:65532",
                container,
                "--",
                "rmdctl",
                "-h",
            )
            assert "validate" in usage  # rmdctl comes with the operator's package
        # Only the venv's own programs: the other component's scripts and the build tools are gone.
        programs = set(
            _run("buildah", "run", "--isolation", "chroot", container, "--", "ls", "/opt/rmd/bin").split()
        )
        other = "operator" if image == "agent" else "agent"
        assert f"rmd-{image}" in programs and f"rmd-{other}" not in programs and "pip" not in programs
        assert ("rmdctl" in programs) is (image == "operator")
    finally:
        _run("buildah", "rm", container)
