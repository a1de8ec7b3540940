"""The shape of one rule file, as pydantic models: what keys exist and what each holds.

Cross-file meaning (known teams and pools, quotas adding up, expressions) is checked in
rules.policy; this module only says what a well-formed file looks like.
"""

from __future__ import annotations

import re
from datetime import time, timedelta
from typing import Annotated, Literal
from zoneinfo import ZoneInfo

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    model_validator,
)

from rules.expr import parse_duration

SlackId = Annotated[
    str, StringConstraints(pattern=r"^[UWB][A-Z0-9]{2,}$"), Field(description="a Slack user id")
]
ChannelId = Annotated[str, StringConstraints(pattern=r"^[CG][A-Z0-9]{2,}$")]
Name = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")]


def _duration(value: object) -> object:
    if isinstance(value, timedelta):
        return value
    if isinstance(value, str):
        minutes = parse_duration(value)
        if minutes is None:
            raise ValueError(f"expected a duration like 90m, 6h or 2d, got {value!r}")
        return timedelta(minutes=minutes)
    raise ValueError(f"expected a duration like 90m, 6h or 2d, got {value!r}")


Duration = Annotated[timedelta, BeforeValidator(_duration)]


def _off_or_duration(value: object) -> object:
    """A duration, or a plain `0` (a number in YAML) for off."""
    if isinstance(value, int) and not isinstance(value, bool) and value == 0:
        return timedelta(0)
    return _duration(value)


OffOrDuration = Annotated[timedelta, BeforeValidator(_off_or_duration)]

#: Unix accounts that belong to the system, never to a person: Debian's base accounts
#: (base-passwd), the usual daemons' accounts, and by prefix every `systemd-*` and `_*` one.
#: The rule files may not map them to anyone, and the node agent never signals a process of
#: theirs, whatever an order says (it also refuses every uid below its --min-uid).
SYSTEM_ACCOUNTS = frozenset(
    {
        # base-passwd
        "root", "daemon", "bin", "sys", "sync", "games", "man", "lp", "mail", "news", "uucp",
        "proxy", "www-data", "backup", "list", "irc", "gnats", "nobody", "nogroup",
        # Red Hat's base accounts
        "adm", "halt", "operator", "shutdown", "ftp", "nfsnobody", "tss",
        # daemons found on GPU nodes
        "messagebus", "sshd", "postgres", "mysql", "redis", "polkitd", "syslog", "uuidd",
        "tcpdump", "avahi", "dnsmasq", "ntp", "chrony", "rpc", "rpcuser", "statd", "dbus",
        "slurm", "munge", "nvidia-persistenced", "nscd", "sssd", "unbound", "rtkit", "colord",
        "usbmux", "landscape", "lxd", "pollinate", "fwupd-refresh", "dhcpcd", "prometheus",
        "node-exporter", "grafana", "docker", "containerd", "kubelet",
    }
)  # fmt: skip
_SYSTEM_PREFIXES = ("systemd-", "_")


def is_system_account(name: str) -> bool:
    """Is `name` a system account (see SYSTEM_ACCOUNTS), never one person's?"""
    return name in SYSTEM_ACCOUNTS or name.startswith(_SYSTEM_PREFIXES)


def _personal_account(name: str) -> str:
    if is_system_account(name):
        raise ValueError(
            f"{name!r} is a system account: system accounts cannot be mapped to a person "
            "(the node agent never signals their processes)"
        )
    return name


Account = Annotated[str, AfterValidator(_personal_account)]
Count = Annotated[int, Field(ge=0, strict=True)]
# How the admin command line shows a person (org.yaml's `names`); Slack shows its own names.
PersonName = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=80)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ApprovalChannel(_Strict):
    channel: ChannelId


_DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


def _days(value: object) -> object:
    """`mon-fri`, `sat` or a list of either, as weekday numbers (0 is Monday)."""
    parts = value if isinstance(value, list) else [value]
    out: set[int] = set()
    for part in parts:
        if not isinstance(part, str):
            raise ValueError(f"expected days like mon-fri or [mon, wed], got {part!r}")
        first, _, last = part.strip().lower().partition("-")
        if first not in _DAYS or (last and last not in _DAYS):
            raise ValueError(f"expected days like mon-fri or [mon, wed], got {part!r}")
        a, b = _DAYS.index(first), _DAYS.index(last or first)
        out.update(range(a, b + 1) if a <= b else [*range(a, 7), *range(0, b + 1)])
    if not out:
        raise ValueError("name at least one working day")
    return frozenset(out)


