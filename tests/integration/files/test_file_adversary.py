"""What an adversary tries with files, over real sockets (docs/protocol.md §2 "Files").

Each case of the issue's list against a running gateway: another key's file
(in a turn, on the file route), a file of another session of the same key, a
file that lies about its type (a PNG header on text, a GIF labelled PNG, an
SVG under any name, text with a NUL), a decompression bomb, a body one byte
over the limit (declared, and chunked), a slow upload, a flood past the
key's quota, a file of a session being deleted, and malformed inline files.

The slow upload runs in real time with ``[server] body_timeout_s = 1``: the
gateway's transport reads a real socket, which Trio's ``MockClock`` cannot
drive (tests/unit/http/test_http_transport.py drives the same deadline with
it on an in-memory stream).
"""

from __future__ import annotations

import base64
import contextlib
import io
import struct
import threading
import time
import warnings
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from PIL import Image

from gateway import media
from gateway.errors import ApiError
from gateway.store.sqlite.store import SqliteStore
from tests.conftest import Harness, make_config, running_gateway
from tests.files_support import png
from tests.integration.doors.rest.test_http_api import assert_error
from tests.integration.tenancy.test_tenants import tenants
from tests.unit.http.test_http_transport import error_of, parse_response, read_until_eof

MIB = 1024 * 1024


async def upload(http: httpx.AsyncClient, sid: str, data: bytes, media_type: str) -> httpx.Response:
    return await http.post(
        f"/sessions/{sid}/files", content=data, headers={"Content-Type": media_type}
    )


async def uploaded(http: httpx.AsyncClient, sid: str, data: bytes, media_type: str) -> str:
    r = await upload(http, sid, data, media_type)
    assert r.status_code == 201, r.text
    return str(r.json()["file_id"])


async def turn(http: httpx.AsyncClient, sid: str, *blocks: dict[str, Any]) -> httpx.Response:
    return await http.post(f"/sessions/{sid}/turns", json={"content": list(blocks)})


def port_of(gw: Harness) -> int:
    return int(gw.base.rsplit(":", 1)[1])


def inline(data: bytes | str, media_type: str = "image/png") -> dict[str, Any]:
    encoded = data if isinstance(data, str) else base64.b64encode(data).decode()
    return {
        "type": "image",
        "source": {"type": "base64", "media_type": media_type, "data": encoded},
    }


@asynccontextmanager
async def gateway(tmp_path: Path, **overrides: Any) -> AsyncIterator[Harness]:
    with trio.fail_after(60):
        async with running_gateway(make_config(tmp_path, **overrides)) as gw:
            yield gw


# --- whose file ---------------------------------------------------------------------


async def test_another_keys_file_is_no_file_in_a_turn_nor_on_the_route(tmp_path: Path) -> None:
    async with tenants(tmp_path) as (a, b):
        sid_a, sid_b = await a.create_session(), await b.create_session()
        image = png()
        fid = await uploaded(a.http, sid_a, image, "image/png")
        assert_error(
            await turn(b.http, sid_b, {"type": "image", "file_id": fid}), 422, "unknown_file"
        )
        # the other key's session does not exist to b: the same body an unknown id gets
        for r in (
            await b.http.get(f"/sessions/{sid_a}/files/{fid}"),
            await upload(b.http, sid_a, image, "image/png"),
            await turn(b.http, sid_a, {"type": "image", "file_id": fid}),
        ):
            assert_error(r, 404, "session_not_found")
        # the file id under b's own session: no file of it
        assert_error(await b.http.get(f"/sessions/{sid_b}/files/{fid}"), 404, "file_not_found")
        # the same bytes posted by b are b's own file (same id), counted to b
        assert await uploaded(b.http, sid_b, image, "image/png") == fid
        assert (await b.http.get(f"/sessions/{sid_b}/files/{fid}")).content == image
        r = await a.http.get(f"/sessions/{sid_a}/files/{fid}")
        assert r.status_code == 200 and r.content == image


