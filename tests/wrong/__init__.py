"""Catalogues of wrong answers, one module per notebook (see tests/test_content.py)."""
