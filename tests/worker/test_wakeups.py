"""The notification turns, without a database or an event loop: which idle worker answers a
notification first, when the others look, and what cancels their turns (`work.tasks.wakeups`)."""

from __future__ import annotations

import zlib

import pytest

from oncely.work.tasks import timing
from oncely.work.tasks.wakeups import ROLL_CALL, TAKEN, Heard, Wakeups, scope_of

SCOPE = scope_of(["mail"], ["send"])


def workers(count: int) -> list[Wakeups]:
    """`count` workers of one scope that know each other, in their places."""
    ones = [Wakeups(SCOPE) for _ in range(count)]
    for place, one in enumerate(ones):
        one.place = (place, count)
    return ones


def first_of(key: str, count: int) -> int:
    return zlib.crc32(key.encode()) % count


def test_the_key_names_the_first_to_look_and_the_others_follow_a_turn_apart() -> None:
    three = workers(3)
    for key in ("41", "42", "43", "9001"):
        waits = [w.wait(key) for w in three]
        first = first_of(key, 3)
        assert waits[first] == 0.0
        assert waits[(first + 1) % 3] == pytest.approx(timing.TURN_S)
        assert waits[(first + 2) % 3] == pytest.approx(2 * timing.TURN_S)


def test_a_worker_alone_looks_at_once_and_has_no_one_to_say_answered_to() -> None:
    (alone,) = workers(1)
    assert alone.heard("42", now=100.0) is Heard.WAKE
    assert alone.news == 1
    assert alone.take_answering() == []  # no "taken" to say
    assert alone.waiting == {}


def test_the_first_to_look_wakes_and_answers_the_others_wait_for_their_turn() -> None:
    three = workers(3)
    key = "42"
    first = first_of(key, 3)
    heard = [w.heard(key, now=100.0) for w in three]
    assert heard[first] is Heard.WAKE
    assert three[first].take_answering() == [key]
    assert three[first].take_answering() == []  # one lease answers it
    for i in range(3):
        if i != first:
            assert heard[i] is Heard.WAIT
            assert three[i].news == 0  # nothing to look at yet
            assert three[i].next_turn() == pytest.approx(100.0 + three[i].wait(key))


def test_a_turn_that_comes_is_this_workers_to_answer() -> None:
    three = workers(3)
    key = "42"
    second = (first_of(key, 3) + 1) % 3
    w = three[second]
    assert w.heard(key, now=100.0) is Heard.WAIT
    assert not w.come(now=100.0 + timing.TURN_S / 2)  # not yet
    assert w.news == 0
    assert w.come(now=100.0 + timing.TURN_S)
    assert w.news == 1
    assert w.waiting == {} and w.next_turn() is None
    assert w.take_answering() == [key]


def test_hearing_a_key_again_keeps_its_first_turn() -> None:
    w = workers(2)[(first_of("42", 2) + 1) % 2]
    w.heard("42", now=100.0)
    w.heard("42", now=105.0)
    assert w.next_turn() == pytest.approx(100.0 + timing.TURN_S)


def test_taken_in_the_same_scope_cancels_the_turn_another_scope_leaves_it() -> None:
    w = workers(2)[(first_of("42", 2) + 1) % 2]
    assert w.heard("42", now=100.0) is Heard.WAIT
    other = scope_of(["reports"], ["send"])
    assert other != SCOPE
    assert w.heard(f"{TAKEN}{other}:42", now=100.0) is Heard.NOTHING
    assert "42" in w.waiting  # another scope's lease did not look where this one's would
    assert w.heard(f"{TAKEN}{SCOPE}:1234,42", now=100.0) is Heard.NOTHING
    assert w.waiting == {}
    assert not w.come(now=1000.0)  # the cancelled turn never comes
    assert w.news == 0 and w.take_answering() == []


def test_what_a_worker_says_is_answered_is_what_it_hears_as_taken() -> None:
    two = workers(2)
    key = "42"
    first, second = two[first_of(key, 2)], two[(first_of(key, 2) + 1) % 2]
    first.heard(key, now=0.0)
    second.heard(key, now=0.0)
    payload = first.taken(first.take_answering())
    assert payload == f"{TAKEN}{SCOPE}:{key}"
    assert second.heard(payload, now=0.0) is Heard.NOTHING
    assert second.waiting == {}


def test_the_scope_names_the_queues_and_task_names_in_any_order() -> None:
    assert scope_of(["b", "a"], ["x"]) == scope_of(["a", "b"], ["x"])
    assert scope_of(None, ["x"]) != scope_of(["a"], ["x"])
    assert scope_of(["a"], ["x"]) != scope_of(["a"], ["y"])


def test_a_roll_call_asks_for_the_place_again_and_wakes_no_lease() -> None:
    (w,) = workers(1)
    assert w.heard(ROLL_CALL, now=0.0) is Heard.ROLL_CALL
    assert w.news == 0


def test_a_workers_own_reason_to_look_wakes_it_at_once_without_answering() -> None:
    w = workers(3)[0]
    assert w.heard(None, now=0.0) is Heard.WAKE
    assert w.news == 1
    assert w.take_answering() == []


def test_answers_are_capped_and_outcomes_written_count_as_news() -> None:
    w = workers(2)[0]
    mine = [k for k in (str(n) for n in range(10_000)) if w.wait(k) == 0.0]
    for key in mine[: timing.ANSWERS_AT_MOST + 5]:
        assert w.heard(key, now=0.0) is Heard.WAKE
    assert len(w.take_answering()) == timing.ANSWERS_AT_MOST
    before = w.news
    w.outcome_written()
    assert w.news == before + 1


def test_a_stopping_worker_waits_for_no_turn() -> None:
    w = workers(2)[(first_of("42", 2) + 1) % 2]
    w.heard("42", now=0.0)
    w.clear()
    assert w.next_turn() is None
    assert not w.come(now=1000.0)
