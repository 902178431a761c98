"""Lines of a streamed HTTP body (NDJSON, server-sent events), whatever its chunks and line lengths.

The client libraries' own line readers cap a line's length (aiohttp: 128 KiB) and some split on
every Unicode line boundary; a variable's value or a model's output streamed as one line may be
longer, and its text may hold such characters. Lines end at `\\n` (a `\\r` before it is dropped); a
last line without its end still counts. Bytes are decoded per whole line (UTF-8: a character is
never cut by `\\n`), so a character split across chunks arrives whole.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator


async def text_lines(chunks: AsyncIterable[bytes]) -> AsyncIterator[str]:
    pending: list[bytes] = []  # the current line's pieces (one long line costs linear time)
    async for chunk in chunks:
        first, *rest = chunk.split(b"\n")
        pending.append(first)
        if not rest:
            continue
        yield _decode(b"".join(pending))
        for line in rest[:-1]:
            yield _decode(line)
        pending = [rest[-1]]
    tail = b"".join(pending)
    if tail:
        yield _decode(tail)


def _decode(line: bytes) -> str:
    return line.removesuffix(b"\r").decode("utf-8", errors="replace")
