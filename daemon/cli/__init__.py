"""The ``swarmd`` command (``swarmd.cli``): parsing, then one module per command.

- ``main``              the parser, the commands' entry points, logging, and the exit codes
- ``run_command``       ``swarmd run``: the flags over the config (and at each reload), the node and its signals
- ``run_create``        ``swarmd run create``: a spec's local files pinned by digest, then signed
- ``status_view``       the text of ``swarmd status`` and ``swarmd peers`` from a daemon's answer
- ``status_watch``      ``swarmd status --watch``: that view refreshed in place (rich)
- ``demo``              ``swarmd demo``: a local swarm on 127.0.0.1 that trains the default run
- ``export``            ``swarmd export``: a run's stage weights as a ``from_pretrained`` folder
- ``token_command``     ``swarmd run token``: a private run's creator admits a peer; the joiner's check
- ``plan_command``      ``swarmd plan``: a scenario file in, a plan out
- ``simulate_command``  ``swarmd simulate``: a scenario played out over hours, strategy against strategy
- ``progress``          a long command's progress on stderr, with an estimate of the time left
- ``doctor``            ``swarmd doctor``: can this machine join its run, each check with its fix
- ``parser_docs``       shell completion and the man page, generated from the parser
- ``config_command``    ``swarmd config``: show, get, set a key (comments kept), reload the daemon's config
- ``tokenizer_command`` ``swarmd tokenizer train``: a byte-level BPE ``tokenizer.json`` from text files
- ``data_command``      ``swarmd data prepare``: text files into token shards, a held-out split and a manifest

Commands import what they need when they run, so ``swarmd --help`` stays quick.
"""
