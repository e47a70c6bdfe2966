"""The programs of the Kubernetes test cluster (see k8s.py), built from source once per machine and cached: the
control plane (kube-apiserver, kube-controller-manager and kube-scheduler in one binary, from the wrapper Go module
scripts/k8s-control-plane, whose go.mod pins the k8s.io/kubernetes release) and the Kubeflow training operator with
its PyTorchJob CRD, and Kueue (gang admission of Jobs and PyTorchJobs) with its CRDs; etcd comes from Debian's
etcd-server.

The cache layout is relied on by existing machines and by tests/k8s_cluster.py, so it stays as it is:
~/.cache/bcp-pipeline/k8s/RELEASE/bin (or $BCP_K8S_CACHE/RELEASE/bin) holds the binary, its three program links,
build.log (Go's output) and .build.lock (held while a build runs); ~/.cache/bcp-pipeline/training-operator/RELEASE
holds crds/ and bin/, and so does ~/.cache/bcp-pipeline/kueue/RELEASE; Go's build cache for these builds is
~/.cache/bcp-pipeline/go-build, removed once all are built.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from .common import REPO, ClusterError, say, tail

WRAPPER = REPO / "scripts" / "k8s-control-plane"  # the Go wrapper module: go.mod pins the release
BINARY = "k8s-control-plane"
PROGRAMS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
# The Kubeflow training operator whose PyTorchJob CRD (and, where built, the operator itself) tests use.
OPERATOR_MODULE = "github.com/kubeflow/training-operator"
TRAINING_OPERATOR = "v1.8.1"
PYTORCHJOB_CRD = "kubeflow.org_pytorchjobs.yaml"
# Kueue (sigs.k8s.io/kueue): its manager, built from the module source, and its CRDs from the same source.
KUEUE_MODULE = "sigs.k8s.io/kueue"
KUEUE = "v0.17.0"
KUEUE_CRDS = "config/components/crd/bases"


def release() -> str:
    """The pinned k8s.io/kubernetes release, read from the wrapper module's go.mod (the one place it is written)."""
    text = (WRAPPER / "go.mod").read_text()
    match = re.search(r"^\s*(?:require\s+)?k8s\.io/kubernetes (v\d+\.\d+\.\d+)$", text, re.MULTILINE)
    if not match:
        raise ClusterError(f"{WRAPPER / 'go.mod'}: no `require k8s.io/kubernetes vX.Y.Z` line")
    return match.group(1)


def cache_bin() -> Path:
    root = Path(os.environ.get("BCP_K8S_CACHE") or Path.home() / ".cache" / "bcp-pipeline" / "k8s")
    return root / release() / "bin"


def operator_cache() -> Path:
    """The Kubeflow training operator's PyTorchJob CRD (crds/) and binary (bin/), keyed by its release."""
    return Path.home() / ".cache" / "bcp-pipeline" / "training-operator" / TRAINING_OPERATOR


def kueue_cache() -> Path:
    """Kueue's CRDs (crds/) and manager binary (bin/kueue), keyed by its release."""
    return Path.home() / ".cache" / "bcp-pipeline" / "kueue" / KUEUE


def go_build_cache() -> Path:
    """Go's build cache for these two builds alone (about 4 GB once both are built): only the binaries are kept, so it
    is removed after they are built, rather than left in the user's own Go cache."""
    return Path.home() / ".cache" / "bcp-pipeline" / "go-build"


def go_build_env() -> dict[str, str]:
    return {**os.environ, "GOCACHE": str(go_build_cache())}


# Politeness toward the machine's other work: `nice -n 10` unless BCP_K8S_BUILD_NICE says otherwise. .ci/run sets 0:
# there the build is the longest chain (the Kubernetes tests wait for it), so it must not yield to the other tests.
def niced(argv: list[str]) -> list[str]:
    return ["nice", "-n", os.environ.get("BCP_K8S_BUILD_NICE", "10"), *argv]


# Every binary is stripped (-ldflags=-s -w), so the compiler's DWARF for each of the thousands of packages is work
# thrown away at link time: not generating it shortens a cold build.
GCFLAGS = "-gcflags=all=-dwarf=false"


def build_lock_path() -> Path:
    return cache_bin() / ".build.lock"


def build_log_path() -> Path:
    return cache_bin() / "build.log"


