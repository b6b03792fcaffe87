"""The one charge path (:func:`dpinfer.accounting.charge.charge`): reserve on every unit or none, settle on every
unit or cancel all, commit when the block ends, cancel when it raises; a caller's reservation passed on."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpinfer.accounting import Zcdp
from dpinfer.accounting.charge import Reservation, charge, open_reservation
from dpinfer.accounting.costs import Cost
from dpinfer.accounting.ledger import Ledger
from dpinfer.errors import BudgetExceededError, LedgerError

SMALL, LARGE = Cost.of(Zcdp(0.01)), Cost.of(Zcdp(0.5))  # LARGE: ε ≈ 5.3, fits 10 and not 1


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    book = Ledger.init(tmp_path / "b.db", epsilon=10.0)
    book.set_budget("tight", 1.0)
    return book


def _states(book: Ledger, unit: str) -> list[str]:
    return [c.state for c in book.history(unit)]


def test_several_units_are_charged_in_addition_and_committed_when_the_block_ends(ledger: Ledger) -> None:
    with charge(ledger, ["doc", "store", "doc"], SMALL, scope="document", mechanism="test") as res:
        assert res is not None and res.units == ("doc", "store") and len(res.charges) == 2  # a unit named twice: once
        assert _states(ledger, "doc") == _states(ledger, "store") == ["pending"]
    assert _states(ledger, "doc") == _states(ledger, "store") == ["committed"]
    assert ledger.status("doc").spent == ledger.status("store").spent > 0  # each unit pays the full cost


def test_a_unit_that_refuses_cancels_every_reservation(ledger: Ledger) -> None:
    with pytest.raises(BudgetExceededError), charge(ledger, ["doc", "tight"], LARGE, scope="document",
                                                     mechanism="test"):
        pytest.fail("the block must not run")  # pragma: no cover
    assert _states(ledger, "doc") == ["cancelled"] and _states(ledger, "tight") == []


def test_a_settle_that_does_not_fit_cancels_every_unit(ledger: Ledger) -> None:
    with pytest.raises(BudgetExceededError), charge(ledger, ["doc", "tight"], SMALL, scope="document",
                                                     mechanism="test") as res:
        assert res is not None
        res.settle(LARGE, mechanism="test")
    assert _states(ledger, "doc") == _states(ledger, "tight") == ["cancelled"]


def test_the_block_raising_cancels_and_an_explicit_cancel_is_kept(ledger: Ledger) -> None:
    with pytest.raises(RuntimeError), charge(ledger, "doc", SMALL, scope="document", mechanism="test"):
        raise RuntimeError("the model failed")
    with charge(ledger, "doc", SMALL, scope="document", mechanism="test") as probe:
        assert probe is not None
        probe.cancel()  # a probe: reserved, then cancelled; the block's commit leaves it cancelled
    assert _states(ledger, "doc") == ["cancelled", "cancelled"] and ledger.status("doc").spent == 0


def test_a_reservation_opened_by_the_caller_is_passed_on_and_settled_once(ledger: Ledger) -> None:
    outer = open_reservation(ledger, "doc", scope="document")
    assert isinstance(outer, Reservation) and outer.charge is None  # nothing reserved yet
    outer.reserve(SMALL, mechanism="test")  # the command line, before the model loads
    with charge(outer, None, scope="document") as inner:  # the pipeline
        assert inner is outer
        inner.settle(Cost.of(Zcdp(0.02)), mechanism="test")
    assert _states(ledger, "doc") == ["committed"] and len(ledger.history("doc")) == 1


def test_no_ledger_charges_nothing_and_a_unit_without_a_ledger_is_refused(ledger: Ledger) -> None:
    with charge(None, None, SMALL, scope="document", mechanism="test") as res:
        assert res is None
    with pytest.raises(LedgerError, match="without a ledger"), charge(None, "doc", scope="document"):
        pass  # pragma: no cover
    with pytest.raises(LedgerError, match="needs unit="), charge(ledger, None, scope="corpus", what="synthesize"):
        pass  # pragma: no cover
    assert ledger.units() == [] or all(u.unit == "tight" for u in ledger.units())  # nothing charged anywhere


def test_a_release_that_may_have_left_is_committed_even_when_the_block_raises(ledger: Ledger) -> None:
    with pytest.raises(ConnectionError), charge(ledger, ["doc", "store"], SMALL, scope="document",
                                                 mechanism="test") as res:
        assert res is not None
        res.releasing()  # a stream's first token left
        raise ConnectionError("the client hung up")
    assert _states(ledger, "doc") == _states(ledger, "store") == ["committed"]


def test_reserve_alone_names_the_refusing_unit_and_a_later_block_ends_the_reservation(ledger: Ledger) -> None:
    """Step 1 alone (a stream, a background job): every unit or none, the refusing unit named; a later block around
    the release commits it, and a release marked as leaving is committed even when the block raises."""
    from dpinfer.accounting.charge import reserve

    res = Reservation(ledger, ["doc", "tight"], "document")
    with pytest.raises(BudgetExceededError):
        reserve(res, None, LARGE, scope="document", mechanism="test")
    assert res.refused == "tight" and not res.pending and _states(ledger, "doc") == ["cancelled"]
    held = reserve(ledger, ["doc", "store"], SMALL, scope="document", mechanism="test")
    assert held is not None and held.pending and held.refused is None
    with pytest.raises(RuntimeError), charge(held, None, scope="document"):
        held.releasing()  # a piece has left
        raise RuntimeError("the client hung up")
    assert _states(ledger, "doc")[-1] == _states(ledger, "store")[-1] == "committed" and not held.pending
    assert reserve(None, None, SMALL, scope="document") is None  # no ledger: nothing charged


def test_one_resume_key_per_unit_takes_over_a_killed_run_and_commit_left_spends_it(ledger: Ledger) -> None:
    keys = [ledger.resume_key("job-1", "doc"), ledger.resume_key("job-1", "store")]
    first = Reservation(ledger, ["doc", "store"], "corpus", resume_key=keys)
    first.settle(SMALL, mechanism="test")  # the run is killed here: both pending
    again = Reservation(ledger, ["doc", "store"], "corpus", resume_key=keys)
    again.settle(SMALL, mechanism="test")  # the resumed run takes both over instead of reserving twice
    assert [c.id for c in again.charges] == [c.id for c in first.charges]
    from dpinfer.accounting.charge import commit_left

    commit_left(ledger, keys)  # its release was already out: spent
    assert _states(ledger, "doc") == _states(ledger, "store") == ["committed"]
    with pytest.raises(LedgerError):
        Reservation(ledger, ["doc", "store"], "corpus", resume_key=keys[:1])  # one key, or one per unit


def test_record_charges_priced_elsewhere_take_the_pricing_of_another_process(ledger: Ledger) -> None:
    """A Ray corpus job: the driver's placeholders are reserved ``settle_first`` under each record's resume key; a
    worker prices one record by reserving under the same key (taking the placeholder over, twice for a retried
    task); at commit the priced one keeps its exact cost, the unpriced one is charged the bound."""
    from dpinfer.accounting.charge import RecordCharges

    jobs = RecordCharges(ledger, job="/out.jsonl", scope="document", mechanism="test", unit_of=lambda key: f"u{key}",
                         bound_of=lambda key: LARGE, priced_elsewhere=True)
    priced, unpriced = jobs.open("1"), jobs.open("2")
    assert [ledger.charge(r.charge.id).phase for r in (priced, unpriced)] == ["reserved", "reserved"]
    for _ in range(2):  # the worker, and Ray's retry of its task
        Ledger(ledger.location).reserve("u1", SMALL, mechanism="test", scope="document",
                                        resume_key=ledger.resume_key("/out.jsonl", "1"))
    jobs.close(priced, released=True)
    jobs.close(unpriced, released=True)
    (one,), (two,) = ledger.history("u1"), ledger.history("u2")
    assert (one.state, one.phase, two.state) == ("committed", "releasing", "committed")
    assert one.epsilon == pytest.approx(ledger.reserve("x", SMALL, mechanism="test").epsilon)  # its exact cost, once
    assert two.epsilon == pytest.approx(ledger.reserve("y", LARGE, mechanism="test").epsilon)  # the bound
