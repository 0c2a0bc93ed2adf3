"""The checker framework on a tiny puzzle defined here: verdicts, messages, strictness, budgets, hints.

The puzzle: every rank holds a vector; return the sum over ranks, sending no more than a ring
all-reduce would. Cases vary world size, length and values, so a memorised answer cannot pass.
"""

from __future__ import annotations

import random

import pytest
import torch

import lib.checker.puzzle
import lib.sim
from lib.checker.puzzle import FAILING, Budget, Case, CheckFailed, Floor, NotSolved, Puzzle
from lib.checker.compare import first_difference
from lib.sim import per_rank
from lib.units import fmt_bytes

RING = "2(N-1)/N × the vector's bytes, what a ring all-reduce sends"


def _sum_case(rng: random.Random, n: int, allowed=None) -> Case:
    length = n * rng.randint(1, 4)
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    xs = [torch.randn(length, generator=g) for _ in range(n)]
    nbytes = length * 4
    return Case(world_size=n, args=(per_rank(xs),), expected=[sum(xs)] * n, label=f"N={n}, length {length}",
                budgets=[Budget("bytes_sent", 2 * (n - 1) / n * nbytes, RING, hint="reduce-scatter, then all-gather")],
                allowed_ops=allowed)


def make_puzzle(**kwargs) -> Puzzle:
    return Puzzle("sum_vectors", "00_test", _sum_case, world_sizes=(2, 3, 4),
                  hints=["Every rank needs everyone's vector.", "dist.all_reduce sums in place.",
                         "dist.all_reduce(x); return x"], **kwargs)


def make_p2p_puzzle() -> Puzzle:
    return Puzzle("sum_vectors_p2p", "00_test",
                  lambda rng, n: _sum_case(rng, n, allowed=frozenset({"send", "recv"})), world_sizes=(2, 3))


# ---- learner functions ---------------------------------------------------------------------------

def correct(dist, x):
    dist.all_reduce(x)
    return x


def forgets_to_communicate(dist, x):
    return x


def stub(dist, x):
    raise NotImplementedError


def gathers_everything(dist, x):
    """Right answer, but each rank receives every vector whole: (N-1)/N·N× the bytes, over budget at N ≥ 3."""
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x)
    return sum(parts)


def ring_from_p2p(dist, x):
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = x.chunk(n)
    buf = torch.empty_like(chunks[0])
    for step in range(n - 1):
        work = dist.isend(chunks[(rank - step) % n], (rank + 1) % n)
        dist.recv(buf, (rank - 1) % n)
        work.wait()
        chunks[(rank - step - 1) % n].add_(buf)
    for step in range(n - 1):
        work = dist.isend(chunks[(rank + 1 - step) % n], (rank + 1) % n)
        dist.recv(chunks[(rank - step) % n], (rank - 1) % n)
        work.wait()
    return x


def deadlocks(dist, x):
    dist.send(x, (dist.get_rank() + 1) % dist.get_world_size())
    return x


@pytest.fixture(autouse=True)
def not_strict(monkeypatch):
    monkeypatch.delenv("COURSE_STRICT", raising=False)


# ---- verdicts and messages -----------------------------------------------------------------------

def test_correct_function_passes(capsys):
    puzzle = make_puzzle()
    assert puzzle.check(correct) is True
    out = capsys.readouterr().out
    assert out.startswith("✓")
    assert "sum_vectors" in out and "3 cases" in out
    assert "budget" in out and RING in out


def test_wrong_function_fails_and_says_where(capsys):
    puzzle = make_puzzle()
    assert puzzle.check(forgets_to_communicate, seed=0) is False
    out = capsys.readouterr().out
    assert out.startswith("✗")
    case = puzzle.cases(seed=0)[0]
    xs = case.args[0].values
    want, got = case.expected[0], xs[0]
    i = int((~torch.isclose(got, want, rtol=1e-5, atol=1e-6)).nonzero()[0])
    assert "rank 0" in out
    assert f"index ({i},)" in out
    assert f"expected {want[i].item():.6g}" in out and f"got {got[i].item():.6g}" in out
    assert case.label in out
    assert "Hint: Every rank needs everyone's vector." in out


def test_strict_raises_check_failed(capsys):
    with pytest.raises(CheckFailed, match="rank 0"):
        make_puzzle().check(forgets_to_communicate, strict=True)
    assert make_puzzle().check(correct, strict=True) is True


