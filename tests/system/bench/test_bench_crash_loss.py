"""``python -m bench.crash_loss`` in small: a kill -9 mid-block keeps a prefix of what was shown."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.crash_loss import one_kill

# slow: the bench's crash-loss profile
pytestmark = pytest.mark.slow


async def test_a_kill_mid_block_keeps_a_prefix_of_the_text_shown(tmp_path: Path) -> None:
    (tmp_path / "gateway.toml").write_text('[store]\npath = "gateway.db"\ncheckpoint_ms = 100\n')
    kill = await one_kill(tmp_path, words=200, rate=50, after_deltas=80)
    assert kill.prefix, kill
    assert 0 < kill.kept <= kill.shown, kill  # 1.6 s streamed: checkpoints were stored
