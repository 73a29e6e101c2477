"""The sandbox image: built offline from Debian packages, rebuilt only when its inputs change.

Two layers, cached separately: a base image made by ``debootstrap`` + ``docker import`` (slow,
keyed by the package list) and the worker layer built on top of it (fast, keyed by the worker's
source). The final image carries a content-hash label so an up-to-date build is a no-op.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors

from mathagent import __version__
from mathagent.config import SandboxSettings

SUITE = "bookworm"
PACKAGES = ("python3", "python3-sympy", "python3-numpy", "python3-scipy", "python3-mpmath")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
HASH_LABEL = "mathagent.sandbox.hash"
SANDBOX_UID = 1000
BASE_RECIPE = 2  # bump when _debootstrap changes what goes into the base
WORKER_PATH = "/opt/mathagent/worker.py"
WORKER_SOURCE = Path(__file__).with_name("worker.py")

# The worker layer: no RUN step, so building it starts no container and pulls nothing.
LAYER_DOCKERFILE = f"""\
FROM {{base}}
COPY worker.py {WORKER_PATH}
ENV OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=1 HOME=/tmp LANG=C.UTF-8
USER {SANDBOX_UID}:{SANDBOX_UID}
WORKDIR /tmp
CMD ["python3", "-I", "-u", "{WORKER_PATH}"]
"""


class ImageBuildError(RuntimeError):
    """The image could not be built."""


@dataclass(frozen=True)
class BuildReport:
    """What ``build_image`` did."""

    image: str
    built: bool
    base_built: bool
    seconds: float


def image_tag(settings: SandboxSettings) -> str:
    """The image reference the pool runs: ``<repository>:<package version>``."""
    return settings.image if ":" in settings.image else f"{settings.image}:{__version__}"


def base_hash(mirror: str) -> str:
    """Key of the debootstrap base: suite, mirror, package list and recipe revision."""
    return _sha(f"{BASE_RECIPE}\n{SUITE}\n{mirror}\n{' '.join(PACKAGES)}\n{SANDBOX_UID}")


def content_hash(mirror: str) -> str:
    """Key of the final image: the base key plus the worker source and its layer recipe."""
    return _sha(base_hash(mirror) + WORKER_SOURCE.read_text() + LAYER_DOCKERFILE)


def apt_mirror(sources_dir: Path = Path("/etc/apt")) -> str:
    """The Debian mirror apt on this machine uses (so debootstrap reaches a mirror that works)."""
    files = [sources_dir / "sources.list", *sorted((sources_dir / "sources.list.d").glob("*"))]
    for path in files:
        text = path.read_text(errors="replace") if path.is_file() else ""
        if path.suffix == ".sources" or "URIs:" in text:
            for block in text.split("\n\n"):
                uris = re.search(r"^URIs:\s*(\S+)", block, re.M)
                suites = re.search(r"^Suites:\s*(.+)$", block, re.M)
                if uris and suites and SUITE in suites.group(1).split():
                    return uris.group(1).rstrip("/")
        for line in text.splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[0] == "deb" and parts[2] == SUITE:
                return parts[1].rstrip("/")
    return DEFAULT_MIRROR


def build_image(
    settings: SandboxSettings, force: bool = False, client: docker.DockerClient | None = None
) -> BuildReport:
    """Build the sandbox image unless it is up to date (``force`` rebuilds both layers)."""
    start = time.monotonic()
    client = client or docker.from_env()
    mirror = settings.debian_mirror or apt_mirror()
    tag, want = image_tag(settings), content_hash(mirror)
    if not force and _label(client, tag) == want:
        return BuildReport(tag, False, False, time.monotonic() - start)
    base = f"{settings.image.split(':')[0]}-base:{base_hash(mirror)[:16]}"
    base_built = force or _label(client, base) != base_hash(mirror)
    if base_built:
        _debootstrap_import(base, mirror)
    _build_layer(client, base, tag, want)
    _prune(client, base)
    return BuildReport(tag, True, base_built, time.monotonic() - start)


def _prune(client: docker.DockerClient, keep_base: str) -> None:
    """Drop what earlier builds left: untagged worker layers, then outdated bases."""
    for image in client.images.list(filters={"dangling": True, "label": HASH_LABEL}):
        with contextlib.suppress(docker.errors.APIError):
            client.images.remove(image.id)
    repository = keep_base.split(":")[0]
    for image in client.images.list(name=repository):
        for old in (t for t in image.tags if t != keep_base):
            with contextlib.suppress(docker.errors.APIError):
                client.images.remove(old)


def _debootstrap_import(tag: str, mirror: str) -> None:
    with tempfile.TemporaryDirectory(prefix="mathagent-rootfs-") as tmp:
        root = Path(tmp) / "root"
        try:
            _debootstrap(root, mirror)
            tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
            label = f"LABEL {HASH_LABEL}={base_hash(mirror)}"
            _run(["docker", "import", "--change", label, "-", tag], stdin=tar.stdout)
            if tar.wait() != 0:
                raise ImageBuildError("tar of the debootstrap root failed")
        finally:
            _unmount_under(root)


def _debootstrap(root: Path, mirror: str) -> None:
    _run(
        [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(PACKAGES)}",
            SUITE,
            str(root),
            mirror,
        ]
    )
    _add_user(root)
    # Downloaded .debs, apt lists and documentation are of no use in the sandbox.
    caches = [str(root / "var/cache/apt"), str(root / "var/lib/apt/lists")]
    _run(["find", *caches, "-type", "f", "-delete"])
    for folder in ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale"):
        shutil.rmtree(root / folder, ignore_errors=True)


def _unmount_under(root: Path) -> None:
    """An interrupted debootstrap leaves /proc and /sys mounted in the root: never rm through them."""
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for point in sorted((m for m in mounts if m.startswith(f"{root}/")), reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)


def _add_user(root: Path) -> None:
    """Add the unprivileged ``sandbox`` user by editing the rootfs (no chroot, no RUN step)."""
    uid = SANDBOX_UID
    with open(root / "etc/passwd", "a") as f:
        f.write(f"sandbox:x:{uid}:{uid}:sandbox:/tmp:/usr/sbin/nologin\n")
    with open(root / "etc/group", "a") as f:
        f.write(f"sandbox:x:{uid}:\n")


def _build_layer(client: docker.DockerClient, base: str, tag: str, content: str) -> None:
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        for name, data in (
            ("Dockerfile", LAYER_DOCKERFILE.format(base=base).encode()),
            ("worker.py", WORKER_SOURCE.read_bytes()),
        ):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    context.seek(0)
    try:
        client.images.build(
            fileobj=context,
            custom_context=True,
            tag=tag,
            labels={HASH_LABEL: content},
            pull=False,
            rm=True,
            forcerm=True,
        )
    except docker.errors.BuildError as exc:
        raise ImageBuildError(f"worker layer build failed: {exc}") from exc


def _label(client: docker.DockerClient, tag: str) -> str | None:
    try:
        labels = client.images.get(tag).labels or {}
    except docker.errors.ImageNotFound:
        return None
    return labels.get(HASH_LABEL)


def _run(cmd: list[str], stdin: object = None) -> None:
    done = subprocess.run(cmd, stdin=stdin, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout)[-2000:]
        raise ImageBuildError(f"{cmd[0]} failed ({done.returncode}): {tail}")


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