def test_stub_is_not_solved_yet(capsys):
    puzzle = make_puzzle()
    assert puzzle.check(stub) is False
    out = capsys.readouterr().out
    assert "not solved yet" in out
    assert "✗" not in out and "Traceback" not in out
    with pytest.raises(NotSolved):
        puzzle.check(stub, strict=True)


def test_course_strict_environment_makes_check_strict(monkeypatch, capsys):
    monkeypatch.setenv("COURSE_STRICT", "1")
    with pytest.raises(CheckFailed):
        make_puzzle().check(forgets_to_communicate)
    with pytest.raises(NotSolved):
        make_puzzle().check(stub)
    assert make_puzzle().check(forgets_to_communicate, strict=False) is False
    monkeypatch.setenv("COURSE_STRICT", "0")
    assert make_puzzle().check(forgets_to_communicate) is False


def test_a_learner_error_is_reported_not_raised(capsys):
    assert make_puzzle().check(deadlocks) is False
    out = capsys.readouterr().out
    assert "Deadlock" in out and "rank 0" in out


def test_budget_names_metric_value_limit_and_formula(capsys):
    puzzle = make_puzzle()
    assert puzzle.check(gathers_everything, seed=0) is False
    out = capsys.readouterr().out
    case = puzzle.cases(seed=0)[1]                     # N=3: the first case over budget
    assert case.world_size == 3
    nbytes = case.args[0].values[0].numel() * 4
    value, limit = 2 * nbytes, 2 * (3 - 1) / 3 * nbytes    # all_gather sends (N-1)/N of N vectors
    assert "the answer is right" in out
    assert "sent" in out
    assert fmt_bytes(value) in out and fmt_bytes(limit) in out
    assert RING in out
    assert "Hint: reduce-scatter, then all-gather" in out


def test_allowed_ops_reject_a_collective_where_p2p_is_asked(capsys):
    puzzle = make_p2p_puzzle()
    assert puzzle.check(correct) is False
    out = capsys.readouterr().out
    assert "all_reduce" in out and "recv, send only" in out
    assert puzzle.check(ring_from_p2p) is True


def test_a_floor_rejects_a_measurement_below_it(capsys):
    """Floor: what a ring all-reduce sends is also the least it sends; a floor above it fails."""
    def with_floor(factor):
        def make(rng, n):
            case = _sum_case(rng, n)
            case.budgets.append(Floor("bytes_sent", factor * case.budgets[0].limit, "what the ring needs"))
            return case
        return make
    assert Puzzle("sum_floor", "00_test", with_floor(1), world_sizes=(2, 3)).check(ring_from_p2p, seed=0) is True
    assert "floor (what the ring needs)" in capsys.readouterr().out
    assert Puzzle("sum_floor", "00_test", with_floor(2), world_sizes=(2, 3)).check(ring_from_p2p, seed=0) is False
    assert "under the floor of" in capsys.readouterr().out
    assert Floor("flops", 10, "").broken(9, 10) and not Floor("flops", 10, "").broken(10, 10)


def test_a_contract_names_what_the_run_did_instead(capsys):
    def only_p2p(result):
        used = sorted({e.op for e in result.trace if e.lane == "comm"} - {"send", "recv"})
        return f"rank 0 used {used[0]}" if used else None

    def contracted(rng, n):
        case = _sum_case(rng, n)
        case.contracts.append(lib.checker.puzzle.Contract("a ring is made of messages", only_p2p,
                                                          hint="use send and recv"))
        return case
    puzzle = Puzzle("sum_contract", "00_test", contracted, world_sizes=(2, 3))
    assert puzzle.check(correct, seed=0) is False
    out = capsys.readouterr().out
    assert "the answer is right, but rank 0 used all_reduce: a ring is made of messages." in out
    assert "Hint: use send and recv" in out
    assert puzzle.check(ring_from_p2p, seed=0) is True


