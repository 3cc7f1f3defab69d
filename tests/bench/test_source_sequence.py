"""bench.quality.source_sequence follows @node tokens up to the first @seq token."""
from __future__ import annotations

import json

from bcer.bench.quality import source_sequence


def test_source_sequence_walks_the_chain(tmp_path):
    wf = {"nodes": [{"id": "reg", "inputs": {"moving": "@seq.T2w", "fixed": "@seq.T1"}},
                    {"id": "seg", "inputs": {"image": "@node.reg.image"}}],
          "deliverables": [{"name": "mask", "node": "seg"}, {"name": "other", "node": "seg"}]}
    (tmp_path / "workflow.json").write_text(json.dumps(wf))
    assert source_sequence(tmp_path, "mask") == "T2w"
    assert source_sequence(tmp_path, "missing") is None
