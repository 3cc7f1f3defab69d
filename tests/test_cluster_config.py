"""cluster.yaml and cluster-onprem.yaml pass Ray's own launcher checks (schema + defaults), the
way `ray up` reads them."""
from __future__ import annotations

import copy
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def prepared(name: str) -> dict:
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = prepare_config(copy.deepcopy(yaml.safe_load((ROOT / name).read_text())))
    validate_config(config)
    return config


def test_aws_cluster_has_cpu_head_and_gpu_workers_installing_the_extras():
    config = prepared("cluster.yaml")
    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    assert head["resources"].get("GPU", 0) == 0 and head["resources"]["CPU"] >= 4
    gpu = [t for t in types.values() if t.get("resources", {}).get("GPU", 0) >= 1]
    assert gpu and all(t["max_workers"] >= 1 for t in gpu)
    assert any("bcer[gpu,llm" in cmd for cmd in config["setup_commands"])
    assert all("RAY_AUTH_MODE=token" in " ".join(config[k]) for k in ("head_start_ray_commands",
                                                                    "worker_start_ray_commands"))


def test_onprem_variant_is_valid():
    config = prepared("cluster-onprem.yaml")
    assert config["provider"]["type"] == "local" and config["provider"]["worker_ips"]
    assert any("bcer[gpu,llm" in cmd for cmd in config["setup_commands"])


def test_the_check_catches_a_broken_config():
    from ray.autoscaler._private.util import validate_config

    bad = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    bad["max_wokers"] = 3  # a typo Ray's schema does not allow
    with pytest.raises(jsonschema.ValidationError):
        validate_config(bad)
