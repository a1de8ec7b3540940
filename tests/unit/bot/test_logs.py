"""One logging set-up: GPUBOT_LOG_LEVEL and GPUBOT_LOG_FORMAT, JSON lines a collector can read."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest

from bot import logs


@pytest.fixture(autouse=True)
def _restore() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:], root.level = handlers, level
    for name in ("apscheduler", "alembic", "apscheduler.scheduler"):
        logging.getLogger(name).setLevel(logging.NOTSET)


def test_json_lines_carry_time_level_logger_message_and_the_traceback(
    capfd: pytest.CaptureFixture[str],
) -> None:
    logs.setup("INFO", "json")
    logging.getLogger("bot.test").info("hello %s", "ada")
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("bot.test").exception("it broke")
    logging.getLogger("bot.test").debug("not at INFO")
    lines = [json.loads(line) for line in capfd.readouterr().err.splitlines()]
    assert [("INFO", "bot.test", "hello ada"), ("ERROR", "bot.test", "it broke")] == [
        (line["level"], line["logger"], line["message"]) for line in lines
    ]
    assert lines[0]["time"].endswith("+00:00")
    assert "ValueError: boom" in lines[1]["exception"]


def test_console_lines_and_quiet_libraries_unless_debugging(
    capfd: pytest.CaptureFixture[str],
) -> None:
    logs.setup("INFO", "console")
    logging.getLogger("apscheduler.scheduler").warning("skipped: a pass still running")
    logging.getLogger("alembic.runtime").info("checking the schema")
    logging.getLogger("bot.main").warning("telemetry: none")
    err = capfd.readouterr().err
    assert " WARNING bot.main: telemetry: none" in err
    assert "skipped" not in err
    assert "checking the schema" not in err
    logs.setup("DEBUG", "console")
    logging.getLogger("alembic.runtime").info("checking the schema")
    assert "checking the schema" in capfd.readouterr().err
