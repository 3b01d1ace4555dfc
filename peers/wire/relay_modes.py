"""How a daemon sends its data-plane requests (``[swarm] data_via_relay``).

``auto`` (through a relay when the direct path is blocked or slower), ``always`` (through a
relay whenever the plan names one: outbound connections filtered) or ``never``. Apart from
``routing`` so that the command line and the config check a value without loading numpy."""

MODES = ("auto", "always", "never")
