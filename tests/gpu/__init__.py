"""The GPU check of issue 28: ``check.sh`` sets up and runs ``check``, by hand, never under pytest.

- ``check``          the driver: data, runs, the three rows, the checks, the table (``--cpu``: the dry run)
- ``reference``      the single-process torch reference, run in its own process
- ``daemons``        the daemons' config, starting and stopping them, what their status shows
- ``device_checks``  swarmd's CUDA branches run for real: the GPU memory cap, NVML, doctor's dry run
- ``figures``        the pure arithmetic: FLOPs per token, MFU, the loss comparison, the table
"""
