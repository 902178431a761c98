"""text_lines: the lines of a streamed body, however it was cut into chunks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from parrot.protocol.framing import text_lines


def lines_of(chunks: list[bytes]) -> list[str]:
    async def stream() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield chunk

    async def collect() -> list[str]:
        return [line async for line in text_lines(stream())]

    return asyncio.run(collect())


def test_lines_cut_anywhere_come_out_whole() -> None:
    assert lines_of([b"da", b"ta: 1\nda", b"ta: 2\r", b"\n\nlast"]) == ["data: 1", "data: 2", "", "last"]


def test_a_character_cut_between_chunks_arrives_whole() -> None:
    word = "naïve ☃\n".encode()
    assert lines_of([word[:3], word[3:9], word[9:]]) == ["naïve ☃"]


def test_a_line_longer_than_client_buffers_is_one_line() -> None:
    """aiohttp's own line reader refuses lines over 128 KiB; a streamed value may be longer."""
    long = b"x" * (1 << 20)
    chunks = [long[i : i + 65536] for i in range(0, len(long), 65536)] + [b"\nnext\n"]
    assert lines_of(chunks) == ["x" * (1 << 20), "next"]


def test_unicode_line_separators_stay_inside_a_line() -> None:
    assert lines_of(["a\u2028b\x85c\rd\n".encode()]) == ["a\u2028b\x85c\rd"]
