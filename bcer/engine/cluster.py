"""Connecting to Ray: an existing cluster by address, the one `ray job submit` set up, or a local one."""
from __future__ import annotations

import logging
import os
import tempfile

log = logging.getLogger(__name__)


def ensure_ray(address: str | None = None, num_cpus: int | None = None) -> dict:
    """Initialise Ray once per driver and return its cluster resources.

    ``address=None`` joins the cluster named by ``RAY_ADDRESS`` (as under ``ray job submit``)
    or starts a local one; ``"auto"`` or ``"host:port"`` joins an existing cluster.
    """
    import ray

    if not ray.is_initialized():
        kwargs: dict = {"include_dashboard": False, "log_to_driver": False,
                        "configure_logging": False, "ignore_reinit_error": True}
        if address is None and not os.environ.get("RAY_ADDRESS"):
            # A local cluster has no dashboard, so nothing reads Ray's metrics; and Ray keeps a
            # metric series per task name in the driver (names are ``case/node/tool``), which
            # grows ~10 KB per case (benchmarks/results/wide_cohort_10000*.json). Off by default
            # here; a user's own setting wins. Joined clusters keep their operators' choice.
            os.environ.setdefault("RAY_enable_metrics_collection", "0")
            kwargs.update(address="local", num_cpus=num_cpus,
                          _temp_dir=tempfile.mkdtemp(prefix="bcer_ray_"))
        else:
            kwargs.pop("include_dashboard")
            kwargs["address"] = address or os.environ.get("RAY_ADDRESS")
        ray.init(**kwargs)
        log.info("ray initialised: %s", ray.cluster_resources())
    return dict(ray.cluster_resources())