async def test_a_file_of_one_session_is_no_file_of_another_of_the_same_key(tmp_path: Path) -> None:
    async with gateway(tmp_path) as gw:
        first, second = await gw.create_session(), await gw.create_session()
        fid = await uploaded(gw.http, first, png(), "image/png")
        block = {"type": "image", "file_id": fid}
        assert_error(await turn(gw.http, second, block), 422, "unknown_file")
        assert_error(await gw.http.get(f"/sessions/{second}/files/{fid}"), 404, "file_not_found")
        for odd in ("file_" + "z" * 500, fid.upper(), fid[:-1]):
            assert_error(await gw.http.get(f"/sessions/{first}/files/{odd}"), 404, "file_not_found")
        traversal = f"/sessions/{first}/files/..%2F..%2Fetc%2Fpasswd"
        assert_error(await gw.http.get(traversal), 404, "not_found")  # no such route
        assert (await turn(gw.http, first, block)).status_code == 202
        assert await gw.node.store.files_of(second) == []


# --- what a file is ---------------------------------------------------------------


def gif() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (3, 3), (1, 2, 3)).save(out, "GIF")
    return out.getvalue()


SVG = (
    b'<svg xmlns="http://www.w3.org/2000/svg" onload="alert(document.cookie)">'
    b"<script>x()</script></svg>"
)


@pytest.mark.parametrize(
    ("data", "media_type", "status", "code"),
    [
        (b"\x89PNG\r\n\x1a\n" + b"#!/bin/sh\nrm -rf /\n" * 20, "image/png", 422, "invalid_file"),
        (gif(), "image/png", 422, "invalid_file"),
        (png(), "image/gif", 422, "invalid_file"),
        (png()[:-24], "image/png", 422, "invalid_file"),  # its pixels cut short
        (png()[:-12], "image/png", 422, "invalid_file"),  # every pixel, no IEND: Pillow takes it
        (SVG, "image/svg+xml", 415, "unsupported_media_type"),
        (SVG, "image/svg+xml; charset=utf-8", 415, "unsupported_media_type"),
        (SVG, "image/png", 422, "invalid_file"),
        (SVG, "text/html", 415, "unsupported_media_type"),
        (SVG, "", 415, "unsupported_media_type"),
        (b"plain\x00text", "text/plain", 422, "invalid_file"),
        (b"", "text/plain", 422, "invalid_file"),
        (b"%PDF-1.4 but no end", "application/pdf", 422, "invalid_file"),
    ],
    ids=[
        "png-header-on-a-script",
        "gif-as-png",
        "png-as-gif",
        "truncated-png",
        "png-without-iend",
        "svg",
        "svg-charset",
        "svg-as-png",
        "html",
        "no-type",
        "text-with-nul",
        "empty",
        "pdf-without-end",
    ],
)
async def test_a_file_that_is_not_what_it_says_is_refused(
    gw: Harness, data: bytes, media_type: str, status: int, code: str
) -> None:
    sid = await gw.create_session()
    assert_error(await upload(gw.http, sid, data, media_type), status, code)
    if media_type:  # the same inline in a turn: the same refusal, nothing stored
        kind = "image" if media_type.startswith("image/") else "document"
        block = inline(data, media_type) | {"type": kind}
        assert_error(await turn(gw.http, sid, block), status, code)
    assert await gw.node.store.files_of(sid) == []


async def test_an_svg_sent_as_text_is_served_as_an_inert_download(gw: Harness) -> None:
    """Text is text: the gateway keeps it, and never gives it back as something a
    browser would render or run."""
    sid = await gw.create_session()
    fid = await uploaded(gw.http, sid, SVG, "text/plain")
    r = await gw.http.get(f"/sessions/{sid}/files/{fid}")
    assert r.content == SVG and r.headers["content-type"] == "text/plain; charset=utf-8"
    assert r.headers["content-disposition"].startswith("attachment")
    assert r.headers["x-content-type-options"] == "nosniff"
    assert "sandbox" in r.headers["content-security-policy"]


