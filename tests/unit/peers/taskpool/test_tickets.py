"""peers/taskpool/tickets.py: the ledger keeper's signed share tickets, and what a server
checks of a contribution's tickets before it reads the tensor."""

from __future__ import annotations

import pytest

from swarmd.peers.records.identity import Identity
from swarmd.peers.taskpool.tickets import (
    TICKET_BYTES,
    TICKET_CHARS,
    TICKET_LIFE_S,
    LedgerKeepers,
    ShareTicket,
    TicketError,
    TicketVerifier,
    pack_tickets,
    public_key_of,
    unpack_tickets,
)

pytestmark = pytest.mark.timeout(60)

RUN = "swarm-7.abcdefghijklmnopqrstuvwx"
NOW = 1_800_000_000.0
KEEPER = Identity.generate()
MALLORY = Identity.generate()


def ticket(share_id: int, pipeline: int = 0, *, by: Identity = KEEPER, count: int = 4, now: float = NOW) -> ShareTicket:
    return ShareTicket.sign(by, RUN, share_id=share_id, first=share_id * count, count=count, pipeline=pipeline, now=now)


def check(tickets: list[ShareTicket], verifier: TicketVerifier | None = None, **changes: object) -> None:
    args: dict[str, object] = dict(
        share_ids=[t.share_id for t in tickets],
        micro_batches=sum(t.count for t in tickets),
        pipelines=[0],
        keepers=[KEEPER.peer_id],
        now=NOW + 60,
    )
    args.update(changes)
    (verifier or TicketVerifier()).check(RUN, tickets, **args)  # type: ignore[arg-type]


def test_a_ticket_round_trips_as_bytes_and_text_and_names_its_signer() -> None:
    t = ticket(7, pipeline=3)
    assert len(t.pack()) == TICKET_BYTES == 92 and len(t.text()) == TICKET_CHARS == 123
    assert ShareTicket.from_text(t.text()) == t == ShareTicket.unpack(t.pack())
    assert t.signed_by(RUN, KEEPER.peer_id) and not t.signed_by(RUN, MALLORY.peer_id)
    assert not t.signed_by("other-1.abcdefghijklmnopqrstuvwx", KEEPER.peer_id)  # another run's
    assert public_key_of(KEEPER.peer_id) == KEEPER.public_key and public_key_of("not-a-peer") is None
    assert unpack_tickets(pack_tickets([t.text(), ticket(8).text()]), 2) == [t, ticket(8)]
    with pytest.raises(TicketError):
        unpack_tickets(t.pack()[:-1], 1)
    with pytest.raises(TicketError):
        ShareTicket.from_text("!" * TICKET_CHARS)


def test_a_tampered_ticket_is_signed_by_nobody() -> None:
    t = ticket(7)
    for forged in (
        ShareTicket(7, t.first, t.count * 1024, t.pipeline, t.issued_at, t.signature),  # more micro-batches
        ShareTicket(7, t.first, t.count, 1, t.issued_at, t.signature),  # another pipeline
        ShareTicket(2**39, t.first, t.count, t.pipeline, t.issued_at, t.signature),  # a made-up share
    ):
        with pytest.raises(TicketError) as refused:
            check([forged], pipelines=[0, 1])
        assert refused.value.reason in ("ticket_signature", "micro_batches")


def test_a_contribution_is_taken_only_with_its_own_pipelines_tickets_from_a_keeper() -> None:
    verifier = TicketVerifier()
    check([ticket(1), ticket(2)], verifier)
    cases = {
        "ticket": dict(share_ids=[1, 3]),  # a share without its ticket
        "ticket_pipeline": dict(pipelines=[1]),  # another pipeline's shares (the squat)
        "micro_batches": dict(micro_batches=9),  # more than the shares hold (made-up work)
        "ticket_age": dict(now=NOW + TICKET_LIFE_S + 1),
        "ticket_signature": dict(keepers=[MALLORY.peer_id]),  # no keeper signed them
    }
    for reason, changes in cases.items():
        with pytest.raises(TicketError) as refused:
            check([ticket(1), ticket(2)], verifier, **changes)
        assert refused.value.reason == reason, (reason, refused.value)
    with pytest.raises(TicketError) as refused:
        check([ticket(1), ticket(2, by=MALLORY)], verifier)  # self-made ticket among good ones
    assert refused.value.reason == "ticket_signature"
    check([ticket(1, pipeline=4)], pipelines=[3, 4])  # a head's group, or a peer holding two cells


def test_verified_tickets_are_remembered_bounded_and_only_while_their_signer_is_trusted() -> None:
    verifier = TicketVerifier(capacity=2)
    old_keeper = Identity.generate()
    tickets = [ticket(1), ticket(2, by=old_keeper)]
    keepers = [KEEPER.peer_id, old_keeper.peer_id]
    check(tickets, verifier, keepers=keepers)
    made = verifier.verifications
    check(tickets, verifier, keepers=keepers)
    assert verifier.verifications == made  # from memory
    with pytest.raises(TicketError):
        check(tickets, verifier, keepers=[KEEPER.peer_id])  # the old keeper is no longer believed
    check([ticket(3), ticket(4), ticket(5)], verifier)
    assert len(verifier._verified) == 2


def test_ledger_keepers_are_remembered_for_a_while_then_forgotten() -> None:
    keepers = LedgerKeepers(memory_s=100.0, most=2)
    assert keepers.trusted(["a", None], 0.0) == ["a"]
    assert keepers.trusted(["b"], 50.0) == ["b", "a"]  # a failover: the old keeper's tickets still count
    assert keepers.trusted(["b"], 120.0) == ["b"]  # a was last seen 120 s ago
    assert keepers.trusted(["c", "d"], 130.0) == ["d", "c"]  # at most two
