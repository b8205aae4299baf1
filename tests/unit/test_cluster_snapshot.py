"""What a broker remembers of its cluster (zbroker/cluster/snapshot.py): the decisions, and
the file on a real disk."""

from __future__ import annotations

import os
import stat

import pytest

from zbroker.cluster.snapshot import FORGET_AFTER, MAX_MEMBERS, Snapshot, load, save


def test_members_are_dialled_most_recent_first_after_the_seeds_and_forgotten_when_away():
    s = Snapshot("prod", None, seeds=("tcp://10.0.0.1:5670",))
    assert s.saw(["tcp://10.0.0.2:5670"], 100.0)
    assert s.saw(["tcp://10.0.0.3:5670"], 200.0)
    assert not s.saw(["tcp://10.0.0.2:5670"], 300.0)  # known: only its time changes
    assert s.endpoints() == ["tcp://10.0.0.1:5670", "tcp://10.0.0.2:5670",
                             "tcp://10.0.0.3:5670"]
    assert s.forget_old(200.0 + FORGET_AFTER + 1) == ["tcp://10.0.0.3:5670"]
    assert list(s.members) == ["tcp://10.0.0.2:5670"]


def test_at_most_max_members_the_most_recent_kept():
    s = Snapshot("prod", None)
    s.saw([f"tcp://10.0.{i // 250}.{i % 250}:5670" for i in range(MAX_MEMBERS)], 1.0)
    s.saw(["tcp://10.9.9.9:5670"], 2.0)
    gone = s.forget_old(3.0)
    assert len(gone) == 1 and len(s.members) == MAX_MEMBERS
    assert "tcp://10.9.9.9:5670" in s.members


def test_the_file_is_private_whole_and_read_back(tmp_path):
    path = tmp_path / "state" / "zbroker" / "local.cluster.json"
    s = Snapshot("prod", "/etc/zbroker/prod.key", ("tcp://10.0.0.1:5670",),
                 {"tcp://10.0.0.2:5670": 5.0})
    save(path, s)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert load(path) == s
    assert load(tmp_path / "none.json") is None


@pytest.mark.parametrize("text", ["", "[]", '{"cluster": 3}', '{"cluster": "a", "seeds": [1]}',
                                  '{"cluster": "a", "members": {"x": "y"}}'])
def test_a_file_that_is_not_a_snapshot_is_said_so(tmp_path, text):
    path = tmp_path / "x.cluster.json"
    path.write_text(text)
    with pytest.raises(ValueError, match="is not a cluster snapshot"):
        load(path)
