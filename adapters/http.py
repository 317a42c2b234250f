"""One HTTP convention for every hosted provider (Kaggle, Lightning AI, and the spot markets).

Why one: each provider's API fails in the same few ways, and the planner must hear about them in
the same words. The rules, applied by `HostedApi.call`:

- a timeout on every request (connect 10 s, the rest `timeout` seconds);
- 429 and 502/503/504 are retried (up to `retries` times) after the server's `Retry-After`
  (seconds or an HTTP date), or a short backoff; a wait longer than `max_wait` is not slept
  through: the call gives up at once and the provider is unavailable for this tick;
- a request that may have acted (a launch) is never repeated blindly: after a read timeout or a
  5xx its caller must look the worker up by its labels before trying again; only a connection
  that never opened, or a 429 (refused before acting), is retried;
- a 429 whose error is one of `final_errors` (Vast's daily search quota) is not retried: it raises
  `HttpRefused` for the adapter to map;
- 401/403 raise `ProviderConfigError` naming the provider and where its credentials are read from;
  other 4xx raise `HttpRefused` (a ProviderConfigError carrying status and message) for the adapter
  to map; 429/5xx/timeouts raise `ProviderUnavailable`;
- only a 2xx is an answer: a redirect (never followed: a 3xx is not what any provider's API
  documents), any other status, a body over `max_bytes`, or one that is not strict JSON
  (`adapters.wire.load_json`: no NaN, no duplicate keys, bounded depth) is `ProviderUnavailable`
  ("try later"), never an empty answer that could read as "no workers";
- every error is one sentence that names the provider; no header, credential or request body is
  ever put in a message or a log line (only method, path and status are logged, at debug);
- a signed URL on another host (a log page in a bucket) is read with `get_signed`, without the
  API's headers: the credentials never leave for another host.

Each hosted adapter builds its client through `adapters.hosted_base.HostedAdapter` (its name in
every message, the settings' request timeout, its own credentials' header and places).

httpx is the client (timeouts, HTTP/1.1 keep-alive, `MockTransport` for unit tests). The providers'
official SDKs are not used at run time: kaggle's authenticates (and may exit) at import, and they
cannot all be pointed at another endpoint; each adapter speaks the documented wire format itself,
and a test drives each fake server with the official client to prove the two agree.
"""

from __future__ import annotations

import email.utils
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from adapters.compute import ProviderConfigError, ProviderUnavailable
from adapters.wire import MAX_JSON_BYTES, WireError, load_json

log = logging.getLogger("reconciler.http")

RETRIED_STATUSES = frozenset({429, 502, 503, 504})