def _clock(value: object) -> object:
    if isinstance(value, int) and not isinstance(value, bool):
        value = f"{value // 60:02d}:{value % 60:02d}"  # YAML 1.1 reads 09:00 as sexagesimal
    if isinstance(value, str):
        try:
            return time.fromisoformat(value.strip())
        except ValueError:
            pass
    raise ValueError(f'expected a time of day like "09:00", got {value!r}')


def _zone(value: str) -> str:
    try:
        ZoneInfo(value)
    except (ValueError, KeyError, OSError):
        raise ValueError(f"unknown time zone {value!r} (e.g. Europe/Berlin, UTC)") from None
    return value


class WorkingHoursSpec(_Strict):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    days: Annotated[frozenset[int], BeforeValidator(_days)] = frozenset(range(5))
    start: Annotated[time, BeforeValidator(_clock)] = Field(time(9), alias="from")
    end: Annotated[time, BeforeValidator(_clock)] = Field(time(18), alias="to")
    tz: Annotated[str, AfterValidator(_zone)] = "UTC"

    @model_validator(mode="after")
    def _opens_before_it_closes(self) -> WorkingHoursSpec:
        if self.end <= self.start:
            raise ValueError("working hours must end after they start on the same day")
        return self


def _never_or_duration(value: object) -> object:
    return None if value == "never" else _duration(value)


def _escalate_to(value: object) -> object:
    return [value] if isinstance(value, str) else value


def _escalation_target(value: str) -> str:
    if not re.fullmatch(r"admins|[UW][A-Z0-9]{2,}|[CG][A-Z0-9]{2,}", value):
        raise ValueError(
            f"expected admins, a Slack user id (U…) or a channel id (C…), got {value!r}"
        )
    return value


EscalationTarget = Annotated[str, AfterValidator(_escalation_target)]


def _digest_day(value: object) -> object:
    if isinstance(value, str) and value.strip().lower() in ("daily", *_DAYS):
        return value.strip().lower()
    raise ValueError(f"expected daily or a weekday (mon ... sun), got {value!r}")


class DigestSpec(_Strict):
    """A personal digest: each person who held GPUs gets their own, by DM."""

    day: Annotated[str, BeforeValidator(_digest_day)] = "mon"
    at: Annotated[time, BeforeValidator(_clock)] = time(9)
    tz: Annotated[str, AfterValidator(_zone)] = "UTC"


class LabDigestSpec(DigestSpec):
    channel: ChannelId


class ReportsSpec(_Strict):
    currency: Annotated[str, StringConstraints(pattern=r"^[A-Z]{3}$")] = "USD"
    keep_hourly: Duration = timedelta(days=400)
    busy_again_within: Duration = timedelta(hours=1)
    lab_digest: LabDigestSpec | None = None
    personal_digests: DigestSpec | None = None


class ApprovalsSpec(_Strict):
    """Every key optional: the lab-wide section fills what a team's section leaves out."""

    remind_after: Duration | None = None
    remind_every: Duration | None = None
    max_reminders: Count | None = None
    # `never` (None): no escalation; a key left out is taken from the lab-wide section
    escalate_after: Annotated[timedelta | None, BeforeValidator(_never_or_duration)] = None
    escalate_to: Annotated[list[EscalationTarget], BeforeValidator(_escalate_to)] | None = None
    expire_after: Duration | None = None
    working_hours: WorkingHoursSpec | None = None


class TeamSpec(_Strict):
    managers: list[SlackId] = Field(min_length=1)
    members: list[SlackId] = Field(default_factory=list)
    approval: Literal["managers"] | ApprovalChannel = "managers"
    approvals: ApprovalsSpec | None = None


class QuotaSpec(_Strict):
    nominal: Count
    borrowing_limit: Count = 0
    lending_limit: Count | None = None  # None: lends all its unused nominal
    weight: Annotated[float, Field(gt=0, le=1000)] = 1.0  # fair share among borrowers


