"""What the owner allows this peer (``swarmd.node.limits``): [limits] applied, paused for, counted.

- ``live``         the [limits] in force, applied at start and on reload (share, threads, GPU memory)
- ``pausing``      the owner's pause and resume: the work handed back, taken again, a timed end
- ``auto_pause``   pausing by itself as [limits] says: time windows, battery, listed programs
- ``machine_use``  whether the owner uses the machine (input idle time), who else uses its GPU
- ``traffic``      the daily transfer cap: today's bytes kept across restarts, the reason to pause
"""
