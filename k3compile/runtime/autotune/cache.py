"""The on-disk tuning cache: one JSON record per tuned entry and bucket (TuneCache), under a key
of the schedule (the layer's semantics + pipeline: not its name, scale or spec dtype), the
bucket, the input dtype, the GPU, and the triton and k3compile versions (key_for; a backward
record's key also names its entry, chunk_backward, so it lies next to the forward's record of
the bucket), written atomically and checked when read (record_problem); the cache folder
(cache_root).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
from pathlib import Path

import k3compile
from k3compile.files import write_file_atomic
from k3compile.runtime.autotune.space import CACHED_ENTRIES, TUNED_ENTRY, Bucket, base_pipeline

# --- environment: versions, cache folder ------------------------------------------------------


def triton_version() -> str:
    # triton (~1 s): k3compile.ops' warm start reads its cache without it
    import triton

    return triton.__version__


_SOURCE_HASH: list[str] = []


def k3compile_version() -> str:
    """__version__ plus a hash of the package's source (passes, printer, IR): tuned winners
    belong to the kernel code that was timed, and a working tree changes it between releases."""
    if not _SOURCE_HASH:
        digest = hashlib.sha256()
        for package in ("k3compile", "k3compile.checking", "k3compile.runtime", "k3compile.ir", "k3compile.passes",
                        "k3compile.backends"):
            # found, not imported: the passes import xDSL, which k3compile.ops' warm start must not
            root = Path(importlib.util.find_spec(package).submodule_search_locations[0])
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
        return Path(override).expanduser()
    if os.environ.get("K3C_CACHE_DIR"):
        return Path(os.environ["K3C_CACHE_DIR"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg).expanduser() / "k3compile" if xdg else Path.home() / ".cache" / "k3compile"


# --- keys and records -------------------------------------------------------------------------


# A spec's parameters that make no kernel code: the compiled module takes the scale and the
# input dtype at run time (the key's "dtype" is the input dtype the bucket was timed at); the
# name only names the kernels, and kernel_code_hash leaves it out.
RUN_TIME_PARAMS = ("scale", "dtype")


def layer_semantics(spec) -> dict:
    """What a layer's kernels are a function of: its kind (the member: gate form, delta rule) and
    its parameters (head dims, grouped value heads, state layout, what the inputs mean: gate input
    and bound, beta input, l2norm), less its name, scale and dtype. A spec of `k3c tune` and the
    layer k3compile.ops compiles for a call share tuned records when these are equal."""
    return {"kind": spec.kind, **{name: value for name, value in spec.params.items() if name not in RUN_TIME_PARAMS}}


def schedule_hash(spec, pipeline: str) -> str:
    """Hash of the schedule before tuning: the layer's semantics and the pipeline (no xDSL: read
    on every start of k3compile.ops)."""
    text = json.dumps({"layer": layer_semantics(spec), "pipeline": pipeline}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def cache_key(schedule: str, bucket_: Bucket, dtype: str, gpu: str, triton: str, k3c: str,
              entry: str = TUNED_ENTRY) -> dict:
    """The key of a record; the forward's (chunk) has no "entry" field (keys as before the backward
    was tuned), the backward's says "entry": "chunk_backward"."""
    key = {"schedule": schedule, "heads_bucket": bucket_.heads, "tokens_bucket": bucket_.tokens, "dtype": dtype,
           "gpu": gpu, "triton": triton, "k3compile": k3c}
    return key if entry == TUNED_ENTRY else {**key, "entry": entry}


def entry_of(key: dict) -> str:
    """The tuned entry of a record's key."""
    return key.get("entry", TUNED_ENTRY)


def key_for(spec, pipeline: str | None, shape: tuple[int, int], dtype: str, gpu: str,
            entry: str = TUNED_ENTRY) -> dict:
    """The cache key of tuning `entry` of `spec` (under `pipeline`, None: the kind's) for shape (B, T)."""
    heads = spec.params["num_v_heads"]
    return cache_key(schedule_hash(spec, base_pipeline(spec, pipeline)), Bucket.of(shape[0], shape[1], heads), dtype,
                     gpu, triton_version(), k3compile_version(), entry)


def key_digest(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]


KEY_TYPES = {"schedule": str, "heads_bucket": int, "tokens_bucket": int, "dtype": str, "gpu": str, "triton": str,
             "k3compile": str, "entry": str}
KEY_REQUIRED = tuple(name for name in KEY_TYPES if name != "entry")  # no "entry": the forward's
CANDIDATE_TYPES = {"index": int, "options": dict, "pipeline": str, "code_options": dict, "code_hash": str,
                   "launch": (dict, type(None)), "status": str, "ms": (int, float, type(None)), "detail": str}
CHOICE_TYPES = {"pass": str, "option": str, "values": list, "launch_only": bool}
SEGMENT_TYPES = {"P": int, "status": str, "ms": (int, float, type(None)), "detail": str}
# the spec a record was tuned under: its "name" prefixes the kernels its launch configs name
SPEC_TYPES = {"name": str, "source": str, "kind": str}


def mistyped(item, types: dict, required=()) -> str | None:
    """What is wrong with `item` as a JSON object of these field types: not an object, a missing
    required field, an unknown one or one of the wrong type (None: nothing)."""
    if not isinstance(item, dict):
        return f"{json.dumps(item)[:40]} is not an object"
    unknown = sorted(item.keys() - types.keys())
    missing = [name for name in required if name not in item]
    if unknown or missing:
        return f"unknown field {unknown[0]!r}" if unknown else f"no {missing[0]!r}"
    for name, value in item.items():
        if isinstance(value, bool) is not (types[name] is bool) or not isinstance(value, types[name]):
            return f"{name!r} is {json.dumps(value)[:40]}"  # (JSON true is no int, nor 1 a bool)
    return None


