"""llama-server's CORS headers (server-http.cpp's pre-routing handler), as data: which
``Access-Control-Allow-*`` headers an answer carries for a request's ``Origin``.

``--cors-origins`` ``*`` (the default) with credentials allowed echoes the request's Origin;
``localhost`` echoes it only when its host is localhost, 127.0.0.1 or ::1; any other value is sent
as it is. An OPTIONS preflight also gets the credentials, methods and headers settings.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

DEFAULT_ORIGINS = "*"
DEFAULT_METHODS = "GET, POST, DELETE, OPTIONS"
DEFAULT_HEADERS = "*"
LOCALHOST = "localhost"
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True)
class CorsPolicy:
    origins: str = DEFAULT_ORIGINS
    methods: str = DEFAULT_METHODS
    headers: str = DEFAULT_HEADERS
    credentials: bool = True

    def answer_headers(self, origin: bytes, preflight: bool) -> list[tuple[bytes, bytes]]:
        """The headers an answer to a request from ``origin`` carries."""
        out: list[tuple[bytes, bytes]] = []
        if self.credentials and self.origins == DEFAULT_ORIGINS:
            out.append((b"access-control-allow-origin", origin))
        elif self.origins == LOCALHOST:
            if origin and is_localhost(origin.decode("latin-1")):
                out.append((b"access-control-allow-origin", origin))
        else:
            out.append((b"access-control-allow-origin", self.origins.encode()))
        if preflight:
            out += [(b"access-control-allow-credentials",
                     b"true" if self.credentials else b"false"),
                    (b"access-control-allow-methods", self.methods.encode()),
                    (b"access-control-allow-headers", self.headers.encode())]
        return out


def is_localhost(origin: str) -> bool:
    """The reference's origin_is_localhost: the origin URL's host is a loopback name."""
    try:
        host = urlsplit(origin).hostname
    except ValueError:
        return False
    return host in LOCAL_HOSTS
