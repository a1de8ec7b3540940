"""The worker processes of a big audit verify or export: Python processes started afresh, each
checking or writing its share of the ranges of ids on a connection of its own, the answers read
back in order. Run as `python -m storage.audit_workers` by `Workers`, never by hand.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import json
import os
import subprocess
import sys
from collections.abc import Generator, Sequence
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any

from storage.audit_reads import Source, connect, rows
from storage.audit_text import Span, check, csv_lines, jsonl_bytes


class WorkerError(RuntimeError):
    """A worker process ended before it answered (what it printed says why)."""


class Workers:
    """`processes` Python processes started afresh (not forked: no connection, lock or thread
    of this process goes with them), each on a connection of its own, doing one `task`
    ("verify", "jsonl" or "csv") over range k when k mod `processes` is its number; their
    answers are read back in range order. A worker works ahead on its next range while the
    one before is read, holding at most one range's answer."""

    def __init__(
        self,
        source: Source,
        task: str,
        ranges: Sequence[tuple[int, int]],
        processes: int,
        since: datetime | None = None,
    ) -> None:
        self._ranges = len(ranges)
        self._processes: list[subprocess.Popen[bytes]] = []
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parent.parent)  # where `storage` is imported from
        env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
        for k in range(processes):
            worker = subprocess.Popen(
                [sys.executable, "-m", "storage.audit_workers"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                bufsize=0,  # unbuffered: what follows an answer's line stays in the pipe
                env=env,
            )
            self._processes.append(worker)
            assert worker.stdout is not None  # asked for: PIPE
            _widen(worker.stdout.fileno())
            request = {
                "task": task,
                "source": asdict(source),
                "ranges": ranges[k::processes],
                "since": since.isoformat() if since else None,
            }
            # On stdin, not the command line: a password in the URL stays out of `ps`.
            assert worker.stdin is not None  # asked for: PIPE
            worker.stdin.write(json.dumps(request).encode())
            worker.stdin.close()

    def answers(
        self, into: int | None = None
    ) -> Generator[tuple[dict[str, Any], bytes], None, None]:
        """Each range's answer in order: what the worker said, and the text it sent; or, with
        `into` (a file descriptor), b"" once that text has been moved there by the kernel
        (splice), never copied through this process."""
        for k in range(self._ranges):
            worker = self._processes[k % len(self._processes)]
            assert worker.stdout is not None  # asked for: PIPE
            line = worker.stdout.readline()
            if not line:
                raise self._ended(worker)
            said = json.loads(line)
            if "error" in said:
                raise ValueError(said["error"])
            size = said.get("bytes", 0)
            if into is None:
                yield said, self._read(worker, size)
            else:
                self._move(worker, size, into)
                yield said, b""

    def _read(self, worker: subprocess.Popen[bytes], size: int) -> bytes:
        stream = worker.stdout
        assert isinstance(stream, io.FileIO)  # asked for: PIPE, unbuffered
        text = bytearray(size)
        view, done = memoryview(text), 0
        while done < size:
            got = stream.readinto(view[done:])
            if not got:
                raise self._ended(worker)
            done += got
        return bytes(text)

    def _move(self, worker: subprocess.Popen[bytes], size: int, into: int) -> None:
        assert worker.stdout is not None  # asked for: PIPE
        source, left = worker.stdout.fileno(), size
        while left:
            try:
                moved = os.splice(source, into, left)
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.ENOSYS):
                    raise  # a full disk, a closed pipe: the writer's to report
                # `into` cannot be spliced to (a terminal, say): copied instead.
                moved = _write_all(into, self._read(worker, min(left, _PIPE_BYTES)))
            if not moved:
                raise self._ended(worker)
            left -= moved

    @staticmethod
    def _ended(worker: subprocess.Popen[bytes]) -> WorkerError:
        return WorkerError(
            f"an audit worker process ended early (exit status {worker.wait()}); "
            "what it printed above says why"
        )

    def close(self) -> None:
        for worker in self._processes:
            if worker.poll() is None:
                worker.kill()
            worker.wait()
            if worker.stdout is not None:
                worker.stdout.close()


#: The pipe a worker writes into, widened from 64 KiB where the system allows: fewer turns
#: between the worker and its reader for each range's text.
_PIPE_BYTES = 1 << 20


def _widen(pipe: int) -> None:
    with contextlib.suppress(OSError):  # above /proc/sys/fs/pipe-max-size: the default does
        fcntl.fcntl(pipe, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)


def _write_all(into: int, text: bytes) -> int:
    view, done = memoryview(text), 0
    while done < len(text):
        done += os.write(into, view[done:])
    return done


def spans(workers: Workers) -> Generator[Span, None, None]:
    for said, _ in workers.answers():
        checked, first, last, fault = said["span"]
        yield Span(checked, _pair(first), _pair(last), _pair(fault))


def _pair(value: list[Any] | None) -> tuple[int, str] | None:
    return (int(value[0]), str(value[1])) if value is not None else None


def _work() -> None:
    """A worker: do the task on stdin over its ranges, one answer each on stdout, in order."""
    request = json.loads(sys.stdin.buffer.read())
    source, task = Source(**request["source"]), request["task"]
    since = datetime.fromisoformat(request["since"]) if request["since"] else None
    out = sys.stdout.buffer
    connection = connect(source)
    try:
        for low, high in request["ranges"]:
            found = rows(connection, source.dialect, low, high, since)
            if task == "verify":
                span = check(found)
                said = {"span": [span.checked, span.first, span.last, span.fault]}
                out.write(json.dumps(said).encode() + b"\n")
            else:
                try:
                    if task == "jsonl":
                        text = list(jsonl_bytes(found))
                    else:
                        text = [line.encode() for line in csv_lines(found, header=False)]
                except ValueError as problem:
                    out.write(json.dumps({"error": str(problem)}).encode() + b"\n")
                    break
                data = b"".join(text)
                out.write(json.dumps({"rows": len(text), "bytes": len(data)}).encode() + b"\n")
                out.write(data)
            out.flush()
    finally:
        connection.close()


if __name__ == "__main__":
    _work()