def png_bomb(width: int, height: int) -> bytes:
    """A 1-bit PNG of ``width`` x ``height`` black pixels, written row by row: a few KB
    of file for a huge picture (no picture is ever made here)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    packer = zlib.compressobj(9)
    row = b"\x00" * (1 + (width + 7) // 8)
    idat = b"".join(packer.compress(row) for _ in range(height)) + packer.flush()
    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


@pytest.mark.parametrize(("width", "height"), [(20000, 20000), (7900, 7900)], ids=["side", "area"])
async def test_a_decompression_bomb_is_refused_undecoded_and_fast(
    gw: Harness, monkeypatch: pytest.MonkeyPatch, width: int, height: int
) -> None:
    """20000 a side (over 8,000), and 7900 x 7900 (under it, over 40 M pixels)."""
    bomb = png_bomb(width, height)
    assert len(bomb) < 300 * 1024
    decoded: list[tuple[int, int]] = []
    real_load = Image.Image.load

    def load(image: Image.Image) -> Any:
        decoded.append(image.size)
        return real_load(image)

    monkeypatch.setattr(Image.Image, "load", load)
    sid = await gw.create_session()
    started = time.monotonic()
    r = await upload(gw.http, sid, bomb, "image/png")
    elapsed = time.monotonic() - started
    assert_error(r, 422, "invalid_file")
    assert "pixels" in r.json()["error"]["message"]
    assert decoded == [] and elapsed < 2.0
    assert_error(await turn(gw.http, sid, inline(bomb)), 422, "invalid_file")
    assert decoded == []
    assert (await upload(gw.http, sid, png(), "image/png")).status_code == 201
    assert decoded and set(decoded) == {(4, 3)}  # the spy works: a real image is decoded


async def test_checks_in_threads_at_once_leave_the_warning_filters_as_they_were(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Image checks run in worker threads, two at once (gateway.session.files): checking a
    bomb (Pillow warns as it opens one) must not change the process's warning filters,
    as a ``warnings.catch_warnings`` around each check did when two overlapped."""
    bomb = png_bomb(10000, 10000)  # over Pillow's own limit: its warning fires at open
    media.check("image/png", png(), max_pixels=40_000_000)  # the one filter it adds, once
    before = list(warnings.filters)
    opened = Image.open

    def slow_open(*args: Any, **kw: Any) -> Any:  # two checks surely overlap
        time.sleep(0.01)
        return opened(*args, **kw)

    monkeypatch.setattr(Image, "open", slow_open)

    def check() -> None:
        for _ in range(10):
            with contextlib.suppress(ApiError):
                media.check("image/png", bomb, max_pixels=40_000_000)

    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(trio.to_thread.run_sync, check)
    assert warnings.filters == before


# --- how big, how slow ----------------------------------------------------------------


async def raw_request(port: int, head: bytes, body: bytes = b"", *, pace: float = 0) -> bytes:
    """Send ``head`` then ``body`` (64 KiB every ``pace`` s) on a fresh socket while
    reading the answer until the server closes; what it answered."""
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:

        async def send() -> None:
            try:
                await stream.send_all(head)
                for at in range(0, len(body), 65536):
                    await stream.send_all(body[at : at + 65536])
                    await trio.sleep(pace)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass  # the server closed: what it answered is read below

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send)
            answer = await read_until_eof(stream)
            nursery.cancel_scope.cancel()
    return answer


def post_head(sid: str, path: str = "files", **headers: str) -> bytes:
    lines = [f"POST /sessions/{sid}/{path} HTTP/1.1", "Host: 127.0.0.1"]
    lines += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def test_a_body_one_byte_over_the_limit_is_413_unread_or_cut_off(gw: Harness) -> None:
    sid = await gw.create_session()
    over = 20 * MIB + 1
    head = post_head(sid, Content_Type="text/plain", Content_Length=str(over))
    with trio.fail_after(5):  # declared: answered from the head, no byte of the body sent
        status, headers, body = parse_response(await raw_request(port_of(gw), head))
    assert (status, error_of(body)["code"]) == (413, "file_too_large")
    assert headers["connection"] == "close"
    chunked = post_head(sid, Content_Type="text/plain", Transfer_Encoding="chunked")
    piece = b"100000\r\n" + b"a" * MIB + b"\r\n"
    data = piece * 20 + b"1\r\na\r\n" + piece * 10 + b"0\r\n\r\n"
    with trio.fail_after(20):  # chunked: cut off the moment it passes 20 MiB
        status, headers, body = parse_response(await raw_request(port_of(gw), chunked, data))
    assert (status, error_of(body)["code"]) == (413, "file_too_large")
    # exactly the limit is a file
    r = await upload(gw.http, sid, b"a" * (20 * MIB), "text/plain")
    assert r.status_code == 201, r.text
    # a turn takes max_body_bytes and one file's base64, no more
    head = post_head(sid, "turns", Content_Type="application/json", Content_Length=str(30 * MIB))
    with trio.fail_after(5):
        status, _, body = parse_response(await raw_request(port_of(gw), head))
    assert (status, error_of(body)["code"]) == (413, "body_too_large")


