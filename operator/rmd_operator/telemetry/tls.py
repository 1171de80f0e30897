"""Trust for the collectors' HTTPS calls: the system's CAs by default, a CA bundle from a Secret when the
NodeConfig names one (`caBundleSecret`), no verification only with `insecureSkipVerify: true`.

BMCs mostly carry self-signed certificates; WAO answered that by never verifying. Here the user either
trusts the BMCs' CA or says, per endpoint, that it is not verified (and the condition message says so).
"""

from __future__ import annotations

import contextlib
import os
import re
import ssl
import tempfile
from dataclasses import dataclass

_SSL_DETAIL = re.compile(r"\[SSL[^\]]*\]\s*([^()'\"]+)")


@dataclass(frozen=True)
class Trust:
    ca_pem: str | None = None  # PEM bundle; None: the system's CAs
    insecure: bool = False  # skip verification (explicit opt-in)

    def ssl_context(self) -> ssl.SSLContext | bool:
        """aiohttp's `ssl` argument: False skips verification, a context verifies (hostname included)."""
        if self.insecure:
            return False
        if self.ca_pem:
            return ssl.create_default_context(cadata=self.ca_pem)  # only this bundle, as kubectl's CA
        return ssl.create_default_context()


class CAFile:
    """The bundle written to a private file, for requests/sushy, which take a path. `close()` deletes it."""

    def __init__(self, pem: str) -> None:
        fd, self.path = tempfile.mkstemp(prefix="rmd-telemetry-ca-", suffix=".pem")
        with os.fdopen(fd, "w") as handle:
            handle.write(pem)

    def close(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def ssl_detail(text: str) -> str:
    """The OpenSSL reason inside an exception's text, e.g. 'certificate verify failed: self-signed ...'."""
    match = _SSL_DETAIL.search(text)
    return match.group(1).strip() if match else text