def test_arguments_the_statement_refuses_must_raise_what_it_asks(capsys):
    def refused_first(rng, n, odd=False):
        case = _sum_case(rng, n)
        if odd:
            return Case(n, (per_rank([torch.ones(3)] * n),), [None] * n, f"N={n}, length 3 (not a multiple of N)",
                        raises=ValueError)
        return case

    def careful(dist, x):
        if x.numel() % dist.get_world_size():
            raise ValueError("the length must be a multiple of N")
        return correct(dist, x)

    puzzle = Puzzle("sum_refuses", "00_test", refused_first, world_sizes=(2, 2, 3), variants=[{"odd": True}])
    assert puzzle.check(careful, seed=0) is True
    capsys.readouterr()
    assert puzzle.check(correct, seed=0) is False
    assert "the statement asks for a ValueError on these arguments" in capsys.readouterr().out

    def wrong_error(dist, x):
        raise TypeError("no")
    assert puzzle.check(wrong_error, seed=0) is False
    assert "TypeError" in capsys.readouterr().out


def test_hints_come_in_tiers(capsys):
    puzzle = make_puzzle()
    shown = [puzzle.hint() for _ in range(4)]
    assert shown[:3] == ["Hint 1 of 3: Every rank needs everyone's vector.",
                         "Hint 2 of 3: dist.all_reduce sums in place.",
                         "Hint 3 of 3: dist.all_reduce(x); return x"]
    assert shown[3] == shown[2]                      # the last tier stays once reached
    assert capsys.readouterr().out.splitlines()[0] == shown[0]
    assert Puzzle("p", "nb", _sum_case).hint() == "No hints for this one."


def test_hint_after_a_failed_check_gives_the_next_one(capsys):
    puzzle = make_puzzle()
    assert puzzle.check(forgets_to_communicate, seed=0) is False
    out = capsys.readouterr().out
    assert "Hint: Every rank needs everyone's vector.  (P.sum_vectors.hint() gives the next, 2 of 3)" in out
    assert puzzle.hint() == "Hint 2 of 3: dist.all_reduce sums in place."
    puzzle.check(forgets_to_communicate, seed=0)        # a failure repeats the furthest hint seen, no further
    assert ("Hint: dist.all_reduce sums in place.  (P.sum_vectors.hint() gives the next, 3 of 3)"
            in capsys.readouterr().out)
    assert puzzle.hint() == "Hint 3 of 3: dist.all_reduce(x); return x"
    puzzle.check(forgets_to_communicate, seed=0)
    assert capsys.readouterr().out.rstrip().endswith("Hint: dist.all_reduce(x); return x")


def first_rank_receives_from_rank_minus_one(dist, x):
    if dist.get_rank() < dist.get_world_size() - 1:
        dist.send(x, dist.get_rank() + 1)
    dist.recv(x, dist.get_rank() - 1)
    return x


def test_a_peer_out_of_range_gets_a_hint_that_fits_rings_and_pipelines(capsys):
    """Wrapping around with % world_size would deadlock a pipeline: the simulator's hint assumes no topology, and
    it is the message's one hint (the most specific to what happened)."""
    assert make_puzzle().check(first_rank_receives_from_rank_minus_one, seed=0) is False
    out = capsys.readouterr().out
    assert "peer -1: ranks go from 0 to" in out and "% world_size" not in out
    assert [ln for ln in out.splitlines() if ln.startswith("Hint: ")] == [
        "Hint: work out the peer of the first and of the last rank by hand: each has a neighbour on one side only, "
        "unless your algorithm wraps around."]


def test_a_hard_coded_answer_fails():
    puzzle = make_puzzle()
    cases = puzzle.cases()
    first = cases[0]
    answer = first.expected[0]

    def memorised(dist, x):
        return answer.clone()
    assert puzzle.evaluate(correct).ok
    assert not puzzle.evaluate(memorised).ok                  # a fresh seed: cases it has never seen
    outcome = puzzle.evaluate(memorised, seed=0)             # even replaying seed 0, a later case catches it
    assert outcome.status == FAILING and not outcome.ok
    assert outcome.case is not first and outcome.case.label != first.label
    # the cases really differ: world sizes, lengths and values
    assert len({c.world_size for c in cases}) == 3
    assert len({c.label for c in cases}) == 3
    assert [c.label for c in puzzle.cases(seed=0)] == [c.label for c in cases]
    other = puzzle.cases(seed=1)
    assert any(a.label != b.label or not torch.equal(a.expected[0], b.expected[0]) for a, b in zip(cases, other))


def test_real_check_on_gloo(capsys):
    puzzle = make_puzzle()
    assert puzzle.real(correct, world_size=2) is True
    assert "✓ real run on 2 processes" in capsys.readouterr().out
    assert puzzle.real(forgets_to_communicate, world_size=2) is False
    out = capsys.readouterr().out
    assert out.startswith("✗ real run") and "rank 0" in out
    # a rank sees only its own result; the simulated check of the same answer sees them all and names the mistake
    assert "The simulated check of the same answer says" in out and "nothing was added to it" in out


