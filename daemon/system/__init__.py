"""The daemon as a process on its machine (``swarmd.system``).

- ``systemd``      sd_notify and the watchdog interval, in the standard library only
- ``control``      the local control API: a Unix socket (mode 0600) in the state directory
- ``state_dir``    what a daemon keeps on disk, and the lock that makes it one daemon's
- ``children``     ties child processes' lives to the daemon's
- ``process_cpu``  the CPU time of the daemon and every process under it
- ``tasks``        asyncio tasks ended for sure (a cancel that was swallowed is sent again)
- ``log_format``   log lines as text, with journald's priorities under systemd, or JSON
- ``local_swarm``  daemons as subprocesses on this machine (``swarmd demo``, integration tests)
"""
