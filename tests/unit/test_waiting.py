"""`eventually` (the testbed's wait): a wait that times out says what was last wrong."""

from __future__ import annotations

import pytest

from servegraph_testbed.waiting import eventually


async def test_a_timeout_names_the_last_failed_assertion_and_chains_it() -> None:
    raised: list[AssertionError] = []

    async def replicas_converged() -> bool:
        raised.append(AssertionError("replicas=3, wanted 1"))
        raise raised[-1]

    with pytest.raises(AssertionError) as err:
        await eventually(replicas_converged, what="one replica", within=0.05, interval=0.01)
    assert err.value.__cause__ is raised[-1], "the check's own traceback is lost"
    message = str(err.value)
    assert message.startswith("one replica not reached within 0.05 s"), message
    assert message.endswith("last: AssertionError: replicas=3, wanted 1"), message


async def test_a_multi_line_failure_is_shown_as_lines() -> None:
    """pytest's rewritten asserts explain themselves over several lines: a repr flattened them."""

    async def check() -> None:
        raise AssertionError("phase is Deploying\nassert 'Deploying' == 'Serving'")

    with pytest.raises(AssertionError) as err:
        await eventually(check, within=0.05, interval=0.01)
    assert "last: AssertionError: phase is Deploying\nassert 'Deploying' == 'Serving'" in str(err.value)


async def test_the_last_attempt_is_reported_not_an_earlier_one() -> None:
    attempts: list[int] = []

    async def check() -> list[str]:
        attempts.append(1)
        if len(attempts) == 1:
            raise ConnectionResetError("the API server restarted")
        return []

    with pytest.raises(AssertionError) as err:
        await eventually(check, within=0.3, interval=0.01)
    assert len(attempts) > 1
    assert str(err.value).endswith("last: []")
    assert err.value.__cause__ is None, "an earlier error is not what is wrong now"


async def test_an_exception_without_a_message_is_named() -> None:
    async def check() -> None:
        raise TimeoutError

    with pytest.raises(AssertionError, match=r"last: TimeoutError$") as err:
        await eventually(check, within=0.05, interval=0.01)
    assert isinstance(err.value.__cause__, TimeoutError)


async def test_the_first_truthy_value_is_returned_after_failures() -> None:
    attempts: list[int] = []

    async def check() -> dict[str, int] | None:
        attempts.append(1)
        if len(attempts) < 3:
            raise AssertionError("not yet")
        return {"replicas": 1}

    assert await eventually(check, within=10, interval=0.001) == {"replicas": 1}
    assert len(attempts) == 3
