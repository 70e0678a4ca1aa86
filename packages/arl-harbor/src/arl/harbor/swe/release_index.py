"""A package's release history on PyPI: final releases with an sdist, in order, and their sdists.

PyPI's JSON API (`https://pypi.org/pypi/<name>/json`) lists every release with its files; only final
releases (`1.2`, `1.2.3`: no pre-, post- or dev-release) that are not yanked and ship an sdist count, so
"consecutive" means consecutive among those. The sdist is downloaded from the URL PyPI gives, checked
against its sha256, into `<cache>/sdists` (where `sources.fetch` finds it too), and unpacked with
`sources.unpack` to `<cache>/src/<name>-<version>`. Every request has a timeout.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from arl.harbor.swe import sources

PYPI_JSON = "https://pypi.org/pypi/{name}/json"
REQUEST_TIMEOUT_SEC = 60.0
_FINAL = re.compile(r"\d+(\.\d+)*")


class ReleaseIndexError(RuntimeError):
    """A package's release list or one of its sdists could not be read from PyPI."""


@dataclass(frozen=True)
class Release:
    """One final release with its sdist's file name, URL and sha256."""

    name: str
    version: str
    filename: str
    url: str
    sha256: str


def version_key(version: str) -> tuple[int, ...] | None:
    """The sort key of a final release's version (None: a pre/post/dev release or another scheme)."""
    if not _FINAL.fullmatch(version):
        return None
    parts = [int(p) for p in version.split(".")]
    while len(parts) > 1 and parts[-1] == 0:  # 1.2 == 1.2.0
        parts.pop()
    return tuple(parts)


def releases_from_json(name: str, data: dict, *, base_url: str = "") -> list[Release]:
    """The final, unyanked releases with an sdist in PyPI's JSON `data`, oldest first (file URLs made
    absolute against `base_url`: a mirror may give them relative to the JSON's own URL)."""
    out = []
    for version, files in (data.get("releases") or {}).items():
        if version_key(version) is None:
            continue
        sdists = [f for f in files if f.get("packagetype") == "sdist" and not f.get("yanked")]
        if sdists:
            f = sdists[0]
            out.append(
                Release(
                    name,
                    version,
                    f["filename"],
                    urllib.parse.urljoin(base_url, f["url"]),
                    f.get("digests", {}).get("sha256", ""),
                )
            )
    return sorted(out, key=lambda r: version_key(r.version) or ())


def _get(url: str, timeout: float) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.read()
    except urllib.error.HTTPError as e:
        raise ReleaseIndexError(f"GET {url}: HTTP {e.code}") from None
    except (urllib.error.URLError, TimeoutError, OSError) as e:
        raise ReleaseIndexError(f"GET {url}: {e}") from None


def list_releases(name: str, cache: Path, *, timeout: float = REQUEST_TIMEOUT_SEC) -> list[Release]:
    """`name`'s final releases with an sdist, oldest first (the JSON kept in `<cache>/pypi/<name>.json`)."""
    path = cache / "pypi" / f"{name.lower()}.json"
    url = PYPI_JSON.format(name=name)
    if not path.is_file():
        body = _get(url, timeout)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)
    releases = releases_from_json(name, json.loads(path.read_text()), base_url=url)
    if not releases:
        raise ReleaseIndexError(f"{name}: PyPI lists no final release with an sdist")
    return releases


def consecutive_pairs(
    releases: list[Release], *, pairs: int, versions: list[str] | None = None
) -> list[tuple[Release, Release]]:
    """The last `pairs` consecutive (old, new) pairs, or those between `versions` (each must be listed)."""
    if versions:
        known = {r.version: r for r in releases}
        missing = [v for v in versions if v not in known]
        if missing:
            raise ReleaseIndexError(
                f"{releases[0].name}: no final release with an sdist for {missing}; "
                f"the last ones are {[r.version for r in releases[-8:]]}"
            )
        chosen = sorted((known[v] for v in versions), key=lambda r: version_key(r.version) or ())
    else:
        chosen = releases[-(pairs + 1) :]
    return list(itertools.pairwise(chosen))


def fetch_release(release: Release, cache: Path, *, timeout: float = REQUEST_TIMEOUT_SEC) -> Path:
    """The unpacked sdist of `release` (`<cache>/src/<name>-<version>`), downloaded once."""
    dest = cache / "src" / f"{release.name}-{release.version}"
    if (dest / "PKG-INFO").is_file():
        return dest
    sdist = cache / "sdists" / release.filename
    if not sdist.is_file():
        body = _get(release.url, timeout)
        if release.sha256 and hashlib.sha256(body).hexdigest() != release.sha256:
            raise ReleaseIndexError(f"{release.filename}: sha256 does not match PyPI's")
        sdist.parent.mkdir(parents=True, exist_ok=True)
        sdist.with_name(sdist.name + ".part").write_bytes(body)
        sdist.with_name(sdist.name + ".part").rename(sdist)
    return sources.unpack(sdist, dest)