def build_in_progress() -> bool:
    """Whether another `install` holds the build lock now (a build in the background, as .ci/run starts one)."""
    try:
        with build_lock_path().open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except FileNotFoundError:
        return False
    except BlockingIOError:
        return True
    return False


@contextlib.contextmanager
def build_lock() -> Iterator[None]:
    """Held while `install` builds (the control plane, then the training operator): a second `install` waits for
    it instead of building again, `status` says "being built", and tests/k8s_cluster.py waits for a build in the
    background (.ci/run starts one) before its tests start."""
    cache_bin().mkdir(parents=True, exist_ok=True)
    with build_lock_path().open("a") as lock:
        if build_in_progress():
            say(f"another install is building (log: {build_log_path()}); waiting for it")
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def build_control_plane() -> Path:
    """The control-plane binary of the pinned release, built unless cached with its version stamped (Go's output in
    build.log); its three program links made. Called under build_lock()."""
    bin_dir = cache_bin()
    if not (bin_dir / BINARY).is_file():
        go_build(bin_dir)
    elif (said := stamped_version(bin_dir)) != f"Kubernetes {release()}":
        say(
            f"the cached control plane says {said!r}, not its release (built before its version was stamped; "
            "Kueue refuses such an apiserver): building it again"
        )
        go_build(bin_dir)
    for program in PROGRAMS:  # the binary picks the program by the name it is started as
        link = bin_dir / program
        if not link.is_symlink():
            link.unlink(missing_ok=True)
            link.symlink_to(BINARY)
    return bin_dir


