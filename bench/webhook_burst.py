"""How many connections of a burst the webhook server answers (`reconciler run --listen`).

A forge that delivers a backlog at once (an outage ending, a mass push, a script) opens many
connections together. This opens `--connections` TCP connections to the real server (uvicorn, as
the daemon runs it, here in this process on 127.0.0.1), all at once; only when every one is open
does each send a genuine signed GitHub push (its own commit and delivery id, so none is a replay)
and wait for the answer. A connection is answered when an HTTP status line comes back; it is reset,
refused or timed out otherwise. Beside the burst, `--half-open` connections open and send nothing,
or half a request, then close: each must cost one line in the log and no traceback.

    python bench/webhook_burst.py                      # a burst of 500 (the figure in docs/performance.md)
    python bench/webhook_burst.py --connections 200    # a smaller one (tests/)

The last line: connections=N answered=A accepted=P reset=R refused=F timed_out=T half_open_logged=H
tracebacks=B seconds=S
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import hmac
import io
import json
import logging
import secrets
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reconciler.daemon.webhook_server import WebhookServer  # noqa: E402 - after the path above

TIMEOUT = 30.0  # seconds a connection may wait for its answer before it counts as timed out


def request(secret: bytes) -> bytes:
    """A signed GitHub push to main, as one HTTP/1.1 request that asks the server to close after."""
    body = json.dumps({"ref": "refs/heads/main", "before": "0" * 40, "after": secrets.token_hex(20),
                       "repository": {"pushed_at": int(time.time())}, "commits": []}).encode()
    head = {"Host": "bench", "Content-Type": "application/json", "Content-Length": str(len(body)),
            "Connection": "close", "X-GitHub-Event": "push", "X-GitHub-Delivery": str(uuid.uuid4()),
            "X-Hub-Signature-256": "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()}
    return ("POST /webhook HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in head.items()) + "\r\n").encode() + body


async def one(address: tuple[str, int], payload: bytes, opened: asyncio.Barrier) -> str:
    """The answer's status code, or what went wrong: reset, refused, timed_out."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(*address), TIMEOUT)
    except ConnectionRefusedError:
        await opened.wait()
        return "refused"
    except (TimeoutError, OSError):
        await opened.wait()
        return "reset"
    try:
        await opened.wait()  # every connection is open before any request goes
        writer.write(payload)
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), TIMEOUT)
        return line.split()[1].decode() if line.startswith(b"HTTP/1.1 ") else "reset"
    except TimeoutError:
        return "timed_out"
    except OSError:
        return "reset"
    finally:
        writer.close()


async def abandon(address: tuple[str, int], what: bytes) -> None:
    """A client that sends `what` (maybe nothing) and goes away."""
    _reader, writer = await asyncio.open_connection(*address)
    writer.write(what)
    await writer.drain()
    writer.close()


async def burst(address: tuple[str, int], secret: bytes, connections: int, half_open: int) -> Counter[str]:
    opened = asyncio.Barrier(connections)
    payloads = [request(secret) for _ in range(connections)]
    partial = [b"", b"POST /webhook HTTP/1.1\r\nHost: bench\r\nContent-Le"]
    strays = [abandon(address, partial[i % 2]) for i in range(half_open)]
    outcomes = await asyncio.gather(*(one(address, p, opened) for p in payloads), *strays)
    return Counter(o for o in outcomes if o is not None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connections", type=int, default=500, help="connections opened at once (default 500)")
    parser.add_argument("--half-open", type=int, default=20, help="clients that send nothing or half a request")
    args = parser.parse_args()
    logged = io.StringIO()
    handler = logging.StreamHandler(logged)
    logging.getLogger().addHandler(handler)
    logging.getLogger("reconciler").setLevel(logging.INFO)
    secret = secrets.token_hex(16)
    woken = Counter[str]()
    server = WebhookServer("127.0.0.1", 0, secret=secret, wake=lambda: woken.update(["tick"]), branch=lambda: "main")
    address = server.start()
    started = time.monotonic()
    try:
        with contextlib.redirect_stderr(logged):  # whatever the server prints beside its log counts too
            outcomes = asyncio.run(burst(address, secret.encode(), args.connections, args.half_open))
            seconds = time.monotonic() - started
            deadline = time.monotonic() + 10  # the server logs a closed connection when it notices it
            while logged.getvalue().count("http: connection from") < args.half_open and time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        server.stop()
    text = logged.getvalue()
    answered = sum(n for k, n in outcomes.items() if k.isdigit())
    print(f"burst of {args.connections} connections on 127.0.0.1: answers {dict(sorted(outcomes.items()))}, "
          f"{woken['tick']} ticks asked for, in {seconds:.2f} s")
    print(f"connections={args.connections} answered={answered} accepted={outcomes['202']} reset={outcomes['reset']} "
          f"refused={outcomes['refused']} timed_out={outcomes['timed_out']} "
          f"half_open_logged={text.count('http: connection from')} tracebacks={text.count('Traceback')} "
          f"seconds={seconds:.2f}")


if __name__ == "__main__":
    main()
