"""One logging set-up for `serve`, `demo`, `agent` and the admin commands.

`GPUBOT_LOG_LEVEL` (DEBUG, INFO, WARNING, ERROR) and `GPUBOT_LOG_FORMAT`: `console` (a line of
text) or `json` (one object a line: time, level, logger, message, and the traceback if any), for
a log collector. Libraries that talk on every tick (the scheduler, migrations) are quieted
unless the level is DEBUG.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Literal

LogFormat = Literal["console", "json"]
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]
CONSOLE = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# A line per scheduler tick and per migration check; a pass still running is skipped on purpose.
_QUIET = {"apscheduler": logging.WARNING, "alembic": logging.WARNING}
_QUIETER = {"apscheduler.scheduler": logging.ERROR}


class JsonFormatter(logging.Formatter):
    """One JSON object per record; times in UTC with an offset."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def setup(level: LogLevel | str = "INFO", fmt: LogFormat | str = "console") -> None:
    """Send every log record to stderr at `level` in `fmt`; called once by each command."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(CONSOLE))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    debug = logging.getLevelName(level) == logging.DEBUG
    for name, at in (_QUIET | _QUIETER).items():
        logging.getLogger(name).setLevel(logging.NOTSET if debug else at)
