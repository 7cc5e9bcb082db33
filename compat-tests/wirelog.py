#!/usr/bin/env python3
"""A loopback TCP proxy that logs every byte between the SDKs and envd.

    wirelog.py LISTEN_PORT UPSTREAM_PORT LOGFILE

Listens on 127.0.0.1:LISTEN_PORT, forwards to 127.0.0.1:UPSTREAM_PORT and
appends one line per chunk to LOGFILE: time, connection number, direction
(`>` client to envd, `<` envd to client) and the bytes as a Python literal
(Connect-JSON envelopes and HTTP/1.1 headers stay readable). run.sh starts it
when COMPAT_WIRELOG=1. Loopback only; stdlib only.
"""

import asyncio
import itertools
import sys
import time

MAX_CHUNK_LOG = 4096


async def main() -> None:
    listen_port, upstream_port, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    log = open(path, "a", buffering=1)
    ids = itertools.count(1)
    t0 = time.monotonic()

    async def pipe(n, arrow, reader, writer):
        try:
            while data := await reader.read(65536):
                shown = data if len(data) <= MAX_CHUNK_LOG else data[:MAX_CHUNK_LOG] + b"...<%d bytes>" % len(data)
                log.write(f"{time.monotonic() - t0:9.3f} #{n} {arrow} {shown!r}\n")
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            log.write(f"{time.monotonic() - t0:9.3f} #{n} {arrow} EOF\n")
            try:
                writer.close()
            except Exception:
                pass

    async def handle(creader, cwriter):
        n = next(ids)
        try:
            ureader, uwriter = await asyncio.open_connection("127.0.0.1", upstream_port)
        except OSError as e:
            log.write(f"#{n} upstream connect failed: {e}\n")
            cwriter.close()
            return
        await asyncio.gather(pipe(n, ">", creader, uwriter), pipe(n, "<", ureader, cwriter))

    server = await asyncio.start_server(handle, "127.0.0.1", listen_port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
