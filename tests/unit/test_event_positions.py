"""An SSE `Last-Event-ID` is read per partition and refused with a 400 when out of range."""

from __future__ import annotations

import pytest

from api.errors import ApiError
from api.event_reads import decode_position


@pytest.mark.parametrize("partitions", [1, 4])
def test_a_last_event_id_past_64_bits_is_400(partitions: int):
    big = str(2**64)
    value = ".".join([f"{big}-0"] * partitions)
    with pytest.raises(ApiError) as caught:
        decode_position(f"default={value}", partitions)
    assert caught.value.status == 400 and caught.value.code == "bad_last_event_id"
    assert decode_position(f"default={'.'.join(['1-0'] * partitions)}", partitions)
