"""The pure decisions: from desired state, statuses and what providers report, what to do now. No I/O."""
