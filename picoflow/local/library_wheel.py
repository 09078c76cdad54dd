"""The wheel of the running PicoFlow, for a project that must install the same library without a package index.

``picoflow new`` puts it in the project's ``wheels/`` folder. When PicoFlow itself was installed from a wheel
file that still exists, that file is copied; otherwise (an editable install from a checkout, or an install
from an index) an equivalent wheel is written from the installed package and its metadata. Nothing is built
or downloaded: a wheel is a zip of the package's files and its ``.dist-info`` folder.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shutil
import zipfile
from importlib import metadata
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

import picoflow

DISTRIBUTION = "picoflow-aws"
# The dist-info files carried over from the installation; pip's own records (RECORD, INSTALLER,
# direct_url.json, REQUESTED) describe that installation, not the wheel.
_CARRIED = ("METADATA", "entry_points.txt", "top_level.txt")
# Fixed timestamps make the same installation give the same bytes, wherever and whenever it is written.
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)
_SKIPPED_SUFFIXES = (".pyc", ".pyo")


class WheelError(RuntimeError):
    """No wheel can be given: PicoFlow is not installed as the ``picoflow-aws`` distribution."""


def installed_wheel() -> Path | None:
    """The local wheel file the running picoflow-aws was installed from, if it was one and still exists."""
    try:
        # pip records where a distribution came from when it was not the package index (PEP 610).
        recorded = metadata.distribution(DISTRIBUTION).read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return None
    try:
        origin = json.loads(recorded or "{}")
    except ValueError:
        return None
    url = urlparse(str(origin.get("url", "")) if isinstance(origin, dict) else "")
    path = Path(url2pathname(url.path))
    return path if url.scheme == "file" and path.suffix == ".whl" and path.is_file() else None


def wheel_name(version: str) -> str:
    """The file name of the pure-Python wheel of ``version`` (PEP 427, the name normalised to underscores)."""
    return f"{re.sub(r'[-_.]+', '_', DISTRIBUTION)}-{version}-py3-none-any.whl"


def write_library_wheel(folder: Path) -> Path:
    """Put the running PicoFlow's wheel into ``folder`` (created when missing) and return its path.

    Raises:
        WheelError: picoflow is imported from files that no installed ``picoflow-aws`` describes.
    """
    folder.mkdir(parents=True, exist_ok=True)
    source = installed_wheel()
    if source is not None:
        return Path(shutil.copy2(source, folder / source.name))
    # An installed .dist-info, not the .egg-info an editable install leaves in the checkout (found first when the
    # command runs there): only the former lists the licence files.
    candidates = metadata.distributions(name=DISTRIBUTION)
    installed = next((found for found in candidates if found.read_text("METADATA")), None)
    if installed is None:
        raise WheelError(
            f"{DISTRIBUTION} is not installed in this Python, so there is no wheel to give the project: install "
            "PicoFlow with pip (pip install -e . in a checkout) and run the command again."
        )
    version = installed.version
    target = folder / wheel_name(version)
    _write_wheel(target, installed, version)
    return target


def _write_wheel(target: Path, installed: metadata.Distribution, version: str) -> None:
    dist_info = f"{re.sub(r'[-_.]+', '_', DISTRIBUTION)}-{version}.dist-info"
    entries: list[tuple[str, bytes]] = []
    package = Path(picoflow.__file__).parent
    for path in sorted(package.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix not in _SKIPPED_SUFFIXES:
            entries.append((f"picoflow/{path.relative_to(package).as_posix()}", path.read_bytes()))
    for name in _CARRIED:
        text = installed.read_text(name)
        if text is not None:
            entries.append((f"{dist_info}/{name}", text.encode("utf-8")))
    for file in installed.files or ():
        # PEP 639 licence files, which METADATA names.
        if file.parts[:2] == (dist_info, "licenses"):
            entries.append((file.as_posix(), Path(str(file.locate())).read_bytes()))
    wheel = "Wheel-Version: 1.0\nGenerator: picoflow\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    entries.append((f"{dist_info}/WHEEL", wheel.encode("utf-8")))
    record = "".join(f"{name},sha256={_digest(data)},{len(data)}\n" for name, data in entries)
    entries.append((f"{dist_info}/RECORD", (record + f"{dist_info}/RECORD,,\n").encode("utf-8")))
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=_ZIP_DATE)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, data)


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode("ascii")
