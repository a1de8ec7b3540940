"""What the workspace's parts (tokens, surfaces) take from the workspace that owns them: its
lock, its clock, its id serial and the team's ids. A protocol, so the parts need not import the
workspace that builds them."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol


class WorkspaceCore(Protocol):
    """The lock every part takes, the clock it reads and the ids it hands out."""

    @property
    def lock(self) -> AbstractContextManager[Any]: ...

    @property
    def team_id(self) -> str: ...

    @property
    def app_id(self) -> str: ...

    @property
    def bot_id(self) -> str: ...

    def now(self) -> float: ...

    def next_id(self, prefix: str) -> str: ...
