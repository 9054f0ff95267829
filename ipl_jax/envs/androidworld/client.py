"""One AndroidWorld server over HTTP (``server/android_server.py``: FastAPI, one emulator per server).

Every request has a timeout (a hung server costs at most ``timeout`` seconds a try) and is tried at most
``1 + retries`` times, a second apart; then ``EnvError`` names the URL, the endpoint and the reason. Executing an
action (``idempotent=False``) is retried only when the request never reached the server (a refused connection):
after a timeout the action may already have been played, and playing it twice would change the episode; a server
error there is the device failing to play it (AndroidWorld raises on, e.g., an app it cannot open), which the
episode goes on from, as AndroidWorld's own agents do. When the last try could not connect at all (refused,
unreachable, connect timeout), the ``EnvError`` is ``down``: the server is gone and its slot is dropped; a request
that timed out is not (the server is slow: its episode fails, the slot plays on).
"""

from __future__ import annotations

import time

import requests

from ipl_jax.envs.protocol import EnvError

RETRY_PAUSE = 1.0  # seconds between tries


class Client:
    """Requests to one server: ``get`` / ``post`` give the decoded JSON (or the raw bytes with ``raw=True``)."""

    def __init__(self, url: str, timeout: float = 60.0, retries: int = 2):
        if not str(url).startswith(("http://", "https://")):
            raise EnvError(f"{url}: not an http:// or https:// URL")
        if timeout <= 0 or retries < 0:
            raise EnvError(f"{url}: need timeout > 0 and retries >= 0 (got {timeout}, {retries})")
        self.url = str(url).rstrip("/")
        self.timeout = float(timeout)
        self.retries = int(retries)
        self.session = requests.Session()

    def get(self, endpoint: str, raw: bool = False, **params):
        return self._request("GET", endpoint, params, None, raw, idempotent=True)

    def post(self, endpoint: str, body: dict | None = None, idempotent: bool = True, **params):
        return self._request("POST", endpoint, params, body, False, idempotent)

    def _request(self, method: str, endpoint: str, params: dict, body, raw: bool, idempotent: bool):
        params = {k: _query_value(v) for k, v in params.items()}
        tries = 1 + self.retries
        reason, down = "", False
        for attempt in range(tries):
            if attempt:
                time.sleep(RETRY_PAUSE)
            try:
                r = self.session.request(
                    method,
                    self.url + endpoint,
                    params=params,
                    json=body,
                    timeout=(min(10.0, self.timeout), self.timeout),
                )
            except requests.ConnectionError as e:  # refused (never sent), or reset / connect timeout
                reason, down = _short(e), _never_sent(e)
                if not idempotent and not down:
                    break
                continue
            except requests.RequestException as e:
                reason, down = _short(e), False
                if not idempotent:
                    break
                continue
            if r.status_code >= 500 and idempotent:
                reason, down = f"HTTP {r.status_code}: {_detail(r)}", False
                continue
            if r.status_code >= 500:  # the device failed to play the action (AndroidWorld raises, e.g. no such app)
                return {"status": "error", "message": _detail(r)}
            if r.status_code >= 400:
                raise EnvError(f"{self.url}{endpoint}: HTTP {r.status_code}: {_detail(r)}")
            if raw:
                return r.content
            try:
                return r.json()
            except ValueError:
                raise EnvError(f"{self.url}{endpoint}: the answer is not JSON") from None
        # down: the last try could not even connect (refused, unreachable): the server is gone, not slow
        raise EnvError(f"{self.url}{endpoint}: {reason} (after {attempt + 1} of {tries} tries)", down=down)

    def close(self) -> None:
        self.session.close()


def _query_value(v):
    return ("true" if v else "false") if isinstance(v, bool) else v


def _never_sent(e: Exception) -> bool:
    """Whether a connection error happened before the request was sent (refused, unreachable, connect timeout)."""
    if isinstance(e, requests.ConnectTimeout):
        return True
    if isinstance(e, requests.ReadTimeout):
        return False
    text = repr(e)
    return "NewConnectionError" in text or "Connection refused" in text or "Failed to establish" in text


def _short(e: Exception) -> str:
    """A one-line reason for a requests exception."""
    if isinstance(e, requests.Timeout):
        return "timed out" if not isinstance(e, requests.ConnectTimeout) else "connect timed out"
    text = str(e)
    if "Connection refused" in text or "Failed to establish" in text:
        return "connection refused"
    if "RemoteDisconnected" in text or "Connection aborted" in text or "reset" in text.lower():
        return "connection closed by the server"
    return " ".join(f"{type(e).__name__}: {text}".split())[:200]


def _detail(r) -> str:
    try:
        d = r.json()
        text = str(d.get("detail", d)) if isinstance(d, dict) else str(d)
    except ValueError:
        text = r.text
    return " ".join(text.split())[:200] or r.reason or ""
