"""``ensure_ray`` on a local cluster turns Ray's metrics off unless the user chose; a joined
cluster keeps its operators' setting."""
from __future__ import annotations

import os

import ray

from bcer.engine.cluster import ensure_ray


def _fake_ray(monkeypatch) -> list[dict]:
    calls: list[dict] = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: calls.append(kw))
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    return calls


def test_local_cluster_without_metrics_unless_asked(monkeypatch) -> None:
    calls = _fake_ray(monkeypatch)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_enable_metrics_collection", raising=False)
    assert ensure_ray(num_cpus=2) == {"CPU": 2.0} and calls[0]["address"] == "local"
    assert os.environ["RAY_enable_metrics_collection"] == "0"
    monkeypatch.setenv("RAY_enable_metrics_collection", "1")  # the user's choice wins
    ensure_ray(num_cpus=2)
    assert os.environ["RAY_enable_metrics_collection"] == "1"


def test_joined_cluster_keeps_the_setting(monkeypatch) -> None:
    calls = _fake_ray(monkeypatch)
    monkeypatch.delenv("RAY_enable_metrics_collection", raising=False)
    ensure_ray("auto")
    assert calls[0]["address"] == "auto" and "RAY_enable_metrics_collection" not in os.environ