def right_only_in_simulation(dist, x):
    if dist is not torch.distributed:
        dist.all_reduce(x)
    return x


def test_a_real_run_wrong_where_the_simulation_is_right_says_so(capsys):
    assert make_puzzle().real(right_only_in_simulation, world_size=2) is False
    out = capsys.readouterr().out
    assert out.startswith("✗ real run") and "The simulated check passes this answer" in out


def test_not_a_function():
    outcome = make_puzzle().evaluate(42)
    assert not outcome.ok and "should be a function" in outcome.message


# ---- first_difference ----------------------------------------------------------------------------

def test_first_difference_equal_and_within_tolerance():
    t = torch.tensor([1.0, 2.0, float("nan")])
    assert first_difference(t, t.clone()) is None
    assert first_difference([t, {"a": 1, "b": (2.0, "x")}], [t.clone(), {"a": 1, "b": (2.0 + 1e-9, "x")}]) is None
    assert first_difference(torch.tensor([1.0]), torch.tensor([1.0 + 1e-7])) is None
    assert first_difference(torch.tensor([1.0]), torch.tensor([1.1]), rtol=0.2) is None
    assert first_difference(3.0, torch.tensor(3.0)) is None


def test_first_difference_nested():
    expected = [torch.zeros(2), {"w": torch.zeros(2, 3), "n": 4}]
    got = [torch.zeros(2), {"w": torch.zeros(2, 3), "n": 4}]
    got[1]["w"][1, 2] = 0.5
    assert first_difference(expected, got) == (
        "result[1]['w'] at index (1, 2): expected 0, got 0.5 (1 of 6 values differ)")
    got[1]["w"][1, 2] = 0
    got[1]["n"] = 5
    assert first_difference(expected, got, where="the result") == "the result[1]['n']: expected 4, got int 5"


def test_first_difference_structure():
    assert first_difference([1, 2], [1, 2, 3]) == "result should hold 2 items, got 3"
    assert "should be a list of 2 items" in first_difference([1, 2], torch.zeros(2))
    assert first_difference({"a": 1, "b": 2}, {"a": 1, "c": 2}) == "result keys differ: missing ['b'], unexpected ['c']"
    assert "should be a dict" in first_difference({"a": 1}, [1])
    assert "forget to return" in first_difference(torch.zeros(2), None)
    assert "forget to return" in first_difference(1.0, None)
    assert first_difference("ok", "ko") == "result: expected 'ok', got 'ko'"


def test_first_difference_shape_and_dtype():
    assert first_difference(torch.zeros(2, 3), torch.zeros(3, 2)) == "result has shape (3, 2), expected (2, 3)"
    assert first_difference(torch.zeros(2), torch.zeros(2, dtype=torch.float64)) == (
        "result has dtype float64, expected float32")
    assert first_difference(torch.tensor([1, 2]), torch.tensor([1, 3])) == (
        "result at index (1,): expected 2, got 3 (1 of 2 values differ)")
    assert first_difference(torch.tensor(1.0), torch.tensor(2.0)) == "result: expected 1, got 2 (1 of 1 values differ)"


def test_first_difference_modules():
    torch.manual_seed(0)
    a = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU(), torch.nn.Linear(2, 1))
    b = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU(), torch.nn.Linear(2, 1))
    b.load_state_dict(a.state_dict())
    assert first_difference(a, b) is None
    with torch.no_grad():
        b[2].bias += 1
    diff = first_difference(a, b)
    assert diff.startswith("result['2.bias'] at index (0,): expected")
    assert "should be the model" in first_difference(a, {"0.weight": a[0].weight})
    c = torch.nn.Linear(3, 2)
    assert first_difference(a, c).startswith("result keys differ")


def test_strict_default_reads_the_environment(monkeypatch):
    assert lib.checker.puzzle.strict_default() is False
    for value, strict in (("1", True), ("yes", True), ("0", False), ("", False)):
        monkeypatch.setenv("COURSE_STRICT", value)
        assert lib.checker.puzzle.strict_default() is strict


