"""The acting side: the loop that observes, plans, executes and commits, and what serves it."""