def candidate_problem(candidate) -> str | None:
    """Why a record's candidate cannot be read back (Candidate.from_json) and used."""
    problem = mistyped(candidate, CANDIDATE_TYPES, required=("index", "options", "pipeline", "code_options"))
    if problem:
        return problem
    launch = candidate.get("launch") or {}
    if not all(isinstance(config, dict) and all(type(v) is int and v > 0 for v in config.values())
               for config in launch.values()):
        return "'launch' is not kernel -> {parameter: positive int}"
    if candidate.get("status") == "ok" and not 0 < (candidate.get("ms") or 0) < math.inf:
        return f"a passing candidate with 'ms' {candidate.get('ms')}"
    return None


def record_problem(record) -> str | None:
    """Why a cached record cannot be used (None: it can). Checks every field that tune, `k3c
    tune` and compile_tuned read, so a damaged or hand-edited record is skipped, never a crash."""
    if not isinstance(record, dict):
        return "not a JSON object"
    if problem := mistyped(record.get("key"), KEY_TYPES, required=KEY_REQUIRED):
        return f"'key': {problem}"
    if entry_of(record["key"]) not in CACHED_ENTRIES:
        return f"'key': 'entry' is {json.dumps(record['key']['entry'])[:40]}, not one of the tuned entries"
    candidates = record.get("candidates")
    if not isinstance(candidates, list):
        return f"'candidates' is {json.dumps(candidates)[:40]}, not a list"
    for i, candidate in enumerate(candidates):
        if problem := candidate_problem(candidate):
            return f"candidate {i}: {problem}"
    if len({tuple(sorted(c["options"])) for c in candidates}) > 1:
        return "the candidates choose different options"
    for name in ("winner", "default"):
        index = record.get(name)
        if index is not None and not (type(index) is int and 0 <= index < len(candidates)):
            return f"{name!r} is {json.dumps(index)[:40]}, not the index of one of {len(candidates)} candidates"
    space = record.get("space", [])
    if not isinstance(space, list) or any(mistyped(c, CHOICE_TYPES, required=("pass", "option")) for c in space):
        return "'space' is not a list of choices {'pass', 'option', 'values', 'launch_only'}"
    unowned = {option for c in candidates for option in c["code_options"]} - {choice["option"] for choice in space}
    if unowned:
        return f"code option {sorted(unowned)[0]!r} of a candidate is in no choice of 'space'"
    segments = record.get("segments")
    if segments is not None and (problem := segments_problem(segments)):
        return f"'segments': {problem}"
    if "spec" in record and (problem := mistyped(record["spec"], SPEC_TYPES, required=("name",))):
        return f"'spec': {problem}"
    return None


def segments_problem(segments) -> str | None:
    """Why a record's context-parallel stage ({'winner': P, 'candidates': rows}) is unusable."""
    if problem := mistyped(segments, {"winner": int, "candidates": list}, required=("winner", "candidates")):
        return problem
    for i, row in enumerate(segments["candidates"]):
        if problem := mistyped(row, SEGMENT_TYPES, required=SEGMENT_TYPES):
            return f"row {i}: {problem}"
        if row["status"] == "ok" and row["ms"] is None:
            return f"row {i}: a passing P with no 'ms'"
    return None if segments["winner"] >= 1 else f"'winner' is P = {segments['winner']}"


class TuneCache:
    """<root>/autotune/<schedule hash>/<key hash>.json, one record per (schedule, bucket,
    dtype, GPU, triton, k3compile). A record that cannot be used (truncated, damaged, edited)
    is skipped, and said once in `messages`."""

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = cache_root(root) / "autotune"
        self.skipped: dict[Path, str] = {}  # records found unusable: path -> why

    @property
    def messages(self) -> list[str]:
        return [f"skipped the tuning-cache record {path}: {why} (`k3c tune` again replaces it)"
                for path, why in self.skipped.items()]

    def path(self, key: dict) -> Path:
        return self.root / key["schedule"][:16] / f"{key_digest(key)}.json"

    def read(self, path: Path) -> dict | None:
        """The record at `path`, or None where there is none or it is unusable (then skipped)."""
        try:
            record = json.loads(path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as err:
            self.skipped[path] = f"unreadable ({getattr(err, 'strerror', None) or 'truncated or not JSON'})"
            return None
        problem = record_problem(record)
        if problem is not None:
            self.skipped[path] = problem
            return None
        return record

    def get(self, key: dict) -> dict | None:
        record = self.read(self.path(key))
        if record is not None and record["key"] != key:
            self.skipped[self.path(key)] = "its 'key' is not the one its file name hashes"
            return None
        return record

    def put(self, record: dict) -> Path:
        path = self.path(record["key"])
        path.parent.mkdir(parents=True, exist_ok=True)
        write_file_atomic(path, json.dumps(record, indent=1).encode())
        self.skipped.pop(path, None)
        return path

    def records(self, schedule: str, gpu: str, triton: str, k3c: str, entry: str = TUNED_ENTRY) -> list[dict]:
        """Every cached record of `entry` of a schedule on a GPU with these versions (all buckets, dtypes)."""
        found = []
        for path in sorted((self.root / schedule[:16]).glob("*.json")):
            record = self.read(path)
            if record is not None and (record["key"]["schedule"], record["key"]["gpu"], record["key"]["triton"],
                                       record["key"]["k3compile"], entry_of(record["key"])) == \
                    (schedule, gpu, triton, k3c, entry):
                found.append(record)
        return found
