"""The check: a puzzle's cases run on simulated ranks, compared with one device's reference, judged by
the lesson's budgets and contracts. Its stages, in order, each in a module of its own: run (run.py), compare
(compare.py), diagnose (lib.diagnose), contracts (contract.py), budgets (budgets.py), verdict (verdict.py);
Puzzle (puzzle.py) runs them, on the cases of case.py."""
