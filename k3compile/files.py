"""Writing the files k3compile keeps (compiled modules, the frontend's symbol cache, tuning
records) so that readers never see half of one. Beside the driver, not in it: the frontend, which
the driver imports, writes its cache with it too."""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def write_file_atomic(path: Path, data: bytes) -> None:
    """Write via a temporary file in the same folder and a rename: a process that reads the file
    while another writes it sees the old file or the new one, never half of one, and a crash
    never leaves an empty one (fsync before the rename). The file gets mode 0666 less the umask,
    as open() gives (mkstemp's 0600 would hide a shared cache from other users)."""
    scratch = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(scratch, path)
    except BaseException:
        scratch.unlink(missing_ok=True)
        raise
