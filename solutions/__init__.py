"""Reference solutions: one module per notebook, one function per puzzle, same names as the stubs."""
