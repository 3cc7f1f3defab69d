"""Which method made a number: method cards, network model cards and the lineage an artifact carries.

A *method card* says what produced an artifact: the algorithm's name and version, or the
network with the sha256 of its weights file, what it was trained on and whether it was
validated on real scans. Every tool has one: ``@tool(..., method=...)`` declares a static
card (a classical segmenter, a rule), a tool without one gets a card naming the tool and its
version (a deterministic computation such as a volume count), and a tool whose method is only
known at run time (a network chosen by ``bundle_dir``, a fallback) puts its card in its
output's ``meta["method_card"]``, which wins.

The engine stamps each output with ``meta["lineage"]`` (:func:`stamp_lineage`): every node
upstream of it, with its tool, card, the inputs it read (a series name for ``@seq.*``, the
node for ``@node.*``) and its flags (``meta["flags"]``: a near-tie ED/ES choice, a
low-confidence segmentation). A report reads its inputs' lineage to open with the methods
and series behind its numbers (:mod:`bcer.tools.report.header`); provenance records each
node's card.
"""
from __future__ import annotations

import hashlib
import json
import logging
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger(__name__)

Kind = Literal["computation", "classical", "network", "hybrid"]
SHIPPED_DIR = Path(__file__).resolve().parents[1] / "assets" / "bundles"


class MethodCard(BaseModel):
    """What produced an artifact (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")
    name: str
    version: str = ""
    kind: Kind = "computation"
    summary: str = ""
    default: bool = Field(False, description="a method bcer ships and runs unless told otherwise")
    validated_on_real: bool | None = Field(None, description="validated on real scans; None: not applicable "
                                                             "(a computation) or not stated (a third-party bundle)")
    weights_sha256: str | None = None
    bundle: str | None = None
    trained_on: str | None = None
    training: dict[str, Any] | None = None
    components: list["MethodCard"] = Field(default_factory=list)

    def line(self) -> str:
        """One plain sentence for a report header."""
        what = f"{self.name} {self.version}".strip()
        if self.kind == "network":
            bits = [f"network {what}", f"weights sha256 {self.weights_sha256[:12]}" if self.weights_sha256 else ""]
            bits.append(f"trained on {self.trained_on}" if self.trained_on else "training data not stated")
        elif self.kind == "hybrid":
            bits = [f"hybrid {what}: " + "; ".join(c.line() for c in self.components)]
        elif self.kind == "computation":
            bits = [f"computation {what}", self.summary]
        else:
            bits = [f"{self.kind} method {what}", self.summary]
        if self.kind not in ("computation", "hybrid"):  # a hybrid's parts say it
            bits.append({True: "validated on real scans", False: "not validated on real scans",
                         None: "validation on real scans not stated"}[self.validated_on_real])
        return ", ".join(b for b in bits if b)

    def needs_disclaimer(self) -> bool:
        """A shipped default network or classical method ran (validated on synthetic data only)."""
        if self.kind == "hybrid":
            return any(c.needs_disclaimer() for c in self.components)
        return self.kind in ("network", "classical") and self.default and not self.validated_on_real


def default_card(tool: str, version: str, summary: str = "") -> MethodCard:
    return MethodCard(name=tool, version=version, kind="computation", summary=summary)


def classical_card(name: str, version: str, summary: str) -> MethodCard:
    """A classical method bcer ships: tuned and checked on bcer's synthetic phantoms only."""
    return MethodCard(name=name, version=version, kind="classical", summary=summary, default=True,
                      validated_on_real=False, trained_on="tuned on bcer's synthetic phantom families only")


@lru_cache(maxsize=32)
def _sha256(path: str, mtime_ns: int, size: int) -> str:
    del mtime_ns, size  # cache key only
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def file_sha256(path: str | Path) -> str:
    """sha256 of a file, computed once per (path, mtime, size) in this process."""
    st = Path(path).stat()
    return _sha256(str(path), st.st_mtime_ns, st.st_size)


def _read_meta(root: Path) -> dict[str, Any]:
    if not (root / "configs" / "metadata.json").is_file():
        return {}
    try:
        return json.loads((root / "configs" / "metadata.json").read_text())
    except (OSError, ValueError) as e:  # the bundle loader reports a bad file; a card is best effort
        log.warning("model card of %s: unreadable metadata.json (%s)", root, e)
        return {}


def weights_sha256(root: Path, meta: dict[str, Any]) -> str | None:
    """sha256 of a bundle's weights: of ``models/model.pt`` (or ``.ts``); for an ensemble
    (``bcer.members``) the sha256 of its files' digests in order, so one value names every
    member's weights."""
    model = next((root / "models" / n for n in ("model.pt", "model.ts") if (root / "models" / n).is_file()), None)
    if model is None:
        return None
    members = [root / "models" / str(n) for n in (meta.get("bcer", {}).get("members") or [])]
    if not members:
        return file_sha256(model)
    digests = [file_sha256(f) if f.is_file() else "missing" for f in (model, *members)]
    return hashlib.sha256(" ".join(digests).encode()).hexdigest()


