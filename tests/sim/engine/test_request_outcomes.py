"""``sim.engine.request.outcomes`` (compiled field reads for the request table, ``RequestLog.record_all``) reads the
attributes ``OUTCOME_ATTRIBUTES`` names, and names every attribute the request table records."""

from __future__ import annotations

import math
import random

from sim.engine.request import OUTCOME_ATTRIBUTES, Request, Status, outcomes
from sim.tables import _COUNTERS, _TIMES


def test_outcomes_are_the_named_attributes():
    rng = random.Random(0)
    reqs = []
    for i in range(20):
        req = Request(i, 100 + i, "c", 0.5 * i, 10 + i, 20 + i, 4096)
        for attr in OUTCOME_ATTRIBUTES[1:]:
            if isinstance(getattr(req, attr), float):
                setattr(req, attr, rng.choice([math.nan, math.inf, rng.random()]))
            else:
                setattr(req, attr, rng.randrange(1 << 40))
        req.status = rng.choice(list(Status))
        reqs.append(req)
    got = outcomes(reqs)
    assert len(got) == len(OUTCOME_ATTRIBUTES)
    for attr, values in zip(OUTCOME_ATTRIBUTES, got):
        expected = [getattr(r, attr) for r in reqs]
        assert [repr(v) for v in values] == [repr(v) for v in expected], attr
    assert outcomes([]) == [[] for _ in OUTCOME_ATTRIBUTES]


def test_outcome_attributes_cover_the_request_table():
    recorded = {"status"} | {attr for _, attr in _TIMES} | {attr for _, attr, _ in _COUNTERS}
    assert set(OUTCOME_ATTRIBUTES) == recorded and len(OUTCOME_ATTRIBUTES) == len(recorded)
