"""Which backends work here: each probed in a process of its own, its verdict remembered."""
