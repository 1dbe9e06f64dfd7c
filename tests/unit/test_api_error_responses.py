"""What the API answers for a Redis error it knows: a cluster failing over is a 503, not a 500."""

from __future__ import annotations

import json

import pytest
from redis.exceptions import ClusterDownError, SlotNotCoveredError

from api.errors import known_error_response


@pytest.mark.parametrize("error", [ClusterDownError("down"), SlotNotCoveredError("moving")])
def test_a_cluster_failing_over_is_503_not_500(error: Exception):
    response = known_error_response(error)
    assert response is not None and response.status_code == 503
    assert json.loads(response.body)["error"] == "unavailable"