@pytest.mark.slow  # real time: a second of body timeout
async def test_a_slow_upload_is_408_at_the_body_timeout(tmp_path: Path) -> None:
    async with gateway(tmp_path, **{"server.body_timeout_s": 1.0}) as gw:
        sid = await gw.create_session()
        body = b"s" * (4 * MIB)  # 64 KiB every 0.1 s: 6.4 s to send it all
        head = post_head(sid, Content_Type="text/plain", Content_Length=str(len(body)))
        started = time.monotonic()
        with trio.fail_after(10):
            raw = await raw_request(port_of(gw), head, body, pace=0.1)
        elapsed = time.monotonic() - started
        status, headers, answer = parse_response(raw)
        assert (status, error_of(answer)["code"]) == (408, "request_timeout")
        assert headers["connection"] == "close"
        assert 0.9 < elapsed < 5.0  # 1 s, and what a busy machine adds
        assert await gw.node.store.files_of(sid) == []
        # the same body sent at once is a file
        assert (await upload(gw.http, sid, body, "text/plain")).status_code == 201


# --- how many -----------------------------------------------------------------------------


def text_file(n: int, size: int = 300 * 1024) -> bytes:
    return (b"file %06d " % n) * (size // 12)


async def test_a_flood_past_the_quota_lands_what_fits_then_deleting_gives_room(
    tmp_path: Path,
) -> None:
    """``max_file_mb_per_key = 1``: of 12 files of 300 KB sent at once, exactly 3 land."""
    async with tenants(tmp_path, **{"limits.max_file_mb_per_key": 1}) as (a, b):
        sid = await a.create_session()
        answers: list[httpx.Response] = []

        async def one(n: int) -> None:
            answers.append(await upload(a.http, sid, text_file(n), "text/plain"))

        async with trio.open_nursery() as nursery:
            for n in range(12):
                nursery.start_soon(one, n)
        assert sorted(r.status_code for r in answers) == [201] * 3 + [429] * 9
        assert_error(next(r for r in answers if r.status_code == 429), 429, "quota_exceeded")
        # another session of the key: the quota is the key's
        other = await a.create_session()
        assert_error(
            await upload(a.http, other, text_file(99), "text/plain"), 429, "quota_exceeded"
        )
        doc = {"type": "document", "source": {"type": "base64", "media_type": "text/plain"}}
        doc["source"]["data"] = base64.b64encode(text_file(98)).decode()  # type: ignore[index]
        assert_error(await turn(a.http, other, doc), 429, "quota_exceeded")
        # another key is not held back by a's files
        sid_b = await b.create_session()
        assert (await upload(b.http, sid_b, text_file(0), "text/plain")).status_code == 201
        # deleting the session gives a's bytes back
        assert (await a.http.delete(f"/sessions/{sid}")).status_code == 204
        for n in range(3):
            assert (
                await upload(a.http, other, text_file(200 + n), "text/plain")
            ).status_code == 201
        assert_error(
            await upload(a.http, other, text_file(300), "text/plain"), 429, "quota_exceeded"
        )


async def test_a_flood_of_files_into_one_session_stops_at_max_per_session(
    tmp_path: Path,
) -> None:
    async with gateway(tmp_path, **{"files.max_per_session": 3}) as gw:
        sid = await gw.create_session()
        answers: dict[bytes, httpx.Response] = {}

        async def one(n: int) -> None:
            data = b"note %d" % n
            answers[data] = await upload(gw.http, sid, data, "text/plain")

        async with trio.open_nursery() as nursery:
            for n in range(8):
                nursery.start_soon(one, n)
        assert sorted(r.status_code for r in answers.values()) == [201] * 3 + [409] * 5
        refused = [d for d, r in answers.items() if r.status_code == 409]
        assert_error(answers[refused[0]], 409, "too_many_files")
        assert len(await gw.node.store.files_of(sid)) == 3
        # a file already there is answered again, the session full or not
        landed = next(d for d, r in answers.items() if r.status_code == 201)
        r = await upload(gw.http, sid, landed, "text/plain")
        assert r.status_code == 201 and r.json() == answers[landed].json()
        assert_error(await upload(gw.http, sid, refused[0], "text/plain"), 409, "too_many_files")


async def test_a_file_of_a_deleted_session_is_gone_and_a_racing_put_leaves_nothing(
    gw: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Uploads held in their check (after the session was found) while the session is
    deleted: each is 404 when it reaches the store, and nothing is left."""
    sid = await gw.create_session()
    fid = await uploaded(gw.http, sid, png(), "image/png")
    assert await gw.node.files.read(sid, [fid]) == {fid: ("image/png", png())}  # now cached
    release, inside = threading.Event(), threading.Semaphore(0)
    real_check = media.check

    def held_check(media_type: str, data: bytes, *, max_pixels: int) -> None:
        inside.release()
        release.wait(10)
        real_check(media_type, data, max_pixels=max_pixels)

    monkeypatch.setattr(media, "check", held_check)
    answers: list[httpx.Response] = []

    async def put(n: int) -> None:
        data, kind = (png(n + 1, 2), "image/png") if n % 2 else (text_file(n, 4096), "text/plain")
        answers.append(await upload(gw.http, sid, data, kind))

    async with trio.open_nursery() as nursery:
        for n in range(4):
            nursery.start_soon(put, n)
        for _ in range(2):  # two checks run at once (gateway.session.files): both held
            await trio.to_thread.run_sync(inside.acquire)
        assert (await gw.http.delete(f"/sessions/{sid}")).status_code == 204
        release.set()
    for r in answers:
        assert_error(r, 404, "session_not_found")
    assert len(answers) == 4
    assert_error(await gw.http.get(f"/sessions/{sid}/files/{fid}"), 404, "session_not_found")
    assert_error(await upload(gw.http, sid, png(), "image/png"), 404, "session_not_found")
    assert await gw.node.store.files_of(sid) == []
    assert await gw.node.files.read(sid, [fid]) == {}  # nor in the node's cache
    store = gw.node.store
    assert isinstance(store, SqliteStore)
    rows = await store._read(  # the table itself: no row of the session is left
        lambda db: db.read(lambda r: r.execute("SELECT count(*) FROM files").fetchone()[0])
    )
    assert rows == 0


# --- malformed inline files ---------------------------------------------------------------


async def test_a_malformed_inline_file_is_422_and_stores_nothing(gw: Harness) -> None:
    sid = await gw.create_session()
    fid = await uploaded(gw.http, sid, png(3, 3), "image/png")
    both = inline(png()) | {"file_id": fid}
    for block, code in [
        (inline("not base64 at all!"), "invalid_body"),
        (inline(base64.b64encode(png()).decode()[:-3]), "invalid_body"),  # cut mid-quantum
        (both, "invalid_body"),
        ({"type": "image"}, "invalid_body"),
        ({"type": "document", "file_id": fid}, "invalid_body"),  # a PNG is no document
        ({"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}, "invalid_body"),
    ]:
        assert_error(await turn(gw.http, sid, block), 422, code)
    assert [r.file_id for r in await gw.node.store.files_of(sid)] == [fid]


async def test_a_refused_turns_inline_file_stays_a_file_counted_once(gw: Harness) -> None:
    """docs/protocol.md §2 "Files": kept before the turn is admitted; sent again, the same."""
    sid = await gw.create_session()
    slow = {"script": {"delay_ms": 20, "rounds": [[{"lorem": 40}]]}}
    async with gw.client(sid) as watcher:
        await watcher.subscribe()
        await gw.submit(sid, slow)
        image = png(6, 6)
        body = {"content": [inline(image)], "if_busy": "reject"}
        for _ in range(3):
            r = await gw.http.post(f"/sessions/{sid}/turns", json=body)
            assert_error(r, 409, "turn_in_progress")
        await watcher.until_turn_ends()
        assert len(await gw.node.store.files_of(sid)) == 1
        r = await gw.http.post(f"/sessions/{sid}/turns", json=body)
        assert r.status_code == 202, r.text
        await watcher.until_turn_ends()
    assert [f.size for f in await gw.node.store.files_of(sid)] == [len(image)]
