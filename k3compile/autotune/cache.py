"""The on-disk tuning cache: one JSON record per tuned bucket (TuneCache), under a key of the
schedule (layer IR + pipeline), the bucket, the dtype, the GPU, and the triton and k3compile
versions (key_for), written atomically; the cache folder (cache_root).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from k3compile.autotune.space import Bucket, base_pipeline

# --- environment: versions, cache folder ------------------------------------------------------


def triton_version() -> str:
    import triton

    return triton.__version__


_SOURCE_HASH: list[str] = []


def k3compile_version() -> str:
    """__version__ plus a hash of the package's source (passes, printer, IR): tuned winners
    belong to the kernel code that was timed, and a working tree changes it between releases."""
    import importlib

    import k3compile

    if not _SOURCE_HASH:
        digest = hashlib.sha256()
        for package in ("k3compile", "k3compile.autotune", "k3compile.ir", "k3compile.passes",
                        "k3compile.backends"):
            root = Path(importlib.import_module(package).__path__[0])
            for path in sorted(root.rglob("*.py")):
                if package == "k3compile" and path.parent != root:
                    continue
                digest.update(f"{package}/{path.relative_to(root)}\0".encode())
                digest.update(path.read_bytes())
        _SOURCE_HASH.append(digest.hexdigest()[:12])
    return f"{k3compile.__version__}+src.{_SOURCE_HASH[0]}"


def cache_root(override: str | Path | None = None) -> Path:
    """k3compile's cache folder: the override (CLI --cache-dir), else $K3C_CACHE_DIR, else
    $XDG_CACHE_HOME/k3compile, else ~/.cache/k3compile. Tuning results live in its autotune/."""
    if override:
        return Path(override)
    if os.environ.get("K3C_CACHE_DIR"):
        return Path(os.environ["K3C_CACHE_DIR"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg) / "k3compile" if xdg else Path.home() / ".cache" / "k3compile"


# --- keys and records -------------------------------------------------------------------------


def schedule_hash(spec, pipeline: str) -> str:
    """Hash of the printed schedule IR before tuning: the spec's layer op and the pipeline."""
    from k3compile.frontend import spec_to_module

    text = f"{spec_to_module(spec)}\n// pipeline: {pipeline}\n"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def cache_key(schedule: str, bucket_: Bucket, dtype: str, gpu: str, triton: str, k3c: str) -> dict:
    return {"schedule": schedule, "heads_bucket": bucket_.heads, "tokens_bucket": bucket_.tokens, "dtype": dtype,
            "gpu": gpu, "triton": triton, "k3compile": k3c}


def key_for(spec, pipeline: str | None, shape: tuple[int, int], dtype: str, gpu: str) -> dict:
    """The cache key of tuning `spec` (under `pipeline`, None: the kind's) for shape (B, T)."""
    from k3compile.frontend import spec_to_module

    heads = next(iter(spec_to_module(spec).ops)).num_v_heads.value.data
    return cache_key(schedule_hash(spec, base_pipeline(spec, pipeline)), Bucket.of(shape[0], shape[1], heads), dtype,
                     gpu, triton_version(), k3compile_version())


def key_digest(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]


def write_atomic(path: Path, text: str) -> None:
    """Write via a temporary file in the same folder and a rename: readers see the old file or
    the new one, never half of one (two tuning processes may race; the last rename wins)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class TuneCache:
    """<root>/autotune/<schedule hash>/<key hash>.json, one record per (schedule, bucket,
    dtype, GPU, triton, k3compile)."""

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = cache_root(root) / "autotune"

    def path(self, key: dict) -> Path:
        return self.root / key["schedule"][:16] / f"{key_digest(key)}.json"

    def get(self, key: dict) -> dict | None:
        try:
            record = json.loads(self.path(key).read_text())
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) and record.get("key") == key else None

    def put(self, record: dict) -> Path:
        path = self.path(record["key"])
        write_atomic(path, json.dumps(record, indent=1))
        return path

    def records(self, schedule: str, gpu: str, triton: str, k3c: str) -> list[dict]:
        """Every cached record of a schedule on a GPU with these versions (all buckets, dtypes)."""
        found = []
        for path in sorted((self.root / schedule[:16]).glob("*.json")):
            try:
                record = json.loads(path.read_text())
                key = record["key"]
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if (key.get("schedule"), key.get("gpu"), key.get("triton"), key.get("k3compile")) == (schedule, gpu, triton, k3c):
                found.append(record)
        return found
