"""A rank's output reaches the launcher in whole lines (launcher/programs/spmd_actor.py
``_pump``): seen in CI, two ranks' ``print('module rank', rank, 'of', n)`` from unbuffered
scripts came out as ``[spmd/b/1] module rank[spmd/a/0] module rank  0 of1 2``."""

from __future__ import annotations

import asyncio
import io

from monarch_operator.launcher.programs import spmd_actor


class Out(io.TextIOWrapper):
    """A text stream whose byte writes are recorded one by one."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        raw = io.BytesIO()
        super().__init__(raw)
        self.buffer.write = self.writes.append  # type: ignore[method-assign]


async def pump(pieces: list[tuple[float, bytes]], out: Out, prefix: str) -> None:
    stream = asyncio.StreamReader()

    async def feed() -> None:
        for delay, data in pieces:
            await asyncio.sleep(delay)
            stream.feed_data(data)
        stream.feed_eof()

    await asyncio.gather(feed(), spmd_actor._pump(stream, out, prefix))


def test_a_line_written_in_pieces_is_written_whole():
    out = Out()
    asyncio.run(pump([(0, b"module rank"), (0.05, b" 0"), (0.05, b" of 2\n"),
                      (0.05, b"next\nand a ta"), (0.05, b"il\n")], out, "[spmd/a/0] "))
    assert out.writes == [b"[spmd/a/0] module rank 0 of 2\n", b"[spmd/a/0] next\n",
                          b"[spmd/a/0] and a tail\n"]


def test_two_ranks_writing_in_pieces_keep_their_lines_whole():
    out = Out()

    async def both() -> None:
        await asyncio.gather(
            pump([(0, b"module rank"), (0.02, b" 0 of"), (0.02, b" 2\n")], out, "[a/0] "),
            pump([(0.01, b"module rank"), (0.02, b" 1 of"), (0.02, b" 2\n")], out, "[b/1] "))

    asyncio.run(both())
    assert sorted(b"".join(out.writes).splitlines()) == [b"[a/0] module rank 0 of 2",
                                                          b"[b/1] module rank 1 of 2"]


def test_a_partial_line_goes_out_after_a_while_and_the_last_gets_a_newline():
    out = Out()
    wait = spmd_actor.PARTIAL_LINE_WAIT_S
    asyncio.run(pump([(0, b"progress 10%\r"), (wait + 0.3, b"progress 100%")], out, "[a] "))
    assert out.writes[0] == b"[a] progress 10%\r"  # did not wait for the end of the run
    assert b"".join(out.writes) == b"[a] progress 10%\rprogress 100%\n"