def stamped_version(bin_dir: Path) -> str:
    """What the cached binary says of its version as kube-apiserver (it picks its program by argv[0])."""
    result = subprocess.run(
        ["kube-apiserver", "--version"],
        executable=str(bin_dir / BINARY),
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    return result.stdout.strip()


def version_ldflags() -> str:
    """The linker flags that stamp the release into the binary, as Kubernetes' own build does (hack/lib/version.sh):
    unstamped, the apiserver's /version says v0.0.0-master+$Format:%H$, which clients that parse it refuse (Kueue's
    manager exits: "could not parse pre-release/metadata")."""
    major, minor = release().lstrip("v").split(".")[:2]
    package = "k8s.io/component-base/version"
    return " ".join(
        f"-X {package}.{name}={value}"
        for name, value in (
            ("gitVersion", release()),
            ("gitMajor", major),
            ("gitMinor", minor),
            ("gitTreeState", "clean"),
        )
    )


def go_build(bin_dir: Path) -> None:
    """`go build` of the wrapper module into bin_dir, through a partial file: a killed build leaves no binary."""
    go = shutil.which("go")
    if go is None:
        raise ClusterError("`go` is not on PATH: install Go 1.25 or later (the build needs the Go module proxy)")
    partial = bin_dir / f".{BINARY}.partial"
    say(
        f"building kube-apiserver, kube-controller-manager and kube-scheduler {release()} from source into "
        f"{bin_dir} (cold: about 24 CPU-minutes for it, Kueue and the training operator together, far longer "
        f"beside other work; cached afterwards); Go's output: {build_log_path()}"
    )
    started = time.monotonic()
    # GOTOOLCHAIN=local: build with the installed Go, never a toolchain downloaded on the side.
    env = {**go_build_env(), "CGO_ENABLED": "0", "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=readonly"}
    argv = niced([go, "build", "-trimpath", GCFLAGS, f"-ldflags=-s -w {version_ldflags()}", "-o", str(partial), "."])
    with build_log_path().open("w") as log:
        result = subprocess.run(argv, check=False, cwd=WRAPPER, env=env, stdout=log, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        raise ClusterError(
            f"`go build` of the control plane failed ({result.returncode}):\n"
            f"{tail(build_log_path(), 40)}\nThe Go module proxy must be reachable (GOPROXY)."
        )
    partial.replace(bin_dir / BINARY)
    say(f"built in {time.monotonic() - started:.0f} s")


def install_training_operator() -> None:
    """The training operator's own PyTorchJob CRD, read from its module source (fetched through the Go module
    proxy), and the operator built from that source (CGO off, stripped); both cached by release, so only the first
    install fetches or builds."""
    crd = operator_cache() / "crds" / PYTORCHJOB_CRD
    if not crd.is_file():
        fetch_crd(crd)
    binary = operator_cache() / "bin" / "training-operator.v1"
    if not binary.is_file():
        build_operator(binary)


def fetch_crd(crd: Path) -> None:
    result = subprocess.run(
        ["go", "mod", "download", "-json", f"{OPERATOR_MODULE}@{TRAINING_OPERATOR}"],
        capture_output=True,
        text=True,
        check=False,
        cwd=tempfile.gettempdir(),
    )
    if result.returncode != 0:
        raise ClusterError(f"go mod download {OPERATOR_MODULE}@{TRAINING_OPERATOR} failed:\n{result.stderr[-2000:]}")
    source = Path(json.loads(result.stdout)["Dir"]) / "manifests" / "base" / "crds" / PYTORCHJOB_CRD
    crd.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, crd)
    say(f"the PyTorchJob CRD of the training operator {TRAINING_OPERATOR}: {crd}")


def build_operator(binary: Path) -> None:
    say(f"building the Kubeflow training operator {TRAINING_OPERATOR} from source into {binary.parent}")
    started = time.monotonic()
    env = {**go_build_env(), "CGO_ENABLED": "0", "GOBIN": str(binary.parent), "GOFLAGS": "-trimpath"}
    result = subprocess.run(
        niced(
            [
                "go",
                "install",
                GCFLAGS,
                "-ldflags=-s -w",
                f"{OPERATOR_MODULE}/cmd/training-operator.v1@{TRAINING_OPERATOR}",
            ]
        ),
        env=env,
        capture_output=True,
        text=True,
        check=False,
        cwd=tempfile.gettempdir(),
    )
    if result.returncode != 0:
        raise ClusterError(f"building the training operator failed:\n{result.stderr[-2000:]}")
    say(f"built in {time.monotonic() - started:.0f} s")


def install_kueue() -> None:
    """Kueue's CRDs and its manager, from its module source (through the Go module proxy; its go.mod has no replace
    lines, so `go install MODULE@VERSION` builds it as released); cached by release. Cold: about 4 minutes of 2
    cores (docs/backends/kubernetes.md)."""
    crds = kueue_cache() / "crds"
    if not crds.is_dir():
        source = module_dir(KUEUE_MODULE, KUEUE) / KUEUE_CRDS
        partial = crds.with_name(".crds.partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        for crd in sorted(source.glob("kueue.x-k8s.io_*.yaml")):
            shutil.copyfile(crd, partial / crd.name)
        partial.rename(crds)
        say(f"Kueue {KUEUE}'s CRDs: {crds}")
    binary = kueue_cache() / "bin" / "kueue"
    if binary.is_file():
        return
    say(f"building Kueue {KUEUE} from source into {binary.parent}")
    started = time.monotonic()
    env = {
        **go_build_env(),
        "CGO_ENABLED": "0",
        "GOBIN": str(binary.parent),
        "GOFLAGS": "-trimpath",
        "GOTOOLCHAIN": "local",
    }
    argv = niced(["go", "install", GCFLAGS, "-ldflags=-s -w", f"{KUEUE_MODULE}/cmd/kueue@{KUEUE}"])
    result = subprocess.run(argv, env=env, capture_output=True, text=True, check=False, cwd=tempfile.gettempdir())
    if result.returncode != 0:
        raise ClusterError(f"building Kueue {KUEUE} failed:\n{result.stderr[-2000:]}")
    say(f"built in {time.monotonic() - started:.0f} s")


def module_dir(module: str, version: str) -> Path:
    """The folder of `module`@`version`'s source in Go's module cache, downloaded there if missing."""
    result = subprocess.run(
        ["go", "mod", "download", "-json", f"{module}@{version}"],
        capture_output=True,
        text=True,
        check=False,
        cwd=tempfile.gettempdir(),
    )
    if result.returncode != 0:
        raise ClusterError(f"go mod download {module}@{version} failed:\n{result.stderr[-2000:]}")
    return Path(json.loads(result.stdout)["Dir"])


def build_all() -> None:
    """The control plane, the training operator and Kueue, under the build lock; then Go's build cache goes."""
    with build_lock():
        build_control_plane()
        install_training_operator()
        install_kueue()
        # Kept after a failed build (a retry reuses it); every binary is cached by release now.
        shutil.rmtree(go_build_cache(), ignore_errors=True)
