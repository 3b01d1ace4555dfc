"""A run's files on this peer, each pinned by its SHA-256.

A run's files on this peer (import package ``swarmd.data``): the tokenizer, the data
manifest and its token shards, and the weights a run starts from, each pinned by its SHA-256.

- ``run_files``      one run's files: found in the data folders, fetched when missing, served to members
- ``store``          this peer's checked copies by digest, and the bounded cache of fetched ones
- ``fetching``       a file by its digest, from the manifest's sources or from members, checked in full
- ``mirrors``        reading a file from a source folder or an HTTP(S) mirror
- ``serving``        the files this peer holds, sent to members in chunks (``FileFetch``)
- ``training_data``  the sequences cells read: a corpus in memory, or shards fetched ahead of training
- ``initial_weights`` the weights a run starts from: made from the checkpoint, or fetched chunk by chunk
"""
