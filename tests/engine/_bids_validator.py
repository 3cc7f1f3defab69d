"""The official BIDS validator (``bids-validator-deno``, offline), for the derivative tests."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

VALIDATOR = Path(sys.executable).parent / "bids-validator-deno"


def validator_errors(root: Path) -> list[tuple[str, str]]:
    """(code, location) of every error the validator reports on ``root``."""
    run = subprocess.run([str(VALIDATOR), str(root), "--json"], capture_output=True, text=True, timeout=120,
                         check=False)  # errors come back as JSON with exit status 16
    issues = json.loads(run.stdout)["issues"]["issues"]
    return [(i["code"], i.get("location")) for i in issues if i["severity"] == "error"]