def shipped_weights() -> set[str]:
    """The weights digest (:func:`weights_sha256`) of every shipped bundle."""
    roots = [p for p in SHIPPED_DIR.iterdir() if p.is_dir()] if SHIPPED_DIR.is_dir() else []
    return {d for r in roots if (d := weights_sha256(r, _read_meta(r)))}


def network_card(bundle_dir: str | Path) -> MethodCard:
    """The model card of a MONAI bundle: name and version from ``configs/metadata.json``, the
    sha256 of its weights (:func:`weights_sha256`), what it was trained on (bcer's
    ``bcer_model_card`` block for shipped bundles, else the bundle's own ``data_source`` /
    description) and whether it was validated on real scans (None when the bundle does not say)."""
    root = Path(bundle_dir).expanduser().resolve()
    meta = _read_meta(root)
    card = meta.get("bcer_model_card") or {}
    digest = weights_sha256(root, meta)
    # a copy of a shipped bundle is still the default network: judged by its weights, not its folder
    shipped = root.parent == SHIPPED_DIR.resolve() or (digest is not None and digest in shipped_weights())
    trained = card.get("trained_on") or meta.get("data_source") or meta.get("description") or None
    training = {k: card[k] for k in ("generator", "generator_sha256", "trainer", "trainer_sha256", "validated_on")
                if k in card} or None
    return MethodCard(name=str(meta.get("name") or root.name), version=str(meta.get("version", "")), kind="network",
                      summary=str(meta.get("task", "")), default=shipped,
                      validated_on_real=card.get("validated_on_real_scans"),
                      weights_sha256=digest, bundle=str(root),
                      trained_on=str(trained) if trained else None, training=training)


def hybrid_card(name: str, version: str, parts: list[MethodCard]) -> MethodCard:
    return MethodCard(name=name, version=version, kind="hybrid", components=parts,
                      default=all(p.default for p in parts),
                      validated_on_real=all(p.validated_on_real for p in parts) if parts else None)


def seg_card(meta: dict[str, Any], classical: MethodCard) -> dict[str, Any]:
    """A segmenter's card from its meta: the network's (``meta["method_card"]``, or from the
    bundle folder ``meta["bundle"]`` of a ``monai_bundle`` run), else ``classical``."""
    if meta.get("method_card"):
        return dict(meta["method_card"])
    if meta.get("method") == "monai_bundle" and meta.get("bundle"):
        return network_card(meta["bundle"]).model_dump(exclude_defaults=True)
    return classical.model_dump(exclude_defaults=True)


def card_of(spec_card: dict[str, Any] | None, tool: str, version: str, outputs: dict[str, Any]) -> dict[str, Any]:
    """The card of one node: an output's ``meta["method_card"]``, else the tool's static card,
    else a computation card naming the tool."""
    for art in outputs.values():
        got = (getattr(art, "meta", None) or {}).get("method_card") if isinstance(getattr(art, "meta", None), dict) else None
        if got:
            return dict(got)
    return dict(spec_card) if spec_card else default_card(tool, version).model_dump(exclude_defaults=True)


def flags_of(outputs: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for art in outputs.values():
        meta = getattr(art, "meta", None)
        if isinstance(meta, dict) and isinstance(meta.get("flags"), dict):
            out.update(meta["flags"])
    return out


def reads_of(ports: list[Any], sources: list[Any]) -> dict[str, str]:
    """``{port: "series T1c" | "node seg"}`` from an engine node spec's ports and sources
    (``("seq", key)`` or ``("node", id, field)``)."""
    return {p[0]: (f"series {src[1]}" if src[0] == "seq" else f"node {src[1]}") for p, src in zip(ports, sources)}


def stamp_lineage(outputs: dict[str, Any], inputs: dict[str, Any], node: str | None, tool: str, version: str,
                  card: dict[str, Any], reads: dict[str, str], case: str | None = None) -> None:
    """Give every output ``meta["lineage"]``: the inputs' lineage plus this node (in place).

    ``reads``: what each input port read (:func:`reads_of`). No run id or time: a deliverable's
    bytes stay the same across reruns (the run is in provenance.json)."""
    if not node:
        return
    nodes: dict[str, Any] = {}
    for v in inputs.values():
        meta = getattr(v, "meta", None)
        if isinstance(meta, dict) and isinstance(meta.get("lineage"), dict):
            nodes.update(meta["lineage"].get("nodes", {}))
    nodes[node] = {"tool": tool, "version": version, "method": card, "reads": reads, "flags": flags_of(outputs)}
    lineage = {"case": case, "nodes": nodes}
    for art in outputs.values():
        meta = getattr(art, "meta", None)
        if isinstance(meta, dict):
            meta["lineage"] = lineage


__all__ = ["MethodCard", "card_of", "classical_card", "default_card", "file_sha256", "flags_of", "hybrid_card",
           "network_card", "reads_of", "seg_card", "shipped_weights", "stamp_lineage"]
