"""Which backends work here, each probed in a process of its own: a report, never a memory."""
