"""Mint an OpenAI Realtime ephemeral key for the /voice page (SPEC V3).

Your OpenAI API key stays on your machine (or your app's server): this script reads it
from the ``OPENAI_API_KEY`` environment variable (never from the command line, which
shells keep in their history), asks OpenAI for a short-lived client secret with
``POST /v1/realtime/client_secrets``, and prints only that secret (``ek_...``). Paste it
into the page at ``http://127.0.0.1:8765/voice``; it is valid for a short while (about
a minute by default) to start one session. toolbus never sees either key.

    OPENAI_API_KEY=sk-... python examples/voice/mint_key.py [--model gpt-realtime]

In an app, your server does the same for each signed-in user and hands the secret to
its page; docs/voice.md describes the flow. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request

CLIENT_SECRETS_URL = "https://api.openai.com/v1/realtime/client_secrets"
DEFAULT_MODEL = "gpt-realtime"


def build_request(api_key: str, model: str = DEFAULT_MODEL) -> urllib.request.Request:
    """The client-secret request: the API key in the Authorization header, the session
    (``type: realtime`` and its model) in the JSON body."""
    body = {"session": {"type": "realtime", "model": model}}
    return urllib.request.Request(
        CLIENT_SECRETS_URL,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"},
    )


def secret_from(reply: bytes) -> str:
    """The ``value`` of the client-secret response (``{"value": "ek_...", ...}``)."""
    value = json.loads(reply)["value"]
    if not isinstance(value, str) or not value.startswith("ek_"):
        raise ValueError("OpenAI's answer carries no ek_ client secret")
    return value


class MintError(Exception):
    """The secret could not be minted; the message is one line for the user."""


def mint(api_key: str, model: str = DEFAULT_MODEL, timeout: float = 30.0) -> str:
    """Ask OpenAI for a client secret and return it (``ek_...``).

    Raises:
        MintError: OpenAI cannot be reached (no network, DNS, timeout), refused the
            request (an HTTP error status, e.g. 401 for a wrong key), or answered
            without a client secret. Never holds the API key.
    """
    host = urllib.parse.urlsplit(CLIENT_SECRETS_URL).netloc
    try:
        with urllib.request.urlopen(build_request(api_key, model), timeout=timeout) as reply:
            body = reply.read()
    except urllib.error.HTTPError as exc:
        raise MintError(f"{host} refused the request: HTTP {exc.code} {exc.reason}") from None
    except urllib.error.URLError as exc:
        why = exc.reason
        text = why.strerror if isinstance(why, OSError) and why.strerror else str(why)
        raise MintError(f"cannot reach {host}: {text}") from None
    except OSError as exc:  # a timeout or a connection reset while reading
        raise MintError(f"cannot reach {host}: {exc.strerror or type(exc).__name__}") from None
    try:
        return secret_from(body)
    except (ValueError, KeyError, TypeError):
        raise MintError(f"{host} answered without an ek_ client secret") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    args = parser.parse_args(argv)
    api_key = os.environ.get("OPENAI_API_KEY", "")
    if not api_key:
        print("set OPENAI_API_KEY in the environment (not on the command line)", file=sys.stderr)
        return 2
    try:
        print(mint(api_key, args.model))
    except MintError as exc:
        print(f"mint_key: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
