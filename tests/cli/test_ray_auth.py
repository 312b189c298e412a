"""deployments/cli/ray_auth.py: a cluster the command starts runs with Ray's token auth and a
token file only its owner can read; a mode or a token the caller set is respected. (The command
itself, with auth on, is tests/cli/test_signals.py; two nodes and a client without the token,
tests/serve/test_cluster_auth.py.)"""

from __future__ import annotations

import os
import stat

import pytest

from deployments.cli import ray_auth

from ..conftest import REPO


@pytest.fixture
def no_auth_env(monkeypatch, tmp_path):
    for name in (ray_auth.MODE_ENV, ray_auth.TOKEN_ENV, ray_auth.TOKEN_PATH_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_token_auth_and_a_private_token_file_by_default(no_auth_env):
    path = ray_auth.for_own_cluster()
    assert path == no_auth_env / ".ray" / "auth_token"  # where Ray and its CLI look
    assert os.environ[ray_auth.MODE_ENV] == "token"
    token = path.read_text()
    assert len(token) == 64 and int(token, 16)  # 256 random bits, as Ray's own generator makes
    assert mode(path) == 0o600 and mode(path.parent) == 0o700
    assert not [p for p in path.parent.iterdir() if p != path]  # nothing left aside
    assert ray_auth.for_own_cluster().read_text() == token  # kept: other clusters may use it


def test_an_existing_token_file_is_kept_and_made_private(no_auth_env, monkeypatch):
    path = no_auth_env / "elsewhere" / "token"
    path.parent.mkdir()
    path.write_text("abc123")
    path.chmod(0o644)
    monkeypatch.setenv(ray_auth.TOKEN_PATH_ENV, str(path))
    assert ray_auth.for_own_cluster() == path
    assert path.read_text() == "abc123" and mode(path) == 0o600


def test_an_empty_token_file_stops_the_command(no_auth_env, monkeypatch):
    path = no_auth_env / "token"
    path.write_text("")
    monkeypatch.setenv(ray_auth.TOKEN_PATH_ENV, str(path))
    with pytest.raises(SystemExit, match="empty"):
        ray_auth.for_own_cluster()


def test_a_mode_or_token_the_caller_set_is_respected(no_auth_env, monkeypatch, capsys):
    monkeypatch.setenv(ray_auth.MODE_ENV, "disabled")
    assert ray_auth.for_own_cluster() is None
    assert "accepts anyone" in capsys.readouterr().err
    monkeypatch.setenv(ray_auth.MODE_ENV, "token")
    monkeypatch.setenv(ray_auth.TOKEN_ENV, "f" * 64)
    assert ray_auth.for_own_cluster() is None
    assert not (no_auth_env / ".ray").exists()


def test_the_command_does_not_import_ray_before_setting_the_auth_mode():
    """Ray reads RAY_AUTH_MODE once, at import: the launcher sets it first (own_cluster_setup),
    so nothing the command imports may import Ray (a GCS started with the token would refuse
    the launcher's own client)."""
    import subprocess
    import sys

    probe = ("import sys, deployments.cli.command, deployments.cli.launch; "
             "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, cwd=REPO)
    assert out.stdout.strip() == "[]", out.stdout
