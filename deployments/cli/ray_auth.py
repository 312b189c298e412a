"""Ray's token authentication for the cluster the launcher starts (#28).

Ray 2.60's GCS, raylet and core-worker gRPC servers listen on every interface whatever node
address is asked for (docs/deploy.md, "Which ports open where"), so a cluster of mlxray's own
runs with ``RAY_AUTH_MODE=token``: every gRPC call and every dashboard or agent HTTP request
must carry the cluster's token. Ray reads the token from ``RAY_AUTH_TOKEN``, else the file
``RAY_AUTH_TOKEN_PATH`` names, else ``~/.ray/auth_token``; the launcher creates that file (a
random 256-bit token, readable by its owner only) when there is none, so ``ray status``,
``serve status`` and a second ``ray start`` on the same account find it too.
``RAY_AUTH_MODE=disabled``, set by the caller, is respected (the test suite's cluster).
"""

from __future__ import annotations

import os
import secrets
import stat
import sys
import tempfile
from pathlib import Path

MODE_ENV, TOKEN_ENV, TOKEN_PATH_ENV = "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"


def token_path() -> Path:
    """Where Ray reads the token file: RAY_AUTH_TOKEN_PATH, else ~/.ray/auth_token."""
    named = os.environ.get(TOKEN_PATH_ENV)
    return Path(named).expanduser() if named else Path.home() / ".ray" / "auth_token"


def for_own_cluster() -> Path | None:
    """Token auth on for a cluster the command starts, unless the caller set another mode; the
    token file made (or kept to its owner) when Ray is to read one. The file, or None when the
    token is in the environment or auth is off."""
    mode = os.environ.setdefault(MODE_ENV, "token").lower()
    if mode != "token":
        print(f"mlxray: warning: {MODE_ENV}={mode}: the Ray cluster accepts anyone who can "
              "reach its ports", file=sys.stderr, flush=True)
        return None
    if os.environ.get(TOKEN_ENV):
        return None
    path = token_path()
    ensure_token_file(path)
    return path


def ensure_token_file(path: Path) -> None:
    """A token in ``path``, readable and writable by its owner only: made if missing (never
    overwritten: other clusters of this account may use it), its mode narrowed if wider."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not path.exists():
        # written aside, then linked into place: a reader never sees it half written, and of two
        # commands starting at once one token wins
        fd, aside = tempfile.mkstemp(dir=path.parent, prefix=".auth_token.")  # mode 0600
        try:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))
            os.link(aside, path)
        except FileExistsError:
            pass
        finally:
            os.unlink(aside)
    if stat.S_IMODE(path.stat().st_mode) & 0o077:
        os.chmod(path, 0o600)
    if not path.read_text().strip():
        raise SystemExit(f"mlxray: error: the Ray token file {path} is empty")
