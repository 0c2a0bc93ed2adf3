"""The check: a puzzle's cases run on simulated ranks, compared with one device's reference, judged by
the lesson's budgets and contracts."""