def test_the_reference_solution_is_shown_only_on_explicit_request(capsys):
    from puzzles import data_parallel
    import solutions.data_parallel as S
    puzzle = data_parallel.ring_all_reduce
    assert puzzle.solution() is None
    assert "solution(confirm=True)" in capsys.readouterr().out
    source = puzzle.solution(confirm=True)
    assert source.startswith("def ring_all_reduce(dist, x):") and "ring_all_gather" in source
    assert source in capsys.readouterr().out
    assert S.ring_all_reduce.__name__ == "ring_all_reduce"


def test_numpy_numbers_compare_as_numbers():
    import numpy as np

    assert first_difference(15168, np.int64(15168)) is None
    assert first_difference(0.25, np.float32(0.25)) is None
    assert "expected 3, got int 4" in first_difference(3, np.int64(4))


# ---- the answer key is out of reach ----------------------------------------------------------------------

def test_every_check_draws_fresh_cases_and_a_failure_says_how_to_replay_it():
    puzzle = make_puzzle()
    first, second = puzzle.evaluate(forgets_to_communicate), puzzle.evaluate(forgets_to_communicate)
    seeds = [int(o.message.split("seed=")[1].split(")")[0]) for o in (first, second)]
    assert seeds[0] != seeds[1]
    assert f"P.sum_vectors.check(forgets_to_communicate, seed={seeds[0]}) replays them" in first.message
    assert puzzle.evaluate(forgets_to_communicate, seed=seeds[0]).message == first.message


def rebuilds_the_case(dist, x):
    """Finds the expected answer by building the check's case again with the seed it guesses."""
    return make_puzzle().cases(seed=0)[0].expected[dist.get_rank()]


def reads_the_originals(dist, x):
    """Walks up its own stack to the runtime's frame, whose arguments hold every rank's input."""
    import sys
    frame = sys._getframe()
    while "args" not in frame.f_locals or not frame.f_locals["args"]:
        frame = frame.f_back
    return sum(v.clone() for v in frame.f_locals["args"][0].values)


def reads_the_originals_through_a_traceback(dist, x):
    """The same walk from a caught exception's frame: refused by the audit hook at tb_frame, which no patch can
    guard (were it reached, the originals are the run's own tensors, which no rank may read)."""
    try:
        raise LookupError
    except LookupError as e:
        frame = e.__traceback__.tb_frame
    while "args" not in frame.f_locals or not frame.f_locals["args"]:
        frame = frame.f_back
    return sum(v.clone() for v in frame.f_locals["args"][0].values)


def peeks_at_other_threads(dist, x):
    import sys
    for frame in sys._current_frames().values():
        if "case" in frame.f_locals:
            return frame.f_locals["case"].expected[dist.get_rank()]
    return x


@pytest.mark.parametrize("cheat, words", [
    (rebuilds_the_case, "a check's case was being built inside the function under check"),
    (reads_the_originals, "sys._getframe"),
    (reads_the_originals_through_a_traceback, "tb_frame (the frame of a traceback)"),
    (peeks_at_other_threads, "sys._current_frames"),
])
def test_the_answer_key_cannot_be_reached_from_inside(cheat, words):
    outcome = make_puzzle().evaluate(cheat)
    assert not outcome.ok and words in outcome.message, outcome.message


def test_a_real_rank_cannot_build_the_case_while_the_learners_function_runs():
    import lib.checker.case as check
    check._learner_running = True
    try:
        with pytest.raises(lib.sim.OutOfView):
            make_puzzle().cases(seed=0)
    finally:
        check._learner_running = False


