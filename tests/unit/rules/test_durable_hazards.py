"""Regression tests for each durable-rules hazard the wrapper exists to contain: no-match
evaluations, the 1024-session cap, leaked rulesets on reload, threads, broken reloads."""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Iterator

import pytest

from rules.domain import Outcome, Subject
from rules.engine import decide
from rules.engine.durable import DurableEngine
from rules.engine.live import LivePolicy
from rules.engine.reference import ReferenceEngine
from rules.errors import PolicyError
from rules.loader import load_policy
from tests.builders import a_lease, a_request, default_policy, default_sources


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.fixture
def engine() -> Iterator[DurableEngine]:
    e = DurableEngine(default_policy())
    yield e
    e.close()


def test_evaluations_where_no_rule_matches_do_not_crash(engine: DurableEngine) -> None:
    """Deleting a session in which no action ran segfaults durable; the catch-all prevents it."""
    quiet = a_lease()  # matches no lease rule
    for _ in range(3000):
        assert [] == list(engine.match(Subject.LEASE, quiet))
    assert 0 == engine.leaked_sessions


def test_thousands_of_evaluations_stay_below_the_session_cap_with_flat_memory(
    engine: DurableEngine,
) -> None:
    """Sessions are deleted after each evaluation: far past 1024 evaluations, memory is flat."""
    facts = [a_request(), a_request(pool__free=0), a_request(request__gpus=12)]
    for i in range(2000):  # warm up allocator pools
        engine.match(Subject.REQUEST, facts[i % 3])
    gc.collect()
    before = rss_mib()
    for i in range(20000):
        engine.match(Subject.REQUEST, facts[i % 3])
    gc.collect()
    assert rss_mib() - before < 8, "RSS grew: sessions are leaking"
    assert 0 == engine.leaked_sessions


def test_hundreds_of_reloads_free_the_old_rulesets() -> None:
    """Each retired revision's C rulesets are freed (durable alone leaks ~400 KB a version)."""
    policy = default_policy()
    for _ in range(30):
        DurableEngine(policy).close()
    gc.collect()
    before = rss_mib()
    for _ in range(400):
        e = DurableEngine(policy)
        e.match(Subject.REQUEST, a_request())
        e.close()
    gc.collect()
    assert rss_mib() - before < 20, "RSS grew: retired rulesets are not freed"


def test_a_closed_revision_refuses_to_evaluate() -> None:
    """A freed handle number may be recycled by durable, so it is never touched again."""
    e = DurableEngine(default_policy())
    e.close()
    assert e.closed
    from rules.engine import RevisionRetiredError

    with pytest.raises(RevisionRetiredError):
        e.match(Subject.REQUEST, a_request())


def test_concurrent_evaluations_from_several_threads_match_the_reference(
    engine: DurableEngine,
) -> None:
    """Eight threads share one engine; every answer equals the single-threaded reference."""
    policy = default_policy()
    reference = ReferenceEngine(policy)
    inputs = [
        a_request(
            request__gpus=g, pool__free=f, team__used_after=u, team__borrowed_after=max(0, u - 8)
        )
        for g in (1, 2, 4, 9)
        for f in (0, 3, 10)
        for u in (2, 9, 13)
    ]
    expected = [list(reference.match(Subject.REQUEST, f)) for f in inputs]
    errors: list[str] = []

    def work(offset: int) -> None:
        for i in range(600):
            k = (i + offset) % len(inputs)
            got = list(engine.match(Subject.REQUEST, inputs[k]))
            if got != expected[k]:
                errors.append(f"thread {offset}: {got} != {expected[k]}")

    threads = [threading.Thread(target=work, args=(n * 7,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [] == errors
    assert 0 == engine.leaked_sessions


def test_a_broken_reload_leaves_the_old_revision_live() -> None:
    """A rule file with an error, or with a failing case, never replaces working rules."""
    live = LivePolicy(default_sources())
    before = live.policy.revision
    bad = default_sources()
    bad["requests.yaml"] = bad["requests.yaml"].replace("team.used_after >", "team.usd >")
    with pytest.raises(PolicyError, match=r"unknown fact `team\.usd`"):
        live.reload(bad)
    failing = default_sources()
    failing["requests.yaml"] = failing["requests.yaml"].replace(
        '    then: approve\n    because: "within', '    then: ask\n    because: "within'
    )
    with pytest.raises(PolicyError, match="case 'a small borrow inside nominal"):
        live.reload(failing)
    assert before == live.policy.revision
    decision = live.decide(Subject.REQUEST, a_request())
    assert decision.verdict is not None
    assert Outcome.APPROVE == decision.verdict.outcome
    live.close()


def test_reloads_under_concurrent_evaluation_lose_no_decision() -> None:
    """Threads keep deciding while revisions are swapped; none fails, each sees a whole one."""
    sources = default_sources()
    variant = dict(sources, **{"limits.yaml": sources["limits.yaml"] + "\n# v2\n"})
    live = LivePolicy(sources)
    revisions = {load_policy(sources).revision, load_policy(variant).revision}
    errors: list[BaseException] = []
    seen: set[str] = set()
    stop = threading.Event()

    def work() -> None:
        while not stop.is_set():
            try:
                seen.add(live.decide(Subject.REQUEST, a_request()).revision)
            except BaseException as exc:
                errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for i in range(30):
        live.reload(variant if i % 2 == 0 else sources)
    stop.set()
    for t in threads:
        t.join()
    live.close()
    assert [] == errors
    assert seen <= revisions


def test_the_reference_decides_where_durable_cannot_be_imported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without durable the reference engine decides, and the decision says so."""
    import sys

    monkeypatch.setitem(sys.modules, "rules.engine.durable", None)
    live = LivePolicy(default_sources())
    decision = live.decide(Subject.REQUEST, a_request())
    assert "reference" == decision.engine == live.engine_name
    assert (
        "durable"
        == decide(
            default_policy(), DurableEngine(default_policy()), Subject.REQUEST, a_request()
        ).engine
    )


def test_a_rule_whose_or_branches_both_hold_is_matched_once() -> None:
    """durable fires an `$or` rule once per true branch; the wrapper reports the rule once."""
    sources = {
        k: v for k, v in default_sources().items() if k in ("org.yaml", "pools.yaml", "limits.yaml")
    }
    sources["rules.yaml"] = (
        "rules:\n  - id: either\n    on: request\n"
        "    when: request.gpus == 2 or request.pool == 'a100'\n    then: deny\n"
    )
    engine = DurableEngine(load_policy(sources))
    assert [0] == list(engine.match(Subject.REQUEST, a_request()))
    engine.close()