class HttpRefused(ProviderConfigError):
    """The provider refused the request (a 4xx other than 401/403/429): `status` and its `message`."""

    def __init__(self, message: str, status: int, detail: str) -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """`Retry-After` as seconds: a number, or an HTTP date (RFC 9110 §10.2.3); None if absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def error_message(body: str | bytes) -> str:
    """A provider's own error text from a JSON error body ({"message"}, {"error"}, {"errors":[...]}),
    shortened to one line; '' when there is none."""
    try:
        data = load_json(body)
    except WireError:
        return ""
    if isinstance(data, dict):
        for key in ("message", "error", "detail", "msg"):
            value = data.get(key)
            if isinstance(value, str) and value:
                return _one_line(value)
            if isinstance(value, dict) and isinstance(value.get("message"), str):
                return _one_line(value["message"])
        errors = data.get("errors")
        if isinstance(errors, list) and errors and isinstance(errors[0], dict):
            return _one_line(str(errors[0].get("message", "")))
    return ""


def _one_line(text: str, limit: int = 200) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


@dataclass
class HostedApi:
    """A hosted provider's HTTP API. `who` names it in messages ("kaggle provider 'kaggle-free'");
    `credentials_hint` says where its credentials are read from, for the one-sentence auth error."""

    who: str
    base_url: str
    headers: Mapping[str, str] = field(default_factory=dict)
    credentials_hint: str = ""
    timeout: float = 30.0
    retries: int = 3
    max_wait: float = 30.0
    transport: httpx.BaseTransport | None = None
    sleep: Callable[[float], None] = time.sleep
    final_errors: frozenset[str] = frozenset()  # error words that are not retried (Vast's search quota)
    max_bytes: int = MAX_JSON_BYTES  # the largest answer read (a page of instances is tens of KB)
    _client: httpx.Client | None = field(default=None, init=False, repr=False)

    @property
    def client(self) -> httpx.Client:
        if self._client is None:
            self._client = httpx.Client(
                base_url=self.base_url.rstrip("/"), headers=dict(self.headers), transport=self.transport,
                timeout=httpx.Timeout(self.timeout, connect=min(10.0, self.timeout)), follow_redirects=False,
            )
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def call(self, method: str, path: str, *, json_body: Any = None, params: Mapping[str, Any] | None = None,
             acts: bool = False, allow: tuple[int, ...] = ()) -> Any:
        """Send one request and return its decoded JSON (None for an empty body or an `allow`ed status).
        `acts=True` marks a request that changes something at the provider (a launch): it is not
        repeated after a timeout or a 5xx, since it may have acted."""
        attempt = 0
        while True:
            attempt += 1
            try:
                response, body = self._send(method, path, json_body, params)
            except httpx.ConnectError as exc:
                self._wait_or_give_up(attempt, None, f"cannot connect ({_one_line(str(exc)) or 'refused'})")
                continue
            except httpx.TimeoutException:
                if acts:
                    raise ProviderUnavailable(
                        f"{self.who}: {method} {path} timed out; it may have acted, so the worker is looked up "
                        "by its labels before any new launch") from None
                self._wait_or_give_up(attempt, None, f"{method} {path} timed out after {self.timeout:g} s")
                continue
            except httpx.HTTPError as exc:
                raise ProviderUnavailable(f"{self.who}: {method} {path} failed: {_one_line(str(exc))}") from None
            log.debug("%s %s %s -> %d", self.who, method, path, response.status_code)
            if (response.status_code in RETRIED_STATUSES and not (acts and response.status_code != 429)
                    and error_message(body) not in self.final_errors):
                wait = retry_after_seconds(response.headers.get("Retry-After"))
                self._wait_or_give_up(attempt, wait, self._status_words(response.status_code, body))
                continue
            return self._decode(method, path, response, body, allow)

    def get_signed(self, url: str, what: str) -> Any:
        """The JSON at a signed URL on another host (`what`: a log page in a bucket): fetched without this
        API's headers, whose credentials must not leave for another host; ProviderUnavailable when
        it cannot be read."""
        try:
            response = httpx.get(url, timeout=self.timeout)
            response.raise_for_status()
            return load_json(response.content) if response.content else None
        except (httpx.HTTPError, ValueError) as exc:
            raise ProviderUnavailable(f"{self.who}: a {what} cannot be read ({type(exc).__name__})") from None

    def _send(self, method: str, path: str, json_body: Any, params: Mapping[str, Any] | None
              ) -> tuple[httpx.Response, bytes]:
        """The response and its body, read no further than `max_bytes` (a provider that sends
        more is not answering what its API documents)."""
        request = self.client.build_request(method, path, json=json_body, params=params)
        response = self.client.send(request, stream=True)
        try:
            body = bytearray()
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > self.max_bytes:
                    raise ProviderUnavailable(
                        f"{self.who} answered {method} {path} with over {self.max_bytes} bytes; "
                        "it is treated as unavailable")
        finally:
            response.close()
        return response, bytes(body)

    def _wait_or_give_up(self, attempt: int, wait: float | None, why: str) -> None:
        """Sleep before the next try, or raise ProviderUnavailable when out of tries or told to wait too long."""
        if wait is None:
            wait = min(self.max_wait, 0.5 * 2 ** (attempt - 1))
        if attempt > self.retries:
            raise ProviderUnavailable(f"{self.who} is unavailable: {why} (tried {attempt} times)")
        if wait > self.max_wait:
            raise ProviderUnavailable(f"{self.who} is unavailable: {why}; it asks to wait {wait:.0f} s")
        self.sleep(wait)

    @staticmethod
    def _status_words(status: int, body: bytes) -> str:
        detail = error_message(body)
        return f"HTTP {status}" + (f" ({detail})" if detail else "")

    def _decode(self, method: str, path: str, response: httpx.Response, body: bytes,
                allow: tuple[int, ...]) -> Any:
        """A 2xx's JSON; every other status is an error in the words the module docstring lists."""
        status = response.status_code
        if status in allow:
            return None
        if status in (401, 403):
            raise ProviderConfigError(
                f"{self.who}: the credentials were refused ({self._status_words(status, body)}); "
                f"{self.credentials_hint or 'check its credentials'}")
        if 400 <= status < 500:
            raise HttpRefused(f"{self.who} refused {method} {path}: {self._status_words(status, body)}", status,
                              error_message(body))
        if status >= 500:
            raise ProviderUnavailable(f"{self.who} is unavailable: {method} {path} answered "
                                      f"{self._status_words(status, body)}")
        if not 200 <= status < 300:
            where = response.headers.get("Location")
            words = self._status_words(status, body) + (f" to {_one_line(where, 80)}" if where else "")
            raise ProviderUnavailable(f"{self.who} is unavailable: {method} {path} answered {words}, "
                                      "not an answer its API documents" + (" (redirects are not followed: check "
                                      "its api_url)" if 300 <= status < 400 else ""))
        if not body:
            return None
        try:
            return load_json(body, limit=self.max_bytes)
        except WireError as exc:
            raise ProviderUnavailable(
                f"{self.who} answered {method} {path} with something that is not JSON as its API documents "
                f"({exc}); it is treated as unavailable") from None