def test_a_check_and_a_run_leave_the_callers_thread_count_as_it_was():
    """Checks run torch single-threaded (tiny tensors); the caller's setting is its own."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert make_puzzle().check(correct, show=False) is True
        assert torch.get_num_threads() == 2
        lib.sim.run(correct, 3, per_rank([torch.ones(3)] * 3))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_rebuilding_a_case_is_named_before_the_builder_meets_a_refused_kernel():
    """The builder's own reference may use a kernel the learner is refused: the guard at its first line names the
    rebuilt case, not the kernel the learner never called."""
    def squares_case(rng, n):
        x = torch.randn(4, 4, generator=torch.Generator().manual_seed(rng.randrange(2**31)), dtype=torch.float64)
        return Case(n, (per_rank([x] * n),), [x @ x] * n, f"N={n}")

    puzzle = Puzzle("square", "00_test", squares_case, world_sizes=(2,), refuse=(("mm",), "no matmul"))
    cheat = lambda dist, x: puzzle.make_case(random.Random(0), 2).expected[0]       # noqa: E731
    outcome = puzzle.evaluate(cheat)
    assert not outcome.ok and "a check's case was being built" in outcome.message, outcome.message
    assert puzzle.evaluate(lambda dist, x: x @ x).message.count("no matmul") == 1


def _plus_one_case(rng: random.Random, n: int) -> Case:
    x = torch.arange(3.0)
    return Case(n, (x,), [{"twice": 2 * (x + 1)}] * n, f"N={n}")


def test_a_harness_runs_the_answer_as_given_and_the_check_judges_what_it_returns():
    """harness(answer, dist, *args): the answer arrives untouched (no dist added), and what is compared is the
    harness's result, as notebook 06's group and plan puzzles use it."""
    puzzle = Puzzle("plus_one", "00_test", _plus_one_case, world_sizes=(2, 3),
                    harness=lambda answer, dist, x: {"twice": 2 * answer(x)})
    assert puzzle.check(lambda x: x + 1, seed=0, show=False) is True
    outcome = puzzle.evaluate(lambda x: x + 2, seed=0)
    assert outcome.status == FAILING and "result['twice']" in outcome.message


# ---- a spec that is wrong fails when it is written ---------------------------------------------------------
def test_a_misspelt_metric_fails_at_the_budget():
    from lib.checker.puzzle import SpecError
    with pytest.raises(SpecError, match="Budget\\(metric='peak_mem'\\): not a measurement .* peak_memory"):
        Budget("peak_mem", 10, "why")


def test_per_rank_limits_must_count_the_ranks():
    from lib.checker.puzzle import SpecError

    def case(rng, n):
        return Case(n, (), [None] * n, f"N={n}", budgets=[Budget("bytes_sent", [1.0] * (n + 1), "why")])
    with pytest.raises(SpecError, match="Budget\\('bytes_sent'\\) has 4 per-rank limits for world_size=3"):
        Puzzle("p", "00_test", case, world_sizes=(3,)).cases(0)


def test_variants_must_fit_the_world_sizes_and_the_builder():
    from lib.checker.puzzle import SpecError

    def case(rng, n, tied=False):
        return Case(n, (), [None] * n, f"N={n}")
    with pytest.raises(SpecError, match="3 variants for 2 world sizes"):
        Puzzle("p", "00_test", case, world_sizes=(2, 3), variants=[{}, {}, {"tied": True}])
    with pytest.raises(SpecError, match="sets \\['tide'\\], which case does not take"):
        Puzzle("p", "00_test", case, world_sizes=(2, 3), variants=[{"tide": True}])


def test_a_formula_must_be_a_lib_terms_formula():
    from lib.checker.puzzle import SpecError
    with pytest.raises(SpecError, match="build it with lib.checker.terms.formula"):
        Case(1, (), [3], "one", formulas={"": 3})


def test_a_case_reads_either_the_run_or_the_other_cases_not_both():
    """Each flag gives Case.explain its third argument: both set, one would be ignored without a word."""
    from lib.checker.puzzle import SpecError
    with pytest.raises(SpecError, match="explain_reads_run=True and reads_others=True"):
        Case(1, (), [3], "one", explain=lambda expected, got, third: None, explain_reads_run=True, reads_others=True)


def test_a_budget_missed_by_less_than_its_rounding_says_by_how_much():
    from lib.checker.budgets import over
    """504.33 KiB over a budget of 504.33 KiB reads as no excess: the message adds what rounding hid."""
    budget = Budget("bytes_sent", 516_432, "what the algorithm sends")
    text = over(budget, "rank 0", 516_436, 516_432)
    assert f"is {fmt_bytes(516_436)}, over the budget of {fmt_bytes(516_432)} by 4 B (what" in text, text
    assert " by " not in over(budget, "rank 0", 600_000, 516_432)


def test_a_long_failure_at_scale_keeps_its_first_lines_and_its_hints():
    from lib.checker.puzzle import _abridged
    text = "\n".join(["every rank is blocked:"] + [f"  rank {r} waits" for r in range(256)] + ["Hint: look."])
    short = _abridged(text).splitlines()
    assert short[:2] == ["every rank is blocked:", "  rank 0 waits"]
    assert short[20] == "  ... (234 more lines like these)" and short[-1] == "Hint: look."
    assert len(short) == 25 and _abridged("a\nb") == "a\nb"
