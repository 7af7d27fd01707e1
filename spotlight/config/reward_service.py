"""Where a run's reward is computed: in process (the default) or by a reward service over HTTP.

With ``reward.service.url`` set, ``build_reward`` returns a client of the batched HTTP protocol
of ``docs/reward-service.md`` (``spotlight serve-reward`` is its reference server) in place of
the reward itself; ``reward.name`` still names the reward, and the server must serve that one.
"""
from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from spotlight.config.base import ConfigError, Validated, spec

PIXEL_ENCODINGS = ("float32", "uint8")


@dataclass(kw_only=True, frozen=True)
class RewardServiceConfig(Validated):
    """A reward served over HTTP (docs/reward-service.md); an empty url computes it in process."""

    url: str = spec("", "Base URL of a reward service ('spotlight serve-reward'), e.g. "
                    "http://10.0.0.5:8765; empty = compute the reward in process.")
    timeout_s: float = spec(120.0, "Seconds the reward service may take to accept a request and "
                            "for each read of its answer (a whole batch is scored before it "
                            "answers).", range=(0.1, 3600.0))
    retries: int = spec(3, "Retries of a request after a connection error, a time-out, HTTP "
                        "429 or 5xx; another 4xx is never retried.", range=(0, 20))
    backoff_s: float = spec(1.0, "Wait before the first retry, doubled for each next one (at "
                            "most 30 s; a server's Retry-After wins).", range=(0.0, 60.0))
    pixels: str = spec("float32", "How images travel: 'float32' exactly as sampled; 'uint8' in "
                       "a quarter of the bytes, which scores the same with rewards that read "
                       "8-bit pixels (ocr-text, geneval-image) but not with the digits "
                       "world's (ocr, ocr-dense, geneval).", choices=PIXEL_ENCODINGS)

    def validate(self) -> None:
        if not self.url:
            return
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"reward.service.url = {self.url!r} must be an http:// or "
                              "https:// URL with a host, e.g. http://10.0.0.5:8765")
        if parts.query or parts.fragment:
            raise ConfigError(f"reward.service.url = {self.url!r} must not have a query or "
                              "fragment; give the server's base URL")
        try:
            parts.port
        except ValueError:
            raise ConfigError(f"reward.service.url = {self.url!r} has an invalid port") \
                from None
