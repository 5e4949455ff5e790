"""``scripts/cluster.py``'s refusals that need no running service."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.cluster import SERVICES, Cluster, ClusterError


def test_up_refuses_a_service_the_topology_does_not_have(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path / "cluster")
    with pytest.raises(ClusterError) as err:
        cluster.up(only=["postgres", "spark"])
    assert "unknown services ['spark']" in str(err.value)
    assert all(name in str(err.value) for name in SERVICES)  # what is accepted
    assert cluster.running() == []  # nothing was started
