"""The data side of a run: the text a run trains on and the token sequences cut from it
(import package ``swarmd.models.data``).

- ``windows``       a run's sequences by data index: the same tokens on every machine
- ``corpus``        the built-in corpus or a local text file, as byte tokens split into training and held-out
- ``make_builtin_corpus`` the script that made ``builtin_corpus.txt.gz`` (run once, by hand)

``builtin_corpus.txt.gz`` and ``LICENSE-corpus.txt`` are package data. Nothing here imports
``swarmd.peers`` or the daemon's modules.
"""
