"""The ``swarmd export`` command, which gathers a run's weights into one folder.

``swarmd export``: a run's stage weights, gathered from the swarm's shards onto this peer
(``Trainer.gather_weights``), merged into a ``from_pretrained`` folder."""

from __future__ import annotations

import logging
import re
from pathlib import Path

from swarmd.cli.progress import ProgressLine
from swarmd.errors import SwarmdError
from swarmd.models.bpe_tokenizer import load_tokenizer, tokenizer_digest
from swarmd.models.build import make_config
from swarmd.models.checkpoint import export_pretrained, load_safetensors
from swarmd.models.data.corpus import BUILTIN, BUILTIN_SHA256
from swarmd.models.stages import merge_stage_state_dicts
from swarmd.models.tokenizer import Tokenizer
from swarmd.system.state_dir import GATHERED_TOKENIZER, load_cached_spec, run_checkpoint_dir

logger = logging.getLogger(__name__)

_STAGE_FILE = re.compile(r"stage(\d+)\.safetensors")


def export_run(state_dir: Path, run_id: str, out_dir: Path, *, overwrite: bool = False) -> tuple[Path, list[int]]:
    """Export ``run_id`` from ``state_dir``; returns the folder and each stage's weights version."""
    signed = load_cached_spec(state_dir, run_id)
    if signed is None:
        raise SwarmdError(
            f"this peer has no spec of run {run_id} in {state_dir}; join the run first, or pass --state-dir"
        )
    folder = run_checkpoint_dir(state_dir, run_id)
    found = sorted(int(m.group(1)) for p in folder.glob("stage*.safetensors") if (m := _STAGE_FILE.fullmatch(p.name)))
    if not found:
        raise SwarmdError(
            f"no gathered stage weights of run {run_id} in {folder}; run swarmd export while this "
            "peer's daemon runs: it gathers every stage from the swarm's shards first"
        )
    if found != list(range(len(found))):
        missing = sorted(set(range(max(found) + 1)) - set(found))
        raise SwarmdError(
            f"stage checkpoints {missing} of run {run_id} are not on this peer (in {folder}); "
            "run swarmd export while this peer's daemon runs: it fetches every stage from the swarm"
        )
    progress = ProgressLine(f"exporting {len(found)} stages")
    versions, parts = [], []
    for stage in found:
        weights, meta = load_safetensors(folder / f"stage{stage}.safetensors")
        versions.append(int(meta.get("version", "0")))
        parts.append(weights)
        progress.update(len(parts) / (len(found) + 1))  # the last part: merging and writing
    spec = signed.spec
    merged = merge_stage_state_dicts(parts, spec.model)  # refuses a gap or an overlap between stages
    corpus = spec.corpus or f"the prepared dataset of manifest {spec.manifest_sha256}"
    digest = BUILTIN_SHA256 if corpus == BUILTIN else None
    export_pretrained(
        make_config(spec.model),
        merged,
        out_dir,
        overwrite=overwrite,
        corpus=corpus,
        corpus_sha256=digest,
        run_id=run_id,
        tokenizer=_tokenizer(folder, spec.tokenizer_sha256),
    )
    progress.done(str(out_dir))
    logger.info("Exported run %s (stage versions %s) to %s", run_id, versions, out_dir)
    return out_dir, versions


def _tokenizer(folder: Path, pinned: str) -> Tokenizer | None:
    """The run's tokenizer as the daemon gathered it beside the stages (None: bytes), checked
    against the digest the run spec pins."""
    if not pinned:
        return None
    path = folder / GATHERED_TOKENIZER
    if not path.is_file() or tokenizer_digest(path) != pinned:
        raise SwarmdError(
            f"the run's tokenizer ({pinned[:12]}...) is not beside its gathered stages in {folder}; run "
            "swarmd export while this peer's daemon runs: it fetches the tokenizer with the stages"
        )
    return load_tokenizer(path)
