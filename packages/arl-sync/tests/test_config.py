"""SyncConfig refuses out-of-range fields itself, naming the field."""

import pytest

from arl.sync import SyncConfig
from arl.sync.errors import SyncConfigError


@pytest.mark.parametrize("timeout_s", [0.0, -1.0])
def test_timeout_must_be_positive(timeout_s):
    with pytest.raises(SyncConfigError, match=r"^timeout_s must be > 0"):
        SyncConfig(timeout_s=timeout_s)
    assert SyncConfig(timeout_s=0.5).timeout_s == 0.5
