"""Summaries kept for reuse behind one SummaryStore protocol: in memory, in SQLite, in Redis; flights and health."""
