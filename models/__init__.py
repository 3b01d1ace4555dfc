"""What is trained and how a stage computes (import package ``swarmd.models``).

- ``presets``       the run specs that ship with swarmd (``tiny-bytes``, the default run)
- ``shape``         a model's shape: the few numbers every peer needs to build the same network
- ``build``         model shapes and ``transformers`` models built from a config and a seed
- ``stages``        a model cut into stages by layer ranges; each stage's forward, loss and layout
- ``layer_runner``  how a stage calls its decoder layers: plain, activation-checkpointed, compiled
- ``tokenizer``     the byte-level tokenizer (256 ids, nothing to download), and what every tokenizer offers
- ``bpe_tokenizer`` a ``tokenizers`` ``tokenizer.json``, bounded and pinned by digest; training a byte-level BPE
- ``data/``         the data side: the built-in corpus, prepared token shards, deterministic sequences by data index
- ``checkpoint``    atomic safetensors checkpoints, and export to a ``from_pretrained`` folder
- ``files``         a file replaced in one step: a crash leaves the old one or the new one
- ``pretrained``    a local Hugging Face checkpoint folder: its digest, its shape, any stage's slice
- ``initial_weights`` a pretrained run's starting weights, chunk by chunk with their digests
- ``parameter_shard`` one slice of a stage's parameters: its buffer, steps, replay, pulls and checkpoints
- ``lr_schedule``   the rate of each step: a linear warm-up, then constant or a cosine decay
- ``shard_config``  a shard's settings, its step rule (AdamW or DiLoCo's outer Nesterov), its errors
- ``shard_contribution`` a contribution's checks: its form, and the norm bound against the running median
- ``robust_aggregation`` a median with one vote per sender, and centred clipping around the last aggregate
- ``shard_share_ids`` the share IDs a shard has buffered, settled and applied, so a share counts once
- ``shard_deltas``  fp16 deltas with error feedback, and the recent ones kept for pulls
- ``shard_checkpoint`` a shard's whole state in one safetensors file, read back whole: checksum, dtypes, lengths, finite
- ``checkpoint_check`` where a shard checkpoint comes from (run, shard, holder), and a shard that writes it
- ``cell_compute``  a cell's compute: forwards kept for their backward, shares, rounds, rebases
- ``cell_memory``   what a cell allocates at its peak: weights, its state, activations in flight (no torch)
- ``tensor_peak``   the peak of a process's live tensor bytes, on CPU too (a dispatch mode)
- ``precision``     where and in what precision a cell computes; tensors between the wire and the device
- ``reference``     the single-process synchronous baseline the swarm is measured against

Nothing here imports ``swarmd.peers`` or the daemon's modules: a stage computes; it knows no
network.
"""
