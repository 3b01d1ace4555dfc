"""The data side of a run (import package ``swarmd.models.data``).

The data side of a run: the text a run trains on and the token sequences cut from it
(import package ``swarmd.models.data``).

- ``windows``       a run's sequences by data index, over shards read by callback: the same tokens everywhere
- ``corpus``        the built-in corpus or a local text file, as byte tokens split into training and held-out
- ``manifest``      a prepared dataset's ``manifest.json``: tokenizer, dtype, shards and digests, parsed as untrusted
- ``shard_files``   shard files on disk read with ``pread`` (bounded descriptors), and a prepared folder opened
- ``text_inputs``   documents streamed from text, JSON lines and parquet inputs
- ``shard_writer``  token shards of one split written as documents arrive, several open, hashed as written
- ``prepare``       text inputs into a prepared dataset folder: shards, held-out split, tokenizer, manifest
- ``make_builtin_corpus`` the script that made ``builtin_corpus.txt.gz`` (run once, by hand)

``builtin_corpus.txt.gz`` and ``LICENSE-corpus.txt`` are package data. Nothing here imports
``swarmd.peers`` or the daemon's modules.
"""