class LimitsSpec(_Strict):
    max_gpus_per_request: Annotated[int, Field(ge=1, strict=True)] = 8
    max_duration: Duration = timedelta(days=3)
    max_extensions: Count = 2
    max_extension_total: Duration = timedelta(days=1)
    default_duration: Duration = timedelta(hours=4)
    max_queue_wait: Duration = timedelta(days=1)


class LimitsOverride(_Strict):
    max_gpus_per_request: Annotated[int, Field(ge=1, strict=True)] | None = None
    max_duration: Duration | None = None
    max_extensions: Count | None = None
    max_extension_total: Duration | None = None
    default_duration: Duration | None = None
    max_queue_wait: Duration | None = None


class PoolSpec(_Strict):
    model: str = ""
    protected: bool = False
    nodes: dict[Name, Annotated[int, Field(ge=1, le=64, strict=True)]] = Field(min_length=1)
    quotas: dict[Name, QuotaSpec] = Field(default_factory=dict)
    limits: LimitsOverride = LimitsOverride()
    cost_per_gpu_hour: Annotated[float, Field(ge=0)] | None = None


class WarningsSpec(_Strict):
    expiry_leads: list[Duration] = Field(
        default_factory=lambda: [timedelta(minutes=60), timedelta(minutes=10)]
    )
    idle_threshold: Duration = timedelta(minutes=90)
    grace: Duration = timedelta(minutes=30)
    snooze: Duration = timedelta(hours=2)
    max_snoozes: Count = 2
    stale_after: Duration = timedelta(minutes=3)


class RecallSpec(_Strict):
    notice: Duration = timedelta(minutes=30)
    min_runtime: Duration = timedelta(hours=1)
    cooldown: Duration = timedelta(days=1)
    max_guarantee_wait: Duration = timedelta(minutes=30)


class QueueSpec(_Strict):
    backfill: Literal["reserve", "best_effort", "none"] = "reserve"
    fair_share_half_life: OffOrDuration = timedelta(days=7)  # 0: fair share off


class PreemptionSpec(_Strict):
    within_team: Literal["off", "lower_priority"] = "off"


def _at_least_a_poll(value: timedelta) -> timedelta:
    if value < timedelta(seconds=30):
        raise ValueError("must be at least 30s: samples come every 30 s, so less would flap")
    return value


class FleetSpec(_Strict):
    memory_floor_mib: Count = 256
    not_reporting_after: Annotated[Duration, AfterValidator(_at_least_a_poll)] = timedelta(
        seconds=90
    )


class DefaultSpec(_Strict):
    then: Literal["approve", "queue", "ask", "ask managers", "ask admins", "deny"] = "ask"
    because: str = "no rule matched, so a manager decides"


class RuleSpec(_Strict):
    id: Name
    on: Literal["request", "lease", "gpu"]
    when: str
    then: str
    because: str = ""
    mode: Literal["enforce", "observe"] = "enforce"


class CaseSpec(_Strict):
    name: str
    on: Literal["request", "lease", "gpu"] = "request"
    facts: dict[str, bool | int | float | str] = Field(default_factory=dict)
    expect: str | list[str]
    deciding: str | None = None


class PolicyFile(_Strict):
    """Every section is optional in one file; together the files must hold a whole policy."""

    admins: list[SlackId] | None = None
    accounts: dict[Account, SlackId] | None = None
    names: dict[SlackId, PersonName] | None = None
    teams: dict[Name, TeamSpec] | None = None
    pools: dict[Name, PoolSpec] | None = None
    limits: LimitsSpec | None = None
    warnings: WarningsSpec | None = None
    recall: RecallSpec | None = None
    queue: QueueSpec | None = None
    preemption: PreemptionSpec | None = None
    fleet: FleetSpec | None = None
    approvals: ApprovalsSpec | None = None
    reports: ReportsSpec | None = None
    automation: Literal["active", "paused"] | None = None
    default: DefaultSpec | None = None
    rules: list[RuleSpec] | None = None


class CaseFile(_Strict):
    defaults: dict[Literal["request", "lease", "gpu"], dict[str, bool | int | float | str]] = Field(
        default_factory=dict
    )
    cases: list[CaseSpec] = Field(min_length=1)
