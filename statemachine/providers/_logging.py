"""``RedactSecrets``: a structlog processor that keeps API keys out of log output.

The library never configures structlog; an application that logs provider activity
adds this processor to its own chain (the ``run`` command does), so that a key that
reaches an event by any route (an error text that echoes it, a header, a repr) is
replaced before anything is rendered.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any

from ._errors import redact

__all__ = ["RedactSecrets"]

_SENSITIVE_KEYS = frozenset({"api_key", "apikey", "authorization", "x-api-key", "token"})


class RedactSecrets:
    """Replace each secret, wherever it occurs in an event, by ``[REDACTED]``; values
    under keys such as ``api_key`` or ``authorization`` are redacted whole."""

    def __init__(self, secrets: Iterable[str]) -> None:
        self.secrets = tuple(s for s in secrets if s)

    def _clean(self, value: Any) -> Any:
        if isinstance(value, str):
            return redact(value, self.secrets)
        if isinstance(value, Mapping):
            return {
                k: "[REDACTED]" if str(k).lower() in _SENSITIVE_KEYS else self._clean(v)
                for k, v in value.items()
            }
        if isinstance(value, (list, tuple)):
            return type(value)(self._clean(v) for v in value)
        if isinstance(value, BaseException):
            return redact(f"{type(value).__name__}: {value}", self.secrets)
        return value

    def __call__(
        self, logger: Any, method_name: str, event_dict: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        for key in list(event_dict):
            if key.lower() in _SENSITIVE_KEYS:
                event_dict[key] = "[REDACTED]"
            else:
                event_dict[key] = self._clean(event_dict[key])
        return event_dict
