"""Mallory, a hostile peer: a script run as a subprocess (it needs hivemind) that joins a real
run's DHT with a fresh key and attacks the daemons, printing what each step got back.

- ``mallory``: the command line; joins the DHT, optionally as a member (a valid heartbeat),
  runs one attack and prints one JSON line;
- ``placement``: where the cells and shards are now, read by Mallory from the DHT (the plan
  in force and the leases) right before each attack, so that it aims at the actual holders;
- ``forgery``: the bytes mallory sends, built without hivemind: tensor frames (NaN, infinite,
  huge, mis-sized, mis-typed), checkpoints, heartbeats, leases and plans signed by any key;
- ``wire_attacks``: every data-plane method, with bad tensors, absurd indices, replays and
  others' identities;
- ``share_attacks``: contributions for shares the ledger never issued to Mallory (made-up
  IDs, self-signed tickets, a squat of the next 1,023 IDs: issue 26);
- ``flood_attacks``: the DHT (leases, plans, claim floods) and the transport
  (oversized frames, slow-loris streams, large requests);
- ``harness``: what the test and the benchmark share, without hivemind: a training swarm's
  description for Mallory, Mallory run as a subprocess, and the checks that the daemons held;
- ``silent_daemon``: a real daemon, patched in its own process to claim a device's speed and,
  silent, never take work (the silent member; ``tests/integration/test_silent_member.py``).
"""
