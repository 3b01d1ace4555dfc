"""The dashboard and Prometheus metrics (``swarmd.web``): opt-in, on a loopback address only.

- ``server``          a small HTTP/1.1 server on the node's loop: the page, ``/metrics``, the JSON API
- ``metrics``         a Prometheus collector that maps the status answer onto ``swarmd_*`` families
- ``history``         the curves' samples: a bounded ring, taken every few seconds

The page itself is ``dashboard.html`` and ``dashboard.js``: no build step, nothing from the network.
"""
