"""One run's files on this peer: found in its data folders, fetched when missing, served to members.

A run pins its files by SHA-256 in its signed spec: the data manifest (which pins the tokenizer
and every token shard) and, for a run that starts from a checkpoint, the initial weights'
manifest (``swarmd.data.initial_weights``). ``RunFiles`` finds them: in the folders of
``[data] dirs`` and ``--data-dir`` (a prepared dataset is found by its ``manifest.json``, with
its shards and tokenizer beside it), at the paths ``swarmd run create`` recorded on the
creator's machine, in this run's cache; what is still missing is fetched from the manifest's
sources or from members (``swarmd.data.fetching``). It serves what it holds to members
(``swarmd.data.serving``), and says so in this peer's heartbeat (``holds``).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from swarmd.data.fetching import Fetcher, Holders, Send, Wanted
from swarmd.data.serving import FileServer
from swarmd.data.store import DataError, FileStore, sha256_file
from swarmd.models.bpe_tokenizer import MAX_TOKENIZER_BYTES
from swarmd.models.data.manifest import MANIFEST_FILE, MAX_MANIFEST_BYTES, Manifest
from swarmd.peers.records.run_spec import SignedRunSpec, run_seed
from swarmd.system.state_dir import local_files_path, run_checkpoint_dir

if TYPE_CHECKING:  # torch and transformers: imported in a worker thread when first needed (seconds)
    import torch

    from swarmd.data.initial_weights import InitialWeightsSource
    from swarmd.data.training_data import TrainingData

logger = logging.getLogger(__name__)

CACHE_DIRNAME = "data-cache"
SCAN_DEPTH = 2
"""How deep under each data folder a ``manifest.json`` is looked for."""


class RunFiles:
    def __init__(
        self,
        signed: SignedRunSpec,
        state_dir: Path,
        data_dirs: list[Path],
        cache_bytes: int,
        send: Send,
        holders: Holders,
        is_member: Callable[[str], bool],
    ) -> None:
        self.signed = signed
        self.spec = signed.spec
        self.state_dir = state_dir
        self.data_dirs = data_dirs
        self.store = FileStore(run_checkpoint_dir(state_dir, signed.run_id) / CACHE_DIRNAME, cache_bytes)
        self.fetcher = Fetcher(signed.run_id, self.store, send, holders)
        self.server = FileServer(self.store, is_member)
        self.initial: InitialWeightsSource | None = None
        """The checkpoint the run starts from (made in ``open``: it imports torch)."""
        self.manifest: Manifest | None = None
        self.tokenizer_path: Path | None = None
        self._data: TrainingData | None = None
        self._opened = asyncio.Event()

    # --- finding what is here ----------------------------------------------------------------

    async def open(self) -> None:
        """Look through the data folders and the cache; then read the manifest (fetching it if
        no copy is here: this waits until a member or source gives it)."""
        await asyncio.to_thread(self._scan)
        if self.spec.init_sha256:
            # torch and transformers load in a worker thread: seconds the loop must not wait.
            module = await asyncio.to_thread(importlib.import_module, "swarmd.data.initial_weights")
            self.initial = initial = module.InitialWeightsSource(self.spec.init_sha256, self.store, self.fetcher)
            self.server.providers.append(initial.provide)
            recorded = local_files_path(self.state_dir, self.signed.run_id)
            await initial.open(await asyncio.to_thread(module.checkpoint_candidates, recorded, self.data_dirs))
        digest = self.spec.manifest_sha256
        if digest:
            wanted = Wanted(digest, MANIFEST_FILE, MAX_MANIFEST_BYTES, "the data manifest", anyone=True)
            path = await self.fetcher.ensure(wanted)
            manifest = Manifest.parse(await asyncio.to_thread(path.read_bytes))
            pinned = self.spec.tokenizer_sha256
            if pinned and manifest.tokenizer.sha256 != pinned:
                raise DataError(
                    f"the data manifest pins tokenizer {(manifest.tokenizer.sha256 or 'none')[:12]}..., the run "
                    f"spec {pinned[:12]}...: the run was created from mismatched files"
                )
            if manifest.tokenizer.vocab > self.spec.model.vocab:
                raise DataError(
                    f"the data's tokenizer has {manifest.tokenizer.vocab} ids, the run's model only "
                    f"{self.spec.model.vocab}: the run was created from mismatched files"
                )
            self.fetcher.sources = tuple(manifest.sources)
            await asyncio.to_thread(self._offer_beside, path.parent, manifest)
            self.manifest = manifest
            tokenizer = manifest.tokenizer
            if tokenizer.file is not None and tokenizer.sha256 is not None:
                wanted = Wanted(tokenizer.sha256, tokenizer.file, MAX_TOKENIZER_BYTES, "the tokenizer", anyone=True)
                self.tokenizer_path = await self.fetcher.ensure(wanted)
        self._opened.set()

    def _scan(self) -> None:
        self.store.open()
        recorded = local_files_path(self.state_dir, self.signed.run_id)
        if recorded.is_file():  # the creator's own files, where run create found them
            try:
                files = json.loads(recorded.read_text())
            except (OSError, ValueError):
                files = {}
            for key, digest in (("manifest", self.spec.manifest_sha256), ("initial", self.spec.init_sha256)):
                if digest and isinstance(files.get(key), str):
                    self.store.offer(digest, Path(files[key]))
        if not self.spec.manifest_sha256:
            return
        for folder in self.data_dirs:
            for path in _manifests_under(folder):
                if path.stat().st_size <= MAX_MANIFEST_BYTES and sha256_file(path) == self.spec.manifest_sha256:
                    logger.info("found the run's dataset in %s", path.parent)
                    self.store.offer(self.spec.manifest_sha256, path)

    def _offer_beside(self, folder: Path, manifest: Manifest) -> None:
        """The files a manifest lists, where a prepared dataset keeps them: beside it."""
        if folder == self.store.cache_dir:
            return  # a manifest fetched alone: its shards are fetched one by one
        for entry in (*manifest.train, *manifest.validation):
            self.store.offer(entry.sha256, folder / entry.file)
        if manifest.tokenizer.file is not None and manifest.tokenizer.sha256 is not None:
            self.store.offer(manifest.tokenizer.sha256, folder / manifest.tokenizer.file)

    # --- what training reads -------------------------------------------------------------------

    async def training_data(self) -> TrainingData:
        """The run's training and held-out sequences on this peer (after ``open``)."""
        await self._opened.wait()
        if self._data is None:
            self._data = await asyncio.to_thread(self._open_data)
        return self._data

    def _open_data(self) -> TrainingData:
        """The datasets over the corpus or the shards (blocking: it loads torch, reads the corpus)."""
        from swarmd.data.training_data import CorpusData, ShardedData

        seed, seq_len = run_seed(self.signed.run_id), self.spec.model.seq_len
        if self.manifest is None:
            from swarmd.models.data.corpus import load_corpus, train_eval_split

            return CorpusData(*train_eval_split(load_corpus(self.spec.corpus), seq_len, seed))
        return ShardedData(self.manifest, self.store, self.fetcher, seq_len, seed)

    async def initial_slice(self, stage: int, lo: int, hi: int) -> torch.Tensor | None:
        """Values ``[lo, hi)`` of ``stage``'s flat vector as the run starts from its checkpoint;
        None for a run that starts from its seed."""
        if self.initial is None:
            return None
        await self._opened.wait()
        return await self.initial.slice(stage, lo, hi)

    def tokenizer_file(self) -> Path | None:
        return self.tokenizer_path

    def holds(self) -> list[str]:
        """Which of the run's files this peer serves (``Heartbeat.holds``)."""
        holds = ["init"] if self.initial is not None and self.initial.holds() else []
        m = self.manifest
        if m is None:
            return holds
        entries = (*m.train, *m.validation)
        found = [e for e in entries if self.store.knows(e.sha256)]
        if len(found) == len(entries):
            return ["dataset", *holds]
        return ["shards", *holds] if found else holds

    def status(self) -> dict[str, Any]:
        data = self._data
        return {
            "manifest": self.spec.manifest_sha256 or None,
            "corpus": self.spec.corpus or None,
            "holds": self.holds(),
            "training": None if data is None else data.status(),
            "store": self.store.status(),
            "fetch": self.fetcher.status(),
            "serve": self.server.status(),
        }

    async def stop(self) -> None:
        if self._data is not None:
            await self._data.stop()
        self.store.close()


def _manifests_under(folder: Path) -> list[Path]:
    found = []
    for depth in range(SCAN_DEPTH + 1):
        found += sorted(folder.glob("/".join(["*"] * depth + [MANIFEST_FILE])))
    return [p for p in found if p.is_file()]
