"""``scheduler_base.remove_same``, the finish loop's ``running.remove(req)`` by identity: the same list afterwards as
``list.remove`` (Request has no ``__eq__``, so the first equal item is the request itself), and the same error when
the request is not there."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.engine.request import Request
from sim.engine.scheduler_base import remove_same


def _requests(n: int) -> list[Request]:
    return [Request(index=i, request_id=i, class_name="a", arrival_s=0.0, prompt_tokens=10, output_tokens_target=5,
                    max_model_len=100) for i in range(n)]


@given(n=st.integers(1, 40), data=st.data())
def test_remove_same_is_list_remove(n, data):
    reqs = _requests(n)
    order = data.draw(st.permutations(reqs))
    # Some requests appear twice (list.remove takes the first), as never in ``running``, but the rule is the same.
    extra = data.draw(st.lists(st.sampled_from(reqs), max_size=5))
    items = list(order) + extra
    victim = data.draw(st.sampled_from(items))
    expected = list(items)
    expected.remove(victim)
    remove_same(items, victim)
    assert len(items) == len(expected) and all(a is b for a, b in zip(items, expected))


def test_remove_same_missing():
    reqs = _requests(3)
    items = reqs[:2]
    with pytest.raises(ValueError):
        remove_same(items, reqs[2])
    assert items == reqs[:2]
